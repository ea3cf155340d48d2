/**
 * A sandbox reached over the HTTP API, with the in-process SDK's shape:
 * `Sandbox.create` / `connect` / `list` / `kill`, and `sandbox.commands`,
 * `sandbox.files`, `sandbox.effects`, `sandbox.verdicts`, `checkpoint`,
 * `rollback`, `fork`. Methods that are synchronous in-process (the ledger)
 * return promises here; everything else has the same names, options and
 * results, so code moves between the two by changing where the sandbox
 * comes from.
 */
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type { SandboxInfo } from '../api/sandbox.js';
import type { ObservedRunResult } from '../api/sandbox-commands.js';
import type { CreateOptions } from '../lifecycle/create.js';
import type { FileEntry, FilePage } from '../instances/files.js';
import type { OutputChunk, OutputOffsets } from '../instances/background-output.js';
import { RemotePty } from './pty.js';
import type { CheckpointInfo } from '../checkpoints/checkpoint.js';
import type { WireForkResults } from '../http/fork-results.js';
import { forkResultsFromWire, type RemoteForkResult } from './fork-results.js';
import type { RollbackReport } from '../checkpoints/rollback.js';
import type { RollbackAgentOptions } from '../agent-state/agent-state.js';
import type { EffectRecord, EffectSpec, BeginResult, Resolution } from '../effects/effect-ledger.js';
import type { JsonValue } from '../effects/idempotency.js';
import type { Observation } from '../provenance/observations.js';
import type { Verdict, StaleVerdict } from '../provenance/verdicts.js';
import type { ExposedPort, ExposureInfo } from '../network/exposed-ports.js';
import { CommandAbortedError, InvalidArgumentError } from '../errors.js';
import { errorFromWire, type WireError, ConnectionError, RequestAbortedError } from '../errors-from-wire.js';
import type { Answer, Body, Checked } from './wire.js';
import { Transport, WAIT_SLICE_MS, ndjsonEvents, type CallOptions, type ConnectionOptions } from './transport.js';

/** The most entries the server returns in one page (LIST_MAX_LIMIT in src/instances/files.ts). */
const LIST_MAX_LIMIT = 10_000;

/** A sandbox as the API shows it: the library's fields but the init's host pid, with the tenant's name and id. */
export type RemoteSandboxInfo = Omit<SandboxInfo, 'pid'> & { tenantId: string | null };

/** Sandbox.create's options: the library's, less the tenant (the token names it). */
export type RemoteCreateOptions = Omit<CreateOptions, 'tenant' | 'hostname'> & ConnectionOptions & CallOptions;

/** Options of commands.run. */
export interface RemoteRunOptions extends CallOptions {
  cwd?: string | undefined;
  envs?: Record<string, string> | undefined;
  timeoutMs?: number | undefined;
  toolCallId?: string | undefined;
  /** Called with each piece of output as the server streams it. */
  onStdout?: ((chunk: string) => void) | undefined;
  onStderr?: ((chunk: string) => void) | undefined;
  /** With background: keep the command's stdin open for sendStdin. */
  stdin?: boolean | undefined;
}

/** A rollback report as JSON: contexts of the "bytes" format carry base64 text. */
export type RemoteRollbackReport = Omit<RollbackReport, 'context' | 'contextWithRecovery' | 'recoverySummary'> & {
  /** The context stored with the checkpoint ({format, ...}; "bytes" data as base64), or null if none. */
  context: Record<string, unknown> | null;
  /** The context with the recovery note, unless withRecoverySummary was false. */
  contextWithRecovery?: Record<string, unknown> | null;
  /** What the abandoned attempt did, unless withRecoverySummary was false. */
  recoverySummary?: RollbackReport['recoverySummary'];
};

/** The signals commands.kill can send: the ones the server accepts. */
export type KillSignal = NonNullable<Body<'/v1/sandboxes/{id}/commands/{pid}/kill', 'post'>['signal']>;

const enc = encodeURIComponent;

/** A handle on a sandbox of the calling tenant, over HTTP. */
export class Sandbox {
  readonly commands: RemoteCommands;
  /** Interactive processes on terminals of the sandbox's own. */
  readonly pty: RemotePty;
  readonly files: RemoteFiles;
  readonly effects: RemoteEffects;
  readonly verdicts: RemoteVerdicts;
  /** Ports the sandbox listens on, exposed through the server at /ports/<id>/. */
  readonly ports: RemotePorts;

  private constructor(
    readonly id: string,
    /** @internal */ readonly transport: Transport,
  ) {
    this.commands = new RemoteCommands(this);
    this.pty = new RemotePty(this);
    this.files = new RemoteFiles(this);
    this.effects = new RemoteEffects(this);
    this.verdicts = new RemoteVerdicts(this);
    this.ports = new RemotePorts(this);
  }

  /** Creates and starts a sandbox (default image "base"). */
  static async create(opts: RemoteCreateOptions = {}): Promise<Sandbox> {
    const { apiUrl, apiKey, maxAttempts, retryDelayMs, requestTimeoutMs, signal, idempotencyKey, ...body } = opts;
    const t = new Transport({ apiUrl, apiKey, maxAttempts, retryDelayMs, requestTimeoutMs });
    const info = await t.json<Checked<RemoteSandboxInfo, Answer<'/v1/sandboxes', 'post', 201>>>({
      method: 'POST',
      path: '/sandboxes',
      body: { json: body satisfies Body<'/v1/sandboxes', 'post'> },
      signal,
      idempotencyKey,
    });
    return new Sandbox(info.id, t);
  }

  /** A handle on an existing sandbox; SANDBOX_NOT_FOUND (NotFoundError) if the tenant has none with that id. */
  static async connect(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<Sandbox> {
    const t = new Transport(opts);
    const info = await t.json<Checked<RemoteSandboxInfo, Answer<'/v1/sandboxes/{id}', 'get'>>>({
      method: 'GET',
      path: `/sandboxes/${sandboxPath(id)}`,
      signal: opts.signal,
    });
    return new Sandbox(info.id, t);
  }

  /** The tenant's sandboxes, oldest first; with `metadata`, only those whose labels include every given pair. */
  static async list(
    opts: ConnectionOptions & CallOptions & { metadata?: Record<string, string> | undefined } = {},
  ): Promise<RemoteSandboxInfo[]> {
    const t = new Transport(opts);
    // The server filters: ?metadata.KEY=VALUE for each label asked for.
    const query = Object.fromEntries(Object.entries(opts.metadata ?? {}).map(([k, v]) => [`metadata.${k}`, v]));
    return t.json<Checked<RemoteSandboxInfo, Answer<'/v1/sandboxes', 'get'>[number]>[]>({
      method: 'GET',
      path: '/sandboxes',
      query,
      signal: opts.signal,
    });
  }

  /** Removes a sandbox by id; false if the tenant had none with that id (already removed is not a failure). */
  static async kill(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<boolean> {
    return removeSandbox(new Transport(opts), id, opts.signal);
  }

  /** Removes this sandbox with its processes, files and checkpoints; false if it was already gone. */
  async kill(opts: CallOptions = {}): Promise<boolean> {
    return removeSandbox(this.transport, this.id, opts.signal);
  }

  async info(opts: CallOptions = {}): Promise<RemoteSandboxInfo> {
    return this.transport.json<Checked<RemoteSandboxInfo, Answer<'/v1/sandboxes/{id}', 'get'>>>({
      method: 'GET',
      path: this.path(''),
      signal: opts.signal,
    });
  }

  /** Takes an aligned checkpoint of files, processes, the agent's context and the ledger cursor. */
  async checkpoint(
    opts: { label?: string | undefined; context?: unknown; contextFormat?: string | undefined } & CallOptions = {},
  ): Promise<CheckpointInfo> {
    const { signal, idempotencyKey, ...body } = opts;
    return this.transport.json<Checked<CheckpointInfo, Answer<'/v1/sandboxes/{id}/checkpoints', 'post', 201>>>({
      method: 'POST',
      path: this.path('/checkpoints'),
      body: { json: wireContext(body) satisfies Body<'/v1/sandboxes/{id}/checkpoints', 'post'> },
      signal,
      idempotencyKey,
    });
  }

  /** This sandbox's checkpoints, oldest first. */
  async checkpoints(opts: CallOptions = {}): Promise<CheckpointInfo[]> {
    return this.transport.json<Checked<CheckpointInfo, Answer<'/v1/sandboxes/{id}/checkpoints', 'get'>[number]>[]>({
      method: 'GET',
      path: this.path('/checkpoints'),
      signal: opts.signal,
    });
  }

  /** The context stored with a checkpoint (null if none). */
  async context(checkpointId: string, opts: CallOptions = {}): Promise<unknown> {
    const r = await this.transport.json<
      Checked<
        { context: Record<string, unknown> | null },
        Answer<'/v1/sandboxes/{id}/checkpoints/{ckpt}/context', 'get'>
      >
    >({
      method: 'GET',
      path: this.path(`/checkpoints/${enc(checkpointId)}/context`),
      signal: opts.signal,
    });
    return r.context;
  }

  async deleteCheckpoint(checkpointId: string, opts: CallOptions = {}): Promise<void> {
    await this.transport.send({
      method: 'DELETE',
      path: this.path(`/checkpoints/${enc(checkpointId)}`),
      signal: opts.signal,
    });
  }

  /**
   * Restores files, processes and the agent's context to a checkpoint; the
   * report names what went stale and which effects could not be taken back.
   * The signal stops waiting for the answer; a rollback the server has begun
   * runs to its end (it is retried safely under the same Idempotency-Key).
   */
  async rollback(
    checkpointId: string,
    opts: Omit<RollbackAgentOptions, 'signal'> & CallOptions & { withRecoverySummary?: boolean | undefined } = {},
  ): Promise<RemoteRollbackReport> {
    const { signal, idempotencyKey, ...rest } = opts;
    return this.transport.json<Checked<RemoteRollbackReport, Answer<'/v1/sandboxes/{id}/rollback', 'post'>>>({
      method: 'POST',
      path: this.path('/rollback'),
      body: { json: { checkpointId, ...rest } satisfies Body<'/v1/sandboxes/{id}/rollback', 'post'> },
      signal,
      idempotencyKey,
    });
  }

  /** Starts independent sandboxes from a checkpoint; one result per fork, in order (a failed one carries its typed error). */
  async fork(
    checkpointId: string,
    opts: { count?: number | undefined } & CallOptions = {},
  ): Promise<RemoteForkResult[]> {
    const r = await this.transport.json<Checked<WireForkResults, Answer<'/v1/sandboxes/{id}/fork', 'post'>>>({
      method: 'POST',
      path: this.path('/fork'),
      body: {
        json: { checkpointId, ...(opts.count !== undefined ? { count: opts.count } : {}) } satisfies Body<
          '/v1/sandboxes/{id}/fork',
          'post'
        >,
      },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
    return forkResultsFromWire(r);
  }

  /** A handle on one of the forks this sandbox made (same connection). */
  async connectFork(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    const info = await this.transport.json<Checked<RemoteSandboxInfo, Answer<'/v1/sandboxes/{id}', 'get'>>>({
      method: 'GET',
      path: `/sandboxes/${sandboxPath(id)}`,
      signal: opts.signal,
    });
    return new Sandbox(info.id, this.transport);
  }

  /** Observations recorded in this sandbox (stale ones included on request). */
  async observations(opts: { includeStale?: boolean } & CallOptions = {}): Promise<Observation[]> {
    return this.transport.json<Checked<Observation, Answer<'/v1/sandboxes/{id}/observations', 'get'>[number]>[]>({
      method: 'GET',
      path: this.path('/observations'),
      query: { includeStale: opts.includeStale ? 'true' : undefined },
      signal: opts.signal,
    });
  }

  /** @internal */
  path(rest: string): string {
    return `/sandboxes/${sandboxPath(this.id)}${rest}`;
  }
}

function sandboxPath(id: string): string {
  if (typeof id !== 'string' || !/^sbx_[a-z0-9]+$/.test(id))
    throw new InvalidArgumentError('id', 'a sandbox id (sbx_…)', id);
  return id;
}

async function removeSandbox(t: Transport, id: string, signal?: AbortSignal): Promise<boolean> {
  try {
    await t.send({ method: 'DELETE', path: `/sandboxes/${sandboxPath(id)}`, signal });
    return true;
  } catch (e) {
    if ((e as { code?: string }).code === 'SANDBOX_NOT_FOUND') return false;
    throw e;
  }
}

/** A context in the SDK's form (bytes data as a Uint8Array) as the API takes it (base64). */
function wireContext(body: {
  label?: string | undefined;
  context?: unknown;
  contextFormat?: string | undefined;
}): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (body.label !== undefined) out.label = body.label;
  if (body.contextFormat !== undefined) out.contextFormat = body.contextFormat;
  if (body.context !== undefined) {
    const c = body.context as { format?: unknown; data?: unknown };
    out.context =
      c && c.format === 'bytes' && c.data instanceof Uint8Array
        ? { ...c, data: Buffer.from(c.data).toString('base64') }
        : body.context;
  }
  return out;
}

/** A background command: wait for it or signal it. */
export class RemoteCommandHandle {
  constructor(
    private readonly sandbox: Sandbox,
    /** pid inside the sandbox */
    readonly pid: number,
  ) {}

  /**
   * What it wrote since `from` (byte offsets; default the start), and where to
   * continue from; `rewound` after a rollback.
   */
  async output(
    from: OutputOffsets = { stdout: 0, stderr: 0 },
    opts: CallOptions = {},
  ): Promise<OutputChunk & { running: boolean }> {
    const r = await this.sandbox.transport.json<
      Checked<
        OutputChunk & { running: boolean; pid: number },
        Answer<'/v1/sandboxes/{id}/commands/{pid}/output', 'get'>
      >
    >({
      method: 'GET',
      path: this.sandbox.path(`/commands/${this.pid}/output`),
      query: { stdoutOffset: String(from.stdout), stderrOffset: String(from.stderr) },
      signal: opts.signal,
    });
    return { stdout: r.stdout, stderr: r.stderr, offsets: r.offsets, rewound: r.rewound, running: r.running };
  }

  /**
   * Resolves with its exit code once it has exited (null if killed before
   * reporting one). Waits in slices of WAIT_SLICE_MS on the server, so no
   * request outlives fetch's own time limits however long the command runs.
   */
  async wait(opts: { timeoutMs?: number | undefined } & CallOptions = {}): Promise<{ exitCode: number | null }> {
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const slice = Math.max(1, Math.min(WAIT_SLICE_MS, deadline - Date.now()));
      try {
        const r = await this.sandbox.transport.json<
          Checked<{ exitCode: number | null }, Answer<'/v1/sandboxes/{id}/commands/{pid}/wait', 'post'>>
        >({
          method: 'POST',
          path: this.sandbox.path(`/commands/${this.pid}/wait`),
          body: {
            json: { timeoutMs: Math.ceil(slice) } satisfies Body<'/v1/sandboxes/{id}/commands/{pid}/wait', 'post'>,
          },
          signal: opts.signal,
        });
        return { exitCode: r.exitCode };
      } catch (e) {
        if ((e as { code?: string }).code !== 'COMMAND_TIMEOUT' || Date.now() >= deadline) throw e;
      }
    }
  }

  /**
   * Writes bytes (text as UTF-8) to its stdin; the command must have been
   * started with `stdin: true`. STDIN_FULL (nothing written) while the
   * process leaves too much unread; STDIN_CLOSED after closeStdin or once it
   * has exited. A retry after a lost answer is replayed, not written twice.
   */
  async sendStdin(data: string | Uint8Array, opts: CallOptions = {}): Promise<void> {
    await this.sandbox.transport.json({
      method: 'POST',
      path: this.sandbox.path(`/commands/${this.pid}/stdin`),
      body: { bytes: typeof data === 'string' ? Buffer.from(data, 'utf8') : data },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /** Closes its stdin: it reads EOF after what was sent before. */
  async closeStdin(opts: CallOptions = {}): Promise<void> {
    await this.sandbox.transport.json({
      method: 'POST',
      path: this.sandbox.path(`/commands/${this.pid}/stdin/close`),
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /**
   * Sends a signal (default SIGKILL); false if it had already exited. Only the
   * signals the server accepts (others were a 400 INVALID_ARGUMENT).
   */
  async kill(signal: KillSignal = 'SIGKILL', opts: CallOptions = {}): Promise<boolean> {
    const r = await this.sandbox.transport.json<
      Checked<{ killed: boolean }, Answer<'/v1/sandboxes/{id}/commands/{pid}/kill', 'post'>>
    >({
      method: 'POST',
      path: this.sandbox.path(`/commands/${this.pid}/kill`),
      body: { json: { signal } satisfies Body<'/v1/sandboxes/{id}/commands/{pid}/kill', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
    return r.killed;
  }
}

/** Commands of a remote sandbox. */
export class RemoteCommands {
  constructor(private readonly sandbox: Sandbox) {}

  /** Reattaches to a background command by its pid (from run's handle or list()). */
  async connect(pid: number, opts: CallOptions = {}): Promise<RemoteCommandHandle> {
    if (!Number.isInteger(pid) || pid < 1)
      throw new InvalidArgumentError('pid', 'the pid of a background command', pid);
    // Answers INVALID_ARGUMENT (field pid) unless the sandbox started such a command.
    await this.sandbox.transport.json({
      method: 'GET',
      path: this.sandbox.path(`/commands/${pid}/output`),
      query: { stdoutOffset: '0', stderrOffset: '0' },
      signal: opts.signal,
    });
    return new RemoteCommandHandle(this.sandbox, pid);
  }

  /** The background commands, by pid, with whether each still runs. */
  async list(opts: CallOptions = {}): Promise<{ pid: number; running: boolean; exitCode: number | null }[]> {
    return this.sandbox.transport.json<
      Checked<
        { pid: number; running: boolean; exitCode: number | null },
        Answer<'/v1/sandboxes/{id}/commands', 'get'>[number]
      >[]
    >({ method: 'GET', path: this.sandbox.path('/commands'), signal: opts.signal });
  }

  /**
   * Runs a command; a string runs through /bin/sh -c. Resolves with the exit
   * code (a non-zero one is not an error). With onStdout/onStderr the output
   * is streamed as it is produced. The signal aborts the command on the server.
   */
  run(cmd: string | string[], opts: RemoteRunOptions & { background: true }): Promise<RemoteCommandHandle>;
  run(cmd: string | string[], opts?: RemoteRunOptions & { background?: false | undefined }): Promise<ObservedRunResult>;
  async run(
    cmd: string | string[],
    opts: RemoteRunOptions & { background?: boolean | undefined } = {},
  ): Promise<ObservedRunResult | RemoteCommandHandle> {
    try {
      return await this.runOnce(cmd, opts);
    } catch (e) {
      // As in-process: an aborted command is COMMAND_ABORTED (the server stops it when the request goes away).
      if (e instanceof RequestAbortedError || (opts.signal?.aborted && !(e instanceof CommandAbortedError))) {
        const aborted = new CommandAbortedError(
          'COMMAND_ABORTED',
          `Command aborted: ${typeof cmd === 'string' ? cmd : cmd.join(' ')}`,
        );
        Object.defineProperty(aborted, 'cause', { value: e, configurable: true, writable: true });
        throw aborted;
      }
      throw e;
    }
  }

  private async runOnce(
    cmd: string | string[],
    opts: RemoteRunOptions & { background?: boolean | undefined },
  ): Promise<ObservedRunResult | RemoteCommandHandle> {
    const { signal, idempotencyKey, onStdout, onStderr, background, ...rest } = opts;
    const body = { cmd, ...rest, ...(background ? { background: true } : {}) } satisfies Body<
      '/v1/sandboxes/{id}/commands',
      'post'
    >;
    const t = this.sandbox.transport;
    const path = this.sandbox.path('/commands');
    if (background) {
      const r = await t.json<
        Checked<{ pid: number }, Extract<Answer<'/v1/sandboxes/{id}/commands', 'post'>, { pid: number }>>
      >({
        method: 'POST',
        path,
        body: { json: body },
        signal,
        idempotencyKey,
      });
      return new RemoteCommandHandle(this.sandbox, r.pid);
    }
    // Without callbacks, one JSON answer, sent when the command has finished: an
    // answer lost on the way is retried and replayed, not run again (a connection
    // lost while the command runs aborts it on the server, as the signal does, and
    // the retry runs it afresh). fetch waits 300 s for an answer: longer commands
    // stream (the headers come at once) or run in the background (wait() asks in slices).
    if (!onStdout && !onStderr)
      return t.json<
        Checked<ObservedRunResult, Exclude<Answer<'/v1/sandboxes/{id}/commands', 'post'>, { pid: number }>>
      >({
        method: 'POST',
        path,
        body: { json: body },
        signal,
        idempotencyKey,
      });

    const res = await t.send({
      method: 'POST',
      path,
      body: { json: body },
      accept: 'application/x-ndjson',
      signal,
      idempotencyKey,
    });
    let stdout = '';
    let stderr = '';
    let result: Omit<ObservedRunResult, 'stdout' | 'stderr'> | undefined;
    for await (const ev of ndjsonEvents(res)) {
      if (ev.type === 'stdout') {
        stdout += ev.data as string;
        onStdout?.(ev.data as string);
      } else if (ev.type === 'stderr') {
        stderr += ev.data as string;
        onStderr?.(ev.data as string);
      } else if (ev.type === 'result') {
        const { type: _t, ...r } = ev;
        result = r as unknown as typeof result;
      } else if (ev.type === 'error') {
        throw errorFromWire(500, (ev as unknown as { error: WireError }).error);
      }
    }
    if (!result) throw new ConnectionError('The command stream ended before its result: the connection was cut');
    return { ...result, stdout, stderr };
  }
}

/** A file being downloaded. */
export interface RemoteReadStream {
  stream: Readable;
  /**
   * Settles at the end with the hash and length of what arrived (computed here,
   * checked against the server's when it sent one).
   */
  done: Promise<{ sha256: string; bytes: number }>;
}

/** Files of a remote sandbox; the agent's reads and writes are recorded as observations on the server. */
export class RemoteFiles {
  constructor(private readonly sandbox: Sandbox) {}

  private get t() {
    return this.sandbox.transport;
  }

  /** Reads a whole file as bytes. */
  async read(
    path: string,
    opts: { toolCallId?: string | undefined } & CallOptions = {},
  ): Promise<{ content: Buffer; sha256: string; observationId: string | undefined }> {
    const res = await this.t.send({
      method: 'GET',
      path: this.sandbox.path('/files'),
      query: { path, toolCallId: opts.toolCallId },
      accept: 'application/octet-stream',
      signal: opts.signal,
    });
    const content = Buffer.from(await res.arrayBuffer());
    const sha256 = createHash('sha256').update(content).digest('hex');
    const sent = res.headers.get('x-lockstep-sha256');
    if (sent && sent !== sha256)
      throw new ConnectionError(`The bytes of ${path} arrived damaged (sha256 ${sha256}, the server sent ${sent})`);
    return { content, sha256, observationId: res.headers.get('x-lockstep-observation-id') || undefined };
  }

  /** Reads a file as a stream, for files of any size; nothing is held in memory. */
  async readStream(
    path: string,
    opts: { toolCallId?: string | undefined } & CallOptions = {},
  ): Promise<RemoteReadStream> {
    const res = await this.t.send({
      method: 'GET',
      path: this.sandbox.path('/files'),
      query: { path, toolCallId: opts.toolCallId },
      accept: 'application/octet-stream',
      signal: opts.signal,
    });
    const hash = createHash('sha256');
    let bytes = 0;
    const stream = Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>);
    const done = new Promise<{ sha256: string; bytes: number }>((resolve, reject) => {
      stream.on('data', (c: Buffer) => {
        hash.update(c);
        bytes += c.length;
      });
      stream.once('end', () => resolve({ sha256: hash.digest('hex'), bytes }));
      stream.once('error', reject);
    });
    done.catch(() => undefined);
    stream.pause();
    return { stream, done };
  }

  /** Writes a file (parents are created); bytes as given, strings as UTF-8. */
  async write(
    path: string,
    data: string | Uint8Array,
    opts: { mode?: number | undefined; toolCallId?: string | undefined } & CallOptions = {},
  ): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    if (opts.mode !== undefined) {
      // Only the JSON form carries a mode.
      return this.t.json<
        Checked<
          { sha256: string; bytes: number; observationId: string | undefined },
          Answer<'/v1/sandboxes/{id}/files', 'put'>
        >
      >({
        method: 'PUT',
        path: this.sandbox.path('/files'),
        query: { path },
        body: {
          json: {
            content: Buffer.from(bytes).toString('base64'),
            encoding: 'base64',
            mode: opts.mode,
            ...(opts.toolCallId ? { toolCallId: opts.toolCallId } : {}),
          } satisfies Body<'/v1/sandboxes/{id}/files', 'put'>,
        },
        signal: opts.signal,
      });
    }
    return this.t.json<
      Checked<
        { sha256: string; bytes: number; observationId: string | undefined },
        Answer<'/v1/sandboxes/{id}/files', 'put'>
      >
    >({
      method: 'PUT',
      path: this.sandbox.path('/files'),
      query: { path, toolCallId: opts.toolCallId },
      body: { bytes },
      signal: opts.signal,
    });
  }

  /**
   * Writes a file from a stream as it is read (the file changes only once all of it
   * arrived). Not retried: a stream is read once.
   */
  async writeStream(
    path: string,
    source: AsyncIterable<Uint8Array | string>,
    opts: { toolCallId?: string | undefined } & CallOptions = {},
  ): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    return this.t.json<
      Checked<
        { sha256: string; bytes: number; observationId: string | undefined },
        Answer<'/v1/sandboxes/{id}/files', 'put'>
      >
    >({
      method: 'PUT',
      path: this.sandbox.path('/files'),
      query: { path, toolCallId: opts.toolCallId },
      body: { stream: source },
      signal: opts.signal,
    });
  }

  /**
   * Every entry of a directory, sorted by name: pages through listPage
   * (LIST_MAX_LIMIT entries a request) and holds them all here. Each page is
   * recorded as an observation; observationId is the first page's.
   */
  async list(
    path: string,
    opts: { toolCallId?: string | undefined } & CallOptions = {},
  ): Promise<FileEntry[] & { observationId?: string }> {
    const all: FileEntry[] = [];
    let observationId: string | undefined;
    let cursor: string | null = null;
    do {
      const page: FilePage & { observationId?: string } = await this.listPage(path, {
        ...opts,
        limit: LIST_MAX_LIMIT,
        cursor,
      });
      observationId ??= page.observationId;
      for (const e of page.entries) all.push(e);
      cursor = page.nextCursor;
    } while (cursor !== null);
    return Object.assign(all, observationId !== undefined ? { observationId } : {});
  }

  /**
   * One page of a directory, sorted by name: at most `limit` entries (server
   * default 1000, at most 10000) after `cursor`, the previous page's
   * nextCursor; nextCursor is null on the last page.
   */
  async listPage(
    path: string,
    opts: { toolCallId?: string | undefined; limit?: number; cursor?: string | null } & CallOptions = {},
  ): Promise<FilePage & { observationId?: string }> {
    const r = await this.t.json<
      Checked<FilePage & { observationId?: string }, Answer<'/v1/sandboxes/{id}/files/list', 'get'>>
    >({
      method: 'GET',
      path: this.sandbox.path('/files/list'),
      query: { path, toolCallId: opts.toolCallId, limit: opts.limit?.toString(), cursor: opts.cursor ?? undefined },
      signal: opts.signal,
    });
    return {
      entries: r.entries,
      nextCursor: r.nextCursor ?? null,
      ...(r.observationId !== undefined ? { observationId: r.observationId } : {}),
    };
  }

  async exists(path: string, opts: CallOptions = {}): Promise<boolean> {
    const r = await this.t.json<Checked<{ exists: boolean }, Answer<'/v1/sandboxes/{id}/files/exists', 'get'>>>({
      method: 'GET',
      path: this.sandbox.path('/files/exists'),
      query: { path },
      signal: opts.signal,
    });
    return r.exists;
  }

  async remove(path: string, opts: { toolCallId?: string | undefined } & CallOptions = {}): Promise<void> {
    await this.t.send({
      method: 'DELETE',
      path: this.sandbox.path('/files'),
      query: { path, toolCallId: opts.toolCallId },
      signal: opts.signal,
    });
  }
}

/** The effect ledger of a remote sandbox: intents recorded before side effects run. */
export class RemoteEffects {
  constructor(private readonly sandbox: Sandbox) {}

  private effectPath(effectId: string, verb = ''): string {
    return this.sandbox.path(`/effects/${enc(effectId)}${verb}`);
  }

  /** Records the intent durably; returns the recorded output instead if this effect already committed. */
  async begin(spec: EffectSpec, opts: CallOptions = {}): Promise<BeginResult> {
    return this.sandbox.transport.json<Checked<BeginResult, Answer<'/v1/sandboxes/{id}/effects', 'post', 201>>>({
      method: 'POST',
      path: this.sandbox.path('/effects'),
      body: { json: spec satisfies Body<'/v1/sandboxes/{id}/effects', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  async commit(effectId: string, output?: JsonValue, opts: CallOptions = {}): Promise<EffectRecord> {
    return this.sandbox.transport.json<
      Checked<EffectRecord, Answer<'/v1/sandboxes/{id}/effects/{effectId}/commit', 'post'>>
    >({
      method: 'POST',
      path: this.effectPath(effectId, '/commit'),
      body: {
        json: (output === undefined ? {} : { output }) satisfies Body<
          '/v1/sandboxes/{id}/effects/{effectId}/commit',
          'post'
        >,
      },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /** Records a failure; `definite`: the effect certainly did not happen (it may be retried). */
  async fail(effectId: string, err: unknown, opts: { definite: boolean } & CallOptions): Promise<EffectRecord> {
    const code = (err as { code?: unknown } | null)?.code;
    const e =
      err instanceof Error
        ? {
            name: err.name.slice(0, 200),
            message: err.message.slice(0, 4000),
            ...(typeof code === 'string' ? { code: code.slice(0, 200) } : {}),
          }
        : String(err).slice(0, 4000);
    return this.sandbox.transport.json<
      Checked<EffectRecord, Answer<'/v1/sandboxes/{id}/effects/{effectId}/fail', 'post'>>
    >({
      method: 'POST',
      path: this.effectPath(effectId, '/fail'),
      body: {
        json: { error: e, definite: opts.definite } satisfies Body<
          '/v1/sandboxes/{id}/effects/{effectId}/fail',
          'post'
        >,
      },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /**
   * begin → fn → commit (or fail); after a rollback or in a fork, an effect
   * that already committed returns its recorded output without running fn.
   * An error with `definite: true` records that the effect did not happen.
   */
  async run<T extends JsonValue | undefined | void>(
    spec: EffectSpec,
    fn: () => T | Promise<T>,
    opts: CallOptions = {},
  ): Promise<T> {
    const b = await this.begin(spec, opts);
    if (b.replayed) return b.output as T;
    let output: T;
    try {
      output = await fn();
    } catch (err) {
      const definite = typeof err === 'object' && err !== null && (err as { definite?: unknown }).definite === true;
      await this.fail(b.effectId, err, { definite, signal: opts.signal });
      throw err;
    }
    await this.commit(b.effectId, output as JsonValue | undefined, { signal: opts.signal });
    return output;
  }

  async resolveUnknown(effectId: string, resolution: Resolution, opts: CallOptions = {}): Promise<EffectRecord> {
    return this.sandbox.transport.json<
      Checked<EffectRecord, Answer<'/v1/sandboxes/{id}/effects/{effectId}/resolve', 'post'>>
    >({
      method: 'POST',
      path: this.effectPath(effectId, '/resolve'),
      body: { json: resolution satisfies Body<'/v1/sandboxes/{id}/effects/{effectId}/resolve', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  async list(opts: CallOptions = {}): Promise<EffectRecord[]> {
    return this.sandbox.transport.json<Checked<EffectRecord, Answer<'/v1/sandboxes/{id}/effects', 'get'>[number]>[]>({
      method: 'GET',
      path: this.sandbox.path('/effects'),
      signal: opts.signal,
    });
  }

  async get(effectId: string, opts: CallOptions = {}): Promise<EffectRecord> {
    return this.sandbox.transport.json<Checked<EffectRecord, Answer<'/v1/sandboxes/{id}/effects/{effectId}', 'get'>>>({
      method: 'GET',
      path: this.effectPath(effectId),
      signal: opts.signal,
    });
  }
}

/** Verdicts about files of a remote sandbox, bound to the file's content hash. */
export class RemoteVerdicts {
  constructor(private readonly sandbox: Sandbox) {}

  async record(
    input: { path: string; verdict: string; toolCallId?: string | undefined },
    opts: CallOptions = {},
  ): Promise<Verdict> {
    return this.sandbox.transport.json<Checked<Verdict, Answer<'/v1/sandboxes/{id}/verdicts', 'post', 201>>>({
      method: 'POST',
      path: this.sandbox.path('/verdicts'),
      body: { json: input satisfies Body<'/v1/sandboxes/{id}/verdicts', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  async list(opts: CallOptions = {}): Promise<Verdict[]> {
    return this.sandbox.transport.json<Checked<Verdict, Answer<'/v1/sandboxes/{id}/verdicts', 'get'>[number]>[]>({
      method: 'GET',
      path: this.sandbox.path('/verdicts'),
      signal: opts.signal,
    });
  }

  /** Verdicts whose file no longer has the content they were made on. */
  async stale(opts: CallOptions = {}): Promise<StaleVerdict[]> {
    return this.sandbox.transport.json({
      method: 'GET',
      path: this.sandbox.path('/verdicts'),
      query: { stale: 'true' },
      signal: opts.signal,
    });
  }
}

/** Exposed ports of a remote sandbox: the URL is the server's, the token is shown only by expose. */
export class RemotePorts {
  constructor(private readonly sandbox: Sandbox) {}

  /** Exposes a port the sandbox listens on (PORT_NOT_LISTENING otherwise); send the token as X-Lockstep-Token. */
  async expose(port: number, opts: CallOptions = {}): Promise<ExposedPort> {
    return this.sandbox.transport.json<Checked<ExposedPort, Answer<'/v1/sandboxes/{id}/ports', 'post', 201>>>({
      method: 'POST',
      path: this.sandbox.path('/ports'),
      body: { json: { port } satisfies Body<'/v1/sandboxes/{id}/ports', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  async list(opts: CallOptions = {}): Promise<ExposureInfo[]> {
    return this.sandbox.transport.json<Checked<ExposureInfo, Answer<'/v1/sandboxes/{id}/ports', 'get'>[number]>[]>({
      method: 'GET',
      path: this.sandbox.path('/ports'),
      signal: opts.signal,
    });
  }

  /** Closes an exposed port; false when it was not exposed. */
  async close(port: number, opts: CallOptions = {}): Promise<boolean> {
    const r = await this.sandbox.transport.json<
      Checked<{ closed: boolean }, Answer<'/v1/sandboxes/{id}/ports/{port}', 'delete'>>
    >({
      method: 'DELETE',
      path: this.sandbox.path(`/ports/${enc(String(port))}`),
      signal: opts.signal,
    });
    return r.closed;
  }
}
