/**
 * PTYs of a remote sandbox, with the in-process SDK's shape
 * (src/api/sandbox-pty.ts): `create`, `connect`, `list`, and handles
 * with `write`, `resize`, `output`, `follow` (the server's NDJSON stream,
 * docs/http-reference.md), `wait` and `kill`. Output offsets are the
 * transcript's bytes, so a follower that reconnects passes the last offset
 * it saw and misses nothing.
 */
import { InvalidArgumentError } from '../errors.js';
import type { PtyCreateOptions, PtyExit, PtyOutput } from '../api/sandbox-pty.js';
import { errorFromWire, type WireError, ConnectionError } from '../errors-from-wire.js';
import type { Answer, Body, Checked } from './wire.js';
import { WAIT_SLICE_MS, ndjsonEvents, type CallOptions, type Transport } from './transport.js';

/** What a PTY handle uses of its sandbox's handle: the connection and the sandbox's path. */
export interface PtySandbox {
  readonly transport: Transport;
  path(tail: string): string;
}

/** Options of pty.create: the in-process SDK's, plus the call's own. */
export interface RemotePtyCreateOptions extends PtyCreateOptions, CallOptions {}

/** The PTYs of a remote sandbox. */
export class RemotePty {
  constructor(private readonly sandbox: PtySandbox) {}

  /** Starts cmd (default /bin/sh -i) on a new terminal of the sandbox; the handle's pid is its id. */
  async create(opts: RemotePtyCreateOptions): Promise<RemotePtyHandle> {
    const { signal, idempotencyKey, onData, ...body } = opts;
    const r = await this.sandbox.transport.json<Checked<{ pid: number }, Answer<'/v1/sandboxes/{id}/pty', 'post'>>>({
      method: 'POST',
      path: this.sandbox.path('/pty'),
      body: { json: body satisfies Body<'/v1/sandboxes/{id}/pty', 'post'> },
      signal,
      idempotencyKey,
    });
    const handle = new RemotePtyHandle(this.sandbox, r.pid);
    if (onData) void handle.follow(onData, { signal }).catch(() => undefined);
    return handle;
  }

  /** Reattaches by id; INVALID_ARGUMENT (field pid) when the sandbox has no such PTY. */
  async connect(pid: number, opts: CallOptions = {}): Promise<RemotePtyHandle> {
    if (!Number.isInteger(pid) || pid < 1) throw new InvalidArgumentError('pid', 'the id of a PTY', pid);
    const h = new RemotePtyHandle(this.sandbox, pid);
    await h.output(0, opts);
    return h;
  }

  async list(opts: CallOptions = {}): Promise<{ pid: number; running: boolean; exitCode: number | null }[]> {
    return this.sandbox.transport.json<
      Checked<
        { pid: number; running: boolean; exitCode: number | null },
        Answer<'/v1/sandboxes/{id}/pty', 'get'>[number]
      >[]
    >({ method: 'GET', path: this.sandbox.path('/pty'), signal: opts.signal });
  }
}

/** One remote PTY. */
export class RemotePtyHandle {
  constructor(
    private readonly sandbox: PtySandbox,
    readonly pid: number,
  ) {}

  private path(tail: string): string {
    return this.sandbox.path(`/pty/${this.pid}${tail}`);
  }

  /** Types bytes (text as UTF-8) on the terminal. */
  async write(data: string | Uint8Array, opts: CallOptions = {}): Promise<void> {
    await this.sandbox.transport.json({
      method: 'POST',
      path: this.path('/input'),
      body: { bytes: typeof data === 'string' ? Buffer.from(data, 'utf8') : data },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  async resize(cols: number, rows: number, opts: CallOptions = {}): Promise<void> {
    await this.sandbox.transport.json({
      method: 'POST',
      path: this.path('/resize'),
      body: { json: { cols, rows } satisfies Body<'/v1/sandboxes/{id}/pty/{pid}/resize', 'post'> },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /** Output from byte `from` of the transcript (one answer, at most 1 MiB). */
  async output(from = 0, opts: CallOptions = {}): Promise<PtyOutput> {
    const r = await this.sandbox.transport.json<
      Checked<
        { data: string; offset: number; rewound: boolean; running: boolean },
        Answer<'/v1/sandboxes/{id}/pty/{pid}/output', 'get'>
      >
    >({
      method: 'GET',
      path: this.path('/output'),
      query: { offset: String(from) },
      signal: opts.signal,
    });
    return { data: Buffer.from(r.data, 'base64'), offset: r.offset, rewound: r.rewound, running: r.running };
  }

  /**
   * Streams the output from `from` on to onData until the PTY ends; resolves
   * with how it ended. A rollback is told to onRewound, and the data starts
   * again at offset 0.
   */
  async follow(
    onData: (data: Uint8Array) => void,
    opts: CallOptions & { from?: number; onRewound?: () => void } = {},
  ): Promise<PtyExit> {
    const res = await this.sandbox.transport.send({
      method: 'GET',
      path: this.path('/stream'),
      query: { offset: String(opts.from ?? 0) },
      accept: 'application/x-ndjson',
      signal: opts.signal,
    });
    for await (const ev of ndjsonEvents(res)) {
      if (ev.type === 'data') onData(Buffer.from(ev.data as string, 'base64'));
      else if (ev.type === 'rewound') opts.onRewound?.();
      else if (ev.type === 'exit')
        return { exitCode: ev.exitCode as number | null, reason: ev.reason as PtyExit['reason'] };
      else if (ev.type === 'error') throw errorFromWire(500, (ev as unknown as { error: WireError }).error);
    }
    throw new ConnectionError('The PTY stream ended before the PTY did: the connection was cut');
  }

  /** Resolves when the PTY has ended (waits in slices, like a background command's wait). */
  async wait(opts: { timeoutMs?: number | undefined } & CallOptions = {}): Promise<PtyExit> {
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const slice = Math.max(1, Math.min(WAIT_SLICE_MS, deadline - Date.now()));
      try {
        const r = await this.sandbox.transport.json<
          Checked<PtyExit, Answer<'/v1/sandboxes/{id}/pty/{pid}/wait', 'post'>>
        >({
          method: 'POST',
          path: this.path('/wait'),
          body: { json: { timeoutMs: Math.ceil(slice) } satisfies Body<'/v1/sandboxes/{id}/pty/{pid}/wait', 'post'> },
          signal: opts.signal,
        });
        return { exitCode: r.exitCode, reason: r.reason };
      } catch (e) {
        if ((e as { code?: string }).code !== 'COMMAND_TIMEOUT' || Date.now() >= deadline) throw e;
      }
    }
  }

  /** Kills the PTY; false if it had already ended. */
  async kill(opts: CallOptions = {}): Promise<boolean> {
    const r = await this.sandbox.transport.json<
      Checked<{ killed: boolean }, Answer<'/v1/sandboxes/{id}/pty/{pid}/kill', 'post'>>
    >({
      method: 'POST',
      path: this.path('/kill'),
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
    return r.killed;
  }
}
