/**
 * The MCP server: sandboxes exposed to any MCP client as tools. Each tool
 * calls the same library method the CLI and the HTTP API call, and answers
 * with JSON text; a LockstepError becomes a tool error whose text is the
 * same `{"error": {"code", "message", "field"}}` body the HTTP API sends.
 *
 * Two scopes: one sandbox (`lockstep mcp` on stdio: the tools act on it), or
 * a tenant (`/mcp` on `lockstep serve`: every tool takes a sandboxId, and
 * create_sandbox / list_sandboxes / kill_sandbox manage several in one
 * session, within the tenant's quotas, seeing only its sandboxes).
 *
 * Every tool carries MCP ToolAnnotations. openWorldHint is false throughout:
 * the tools act on sandboxes and the ledger, never on the world outside
 * (record_effect records an effect the agent performs itself).
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { createRequire } from 'node:module';
import type { ToolAnnotations } from '@modelcontextprotocol/sdk/types.js';
import type { Lockstep } from '../api/lockstep.js';
import type { Sandbox, SandboxInfo } from '../api/sandbox.js';
import type { CreateOptions } from '../lifecycle/create.js';
import type { ForkResult } from '../checkpoints/fork.js';
import { CONTEXT_FORMATS } from '../context/formats.js';
import { MAX_FORKS } from '../checkpoints/fork.js';
import { LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT } from '../instances/files.js';
import type { JsonValue } from '../effects/idempotency.js';
import { InvalidArgumentError, LockstepError } from '../errors.js';
import { COMMAND_TIMEOUT_MAX_MS, IMAGE_NAME_MAX } from '../limits.js';
import { LIMITS } from '../lifecycle/create.js';
import { MAX_SNAPSHOT_STARTS } from '../snapshots/snapshots.js';
import { contextFromWire, rollbackToWire } from '../api/wire.js';

/** What a tenant's session may do; the HTTP server builds it with the tenant's quotas. */
export interface TenantScope {
  /** The tenant's id (tn_…): sandboxes are looked up, listed and removed under it. */
  id: string;
  /** Creates a sandbox for the tenant (quota-checked). */
  create(opts: Omit<CreateOptions, 'tenant'>): Promise<Sandbox>;
  /** Forks a sandbox of the tenant (quota-checked). */
  fork(sandbox: Sandbox, checkpointId: string, count: number): Promise<ForkResult[]>;
  /** Starts sandboxes of the tenant from one of its snapshots (quota-checked). */
  start(snapshot: string, count: number): Promise<ForkResult[]>;
  /** A sandbox as the tenant sees it. */
  present(info: SandboxInfo): unknown;
}

/** Options of createMcpServer: exactly one of sandboxId and tenant. */
export interface McpServerOptions {
  lockstep: Lockstep;
  /** The one sandbox the tools act on (stdio). */
  sandboxId?: string | undefined;
  /** A tenant's session (HTTP): tools name their sandbox, and sandboxes can be created, listed and killed. */
  tenant?: TenantScope | undefined;
  /**
   * Called with the ids of sandboxes the fork tool starts (the stdio runner removes
   * them with a sandbox it created).
   */
  onFork?: ((ids: string[]) => void) | undefined;
}

const version = (createRequire(import.meta.url)('../../../package.json') as { version: string }).version;

const json = (v: unknown): CallToolResult => ({ content: [{ type: 'text', text: JSON.stringify(v, null, 2) }] });

/** Runs a tool body; LockstepErrors become tool errors (the model can read and act on them). */
async function tool(fn: () => Promise<unknown> | unknown): Promise<CallToolResult> {
  try {
    return json(await fn());
  } catch (e) {
    if (!(e instanceof LockstepError)) throw e;
    const field = typeof e.details.field === 'string' ? { field: e.details.field } : {};
    return {
      isError: true,
      content: [
        { type: 'text', text: JSON.stringify({ error: { code: e.code, message: e.message, ...field } }, null, 2) },
      ],
    };
  }
}

/**
 * A fork's or start's answer: `results`, one per sandbox in order (its id, or
 * its error as a tool error's body), and the ids and errors as lists.
 */
function forkAnswer(results: ForkResult[]): {
  results: Array<{ id: string } | { error: { code: string; message: string; field?: string } }>;
  ids: string[];
  errors: { code: string; message: string }[];
} {
  const slots = results.map((r) => {
    if (r.ok) return { id: r.id };
    const field = r.error.details?.field;
    return { error: { code: r.error.code, message: r.error.message, ...(typeof field === 'string' ? { field } : {}) } };
  });
  return {
    results: slots,
    ids: results.flatMap((r) => (r.ok ? [r.id] : [])),
    errors: results.flatMap((r) => (r.ok ? [] : [{ code: r.error.code, message: r.error.message }])),
  };
}

const toolCallId = z
  .string()
  .min(1)
  .max(200)
  .optional()
  .describe('Your tool-call id, recorded with the observation for provenance');
const path = z.string().min(1).max(4096).describe('Path inside the sandbox; relative paths are under /workspace');

/** An image name, as validateImageName takes it. */
export const imageArg = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]*$/)
  .max(IMAGE_NAME_MAX);
/** A command's timeout, as validateCommand takes it. */
export const commandTimeoutArg = z.number().int().positive().max(COMMAND_TIMEOUT_MAX_MS);

const sandboxIdArg = z
  .string()
  .regex(/^sbx_[a-z0-9]+$/)
  .max(64)
  .describe('The sandbox to act on (from create_sandbox or list_sandboxes)');

/** Annotations: [readOnly, destructive, idempotent]; openWorld is false for every tool (see the top of this file). */
function hints(readOnlyHint: boolean, destructiveHint: boolean, idempotentHint: boolean): ToolAnnotations {
  return { readOnlyHint, destructiveHint, idempotentHint, openWorldHint: false };
}

/** Builds the MCP server for one sandbox or for a tenant; connect it to a transport. */
export function createMcpServer(opts: McpServerOptions): McpServer {
  const ls = opts.lockstep;
  const scope = opts.tenant;
  if ((opts.sandboxId === undefined) === (scope === undefined))
    throw new InvalidArgumentError('sandboxId', 'exactly one of sandboxId and tenant', opts.sandboxId);
  // In a tenant's session every sandbox tool takes the id; on stdio there is
  // one sandbox and no such argument. The cast keeps the tools' argument
  // types inferred; sandbox() reads the id only in a tenant's session.
  const target = (scope ? { sandboxId: sandboxIdArg } : {}) as { sandboxId: typeof sandboxIdArg };
  const sandbox = (args: { sandboxId?: string }): Sandbox =>
    scope ? ls.get(args.sandboxId!, scope.id) : ls.get(opts.sandboxId!);
  const instructions = scope
    ? 'Tools act on Lockstep sandboxes: create_sandbox makes one, and every other tool names its sandboxId. ' +
      'Checkpoint before risky steps; rollback returns what went stale and what cannot be undone.'
    : `Tools act on the Lockstep sandbox ${opts.sandboxId}. Checkpoint before risky ` +
      `steps; rollback returns what went stale and what cannot be undone.`;
  const server = new McpServer({ name: 'lockstep', version }, { instructions });

  if (scope) {
    server.registerTool(
      'create_sandbox',
      {
        description:
          'Create and start a sandbox (a Linux machine of its own with ' +
          'copy-on-write files); returns its id and limits.',
        inputSchema: {
          image: imageArg.optional().describe('Image name (default "base")'),
          memoryMb: z.number().int().min(LIMITS.memoryMb.min).max(LIMITS.memoryMb.max).optional(),
          // As over REST (64 labels), less the createdBy label added here.
          metadata: z
            .record(z.string().max(200), z.string().max(1024))
            .refine((m) => Object.keys(m).length <= 63, 'at most 63 labels')
            .optional()
            .describe('Free-form labels, e.g. {"task": "fix-bug-12"}'),
          network: z
            .enum(['none', 'egress'])
            .optional()
            .describe('"none": loopback only (default); "egress": outbound connections under allowOut'),
          allowOut: z
            .array(z.string().max(300))
            .max(256)
            .optional()
            .describe('Egress allow list: addresses, CIDRs or domain names, each optionally with :PORT'),
        },
        annotations: hints(false, false, false),
      },
      ({ image, memoryMb, metadata, network, allowOut }) =>
        tool(async () =>
          scope.present(
            (
              await scope.create({ image, memoryMb, network, allowOut, metadata: { ...metadata, createdBy: 'mcp' } })
            ).info(),
          ),
        ),
    );
    server.registerTool(
      'list_sandboxes',
      { description: 'Your sandboxes, oldest first.', inputSchema: {}, annotations: hints(true, false, true) },
      () => tool(() => ls.list(scope.id).map((i) => scope.present(i))),
    );
    server.registerTool(
      'kill_sandbox',
      {
        description: 'Remove a sandbox with its processes, files and checkpoints.',
        inputSchema: { sandboxId: sandboxIdArg },
        annotations: hints(false, true, true),
      },
      ({ sandboxId }) =>
        tool(async () => {
          await ls.remove(sandboxId, scope.id);
          return { id: sandboxId, removed: true };
        }),
    );
  }

  server.registerTool(
    'run_command',
    {
      description:
        'Run a command in the sandbox and wait for it. A string runs through /bin/sh ' +
        '-c; an array runs directly. Returns exitCode, stdout, stderr.',
      inputSchema: {
        cmd: z.union([z.string().min(1), z.array(z.string()).min(1)]).describe('Shell command line, or argv'),
        cwd: z.string().startsWith('/').optional().describe('Working directory (default /workspace)'),
        envs: z.record(z.string(), z.string()).optional().describe('Extra environment variables'),
        timeoutMs: commandTimeoutArg.optional(),
        toolCallId,
        ...target,
      },
      annotations: hints(false, true, false),
    },
    ({ cmd, cwd, envs, timeoutMs, toolCallId: tc, ...a }) =>
      tool(() => sandbox(a).commands.run(cmd, { cwd, envs, timeoutMs, toolCallId: tc })),
  );

  const pidArg = z.number().int().positive().describe('The process, from start_process or list_processes');

  server.registerTool(
    'start_process',
    {
      description:
        'Start a long-running or interactive process in the background (a dev server, a REPL, a filter reading ' +
        'stdin). It is part of the sandbox: checkpoints capture it and rollbacks rewind it. With stdin: true, ' +
        'send_input feeds it. Returns its pid; read_output, wait_process and kill_process take it.',
      inputSchema: {
        cmd: z.union([z.string().min(1), z.array(z.string()).min(1)]).describe('Shell command line, or argv'),
        stdin: z.boolean().optional().describe('Keep its stdin open for send_input (default false: /dev/null)'),
        cwd: z.string().startsWith('/').optional().describe('Working directory (default /workspace)'),
        envs: z.record(z.string(), z.string()).optional().describe('Extra environment variables'),
        ...target,
      },
      annotations: hints(false, false, false),
    },
    ({ cmd, stdin, cwd, envs, ...a }) =>
      tool(async () => {
        const h = await sandbox(a).commands.run(cmd, { background: true, stdin, cwd, envs });
        return { pid: h.pid, stdin: stdin === true };
      }),
  );

  server.registerTool(
    'send_input',
    {
      description:
        "Write bytes to a background process's stdin (started with stdin: true); close: true then ends its input " +
        '(EOF). STDIN_FULL when 1 MiB is already waiting unread.',
      inputSchema: {
        pid: pidArg,
        data: z
          .string()
          .max(1024 * 1024)
          .optional()
          .describe('What to write'),
        encoding: z.enum(['utf8', 'base64']).optional().describe('Encoding of data (default utf8)'),
        close: z.boolean().optional().describe('Close its stdin after writing'),
        ...target,
      },
      annotations: hints(false, false, false),
    },
    ({ pid, data, encoding, close, ...a }) =>
      tool(async () => {
        const h = await sandbox(a).commands.connect(pid);
        const bytes = Buffer.from(data ?? '', encoding ?? 'utf8');
        if (bytes.length > 0) await h.sendStdin(bytes);
        if (close) await h.closeStdin();
        return { pid, sent: bytes.length, closed: close === true };
      }),
  );

  server.registerTool(
    'read_output',
    {
      description:
        'What a background process wrote since the offsets given (start at 0, 0; pass back the offsets it ' +
        'returns). rewound: true when a rollback rewound its output.',
      inputSchema: {
        pid: pidArg,
        stdoutOffset: z.number().int().min(0).optional(),
        stderrOffset: z.number().int().min(0).optional(),
        ...target,
      },
      annotations: hints(true, false, true),
    },
    ({ pid, stdoutOffset, stderrOffset, ...a }) =>
      tool(async () => {
        const h = await sandbox(a).commands.connect(pid);
        return { pid, ...(await h.output({ stdout: stdoutOffset ?? 0, stderr: stderrOffset ?? 0 })) };
      }),
  );

  server.registerTool(
    'wait_process',
    {
      description: 'Wait for a background process to exit (up to timeoutMs, default 30 s); returns its exit code.',
      inputSchema: {
        pid: pidArg,
        timeoutMs: z
          .number()
          .int()
          .positive()
          .max(10 * 60 * 1000)
          .optional(),
        ...target,
      },
      annotations: hints(true, false, true),
    },
    ({ pid, timeoutMs, ...a }) =>
      tool(async () => {
        const h = await sandbox(a).commands.connect(pid);
        return { pid, ...(await h.wait({ timeoutMs: timeoutMs ?? 30_000 })) };
      }),
  );

  server.registerTool(
    'list_processes',
    {
      description: 'The background processes started with start_process, with whether each still runs.',
      inputSchema: { ...target },
      annotations: hints(true, false, true),
    },
    (a) => tool(async () => ({ processes: await sandbox(a).commands.list() })),
  );

  server.registerTool(
    'kill_process',
    {
      description: 'Kill a background process (SIGKILL, or the signal given).',
      inputSchema: {
        pid: pidArg,
        signal: z.enum(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP']).optional(),
        ...target,
      },
      annotations: hints(false, true, true),
    },
    ({ pid, signal, ...a }) =>
      tool(async () => {
        const h = await sandbox(a).commands.connect(pid);
        return { pid, killed: await h.kill(signal ?? 'SIGKILL') };
      }),
  );

  server.registerTool(
    'read_file',
    {
      description: 'Read a file of the sandbox. Text comes back as utf8, other bytes as base64 (or as asked).',
      inputSchema: { path, encoding: z.enum(['utf8', 'base64']).optional(), toolCallId, ...target },
      annotations: hints(true, false, true),
    },
    ({ path: p, encoding, toolCallId: tc, ...a }) =>
      tool(async () => {
        const r = await sandbox(a).files.read(p, { toolCallId: tc });
        const enc = encoding ?? (Buffer.from(r.content.toString('utf8'), 'utf8').equals(r.content) ? 'utf8' : 'base64');
        return {
          path: p,
          content: r.content.toString(enc),
          encoding: enc,
          sha256: r.sha256,
          bytes: r.content.length,
          observationId: r.observationId,
        };
      }),
  );

  server.registerTool(
    'write_file',
    {
      description: 'Write a file in the sandbox (parent directories are created).',
      inputSchema: {
        path,
        content: z.string().max(16 * 1024 * 1024),
        encoding: z.enum(['utf8', 'base64']).optional().describe('Encoding of content (default utf8)'),
        toolCallId,
        ...target,
      },
      annotations: hints(false, true, true),
    },
    ({ path: p, content, encoding, toolCallId: tc, ...a }) =>
      tool(async () => ({
        path: p,
        ...(await sandbox(a).files.write(p, Buffer.from(content, encoding ?? 'utf8'), { toolCallId: tc })),
      })),
  );

  server.registerTool(
    'list_files',
    {
      description:
        'List a directory of the sandbox, one page at a time, sorted by name. ' +
        'When nextCursor is not null, call again with it as cursor for the rest.',
      inputSchema: {
        path: path.default('/workspace'),
        limit: z
          .number()
          .int()
          .min(1)
          .max(LIST_MAX_LIMIT)
          .optional()
          .describe(`Entries in this page (default ${LIST_DEFAULT_LIMIT})`),
        cursor: z.string().min(1).max(4096).optional().describe("The previous page's nextCursor"),
        toolCallId,
        ...target,
      },
      annotations: hints(true, false, true),
    },
    ({ path: p, limit, cursor, toolCallId: tc, ...a }) =>
      tool(async () => {
        const page = await sandbox(a).files.listPage(p, { limit, cursor, toolCallId: tc });
        return { path: p, entries: page.entries, nextCursor: page.nextCursor, observationId: page.observationId };
      }),
  );

  server.registerTool(
    'checkpoint',
    {
      description:
        "Checkpoint the sandbox's files and processes, with your context if you give it, " +
        'so that you can roll back to this point.',
      inputSchema: {
        label: z.string().max(200).optional(),
        context: z
          .union([z.record(z.string(), z.unknown()), z.array(z.unknown())])
          .optional()
          .describe(
            `Your context: {format: ${CONTEXT_FORMATS.join('|')}, ...}, or with contextFormat just the messages array`,
          ),
        contextFormat: z.enum(CONTEXT_FORMATS as [string, ...string[]]).optional(),
        ...target,
      },
      annotations: hints(false, false, false),
    },
    ({ label, context, contextFormat, ...a }) =>
      tool(async () => {
        const ctx = context === undefined ? undefined : contextFromWire(context, contextFormat);
        return sandbox(a).checkpoint({ label, context: ctx });
      }),
  );

  server.registerTool(
    'rollback',
    {
      description:
        'Roll the sandbox back to a checkpoint. Returns the rollback report: the ' +
        'context stored at the checkpoint, the observations that went stale, ' +
        'the effects after the checkpoint that the rollback cannot undo, and a recovery summary to continue from.',
      inputSchema: {
        checkpointId: z.string().min(1),
        policy: z
          .enum(['warn', 'refuse'])
          .optional()
          .describe('"refuse": do not roll back if irreversible effects happened since'),
        failure: z.string().max(4000).optional().describe('Why the abandoned attempt failed'),
        lessons: z.array(z.string().max(2000)).max(100).optional().describe('What you learnt that stays true'),
        ...target,
      },
      // Destructive: what changed since the checkpoint is discarded.
      annotations: hints(false, true, false),
    },
    ({ checkpointId, policy, failure, lessons, ...a }) =>
      tool(async () => rollbackToWire(await sandbox(a).rollback(checkpointId, { policy, failure, lessons }), true)),
  );

  server.registerTool(
    'fork',
    {
      description:
        'Start independent sandboxes from a checkpoint; returns one result per fork in order ({id} or {error}), and the ids started.',
      inputSchema: {
        checkpointId: z.string().min(1),
        count: z.number().int().min(1).max(MAX_FORKS).optional(),
        ...target,
      },
      annotations: hints(false, false, false),
    },
    ({ checkpointId, count, ...a }) =>
      tool(async () => {
        const sb = sandbox(a);
        const results = scope ? await scope.fork(sb, checkpointId, count ?? 1) : await sb.fork(checkpointId, { count });
        const answer = forkAnswer(results);
        opts.onFork?.(answer.ids);
        return answer;
      }),
  );

  server.registerTool(
    'record_effect',
    {
      description:
        'Record a side effect outside the sandbox (a payment, an e-mail, an ' +
        'API call) with its output, under an idempotency key. ' +
        'Recording the same key again (a retry, after a rollback, or in a fork) ' +
        'records nothing new and returns the output recorded the first time ' +
        'with replayed: true: then do not perform the effect again.',
      inputSchema: {
        kind: z.string().min(1).max(200).describe('What kind of effect, e.g. "email.send"'),
        input: z.any().describe('What the effect was asked to do (JSON)'),
        key: z.string().min(1).max(200).describe('Idempotency key: the same key means the same effect'),
        output: z.any().optional().describe('What the effect returned (JSON)'),
        reversibility: z
          .enum(['sandbox-local', 'compensable', 'irreversible'])
          .optional()
          .describe('Default irreversible'),
        compensation: z
          .object({ kind: z.string().min(1), input: z.any() })
          .optional()
          .describe('For compensable effects: the action that takes it back'),
        ...target,
      },
      // Idempotent: the same key records nothing new.
      annotations: hints(false, false, true),
    },
    ({ kind, input, key, output, reversibility, compensation, ...a }) =>
      tool(() => {
        const effects = sandbox(a).effects;
        const b = effects.begin({
          kind,
          input: (input ?? null) as JsonValue,
          key,
          reversibility: reversibility ?? 'irreversible',
          ...(compensation
            ? { compensation: { kind: compensation.kind, input: (compensation.input ?? null) as JsonValue } }
            : {}),
        });
        if (b.replayed) return { replayed: true, effectId: b.effectId, output: b.output ?? null };
        effects.commit(b.effectId, output as JsonValue | undefined);
        return { replayed: false, effectId: b.effectId, status: 'committed' };
      }),
  );

  // Snapshots: checkpoints promoted to outlive their sandbox (the tenant's, or on stdio every one).
  const tenantOf = scope ? { tenant: scope.id } : {};
  const snapshotRef = z
    .string()
    .regex(/^(snap_[a-z0-9]+|[a-z0-9][a-z0-9._-]{0,63})$/)
    .describe('A snapshot id (snap_…) or name');
  server.registerTool(
    'create_snapshot',
    {
      description:
        'Keep a checkpoint as a named snapshot that outlives the sandbox: its files, processes and context. ' +
        'New sandboxes can start from it later (start_from_snapshot).',
      inputSchema: {
        checkpointId: z
          .string()
          .regex(/^ckpt_[a-z0-9]+$/)
          .max(64)
          .describe('A checkpoint of the sandbox'),
        name: z
          .string()
          .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
          .optional()
          .describe('Unique among your snapshots'),
        metadata: z.record(z.string().max(200), z.string().max(1024)).optional().describe('Free-form labels'),
        ...target,
      },
      annotations: hints(false, false, false),
    },
    ({ checkpointId, name, metadata, ...a }) =>
      tool(async () => {
        sandbox(a).context(checkpointId); // the checkpoint must be this sandbox's
        return ls.snapshots.create(checkpointId, { name, metadata, ...tenantOf });
      }),
  );
  const portArg = z.number().int().min(1).max(65535).describe('A port the sandbox listens on');
  server.registerTool(
    'expose_port',
    {
      description:
        'Expose a port the sandbox listens on, so that a person or a program outside can reach it over HTTP ' +
        '(a URL and a token to send as X-Lockstep-Token; the token is shown only now). Fails with ' +
        'PORT_NOT_LISTENING when nothing listens there yet.',
      inputSchema: { port: portArg, ...target },
      annotations: hints(false, false, false),
    },
    ({ port, ...a }) => tool(() => sandbox(a).ports.expose(port)),
  );
  server.registerTool(
    'list_ports',
    {
      description: "The sandbox's exposed ports with their URLs (not their tokens).",
      inputSchema: { ...target },
      annotations: hints(true, false, true),
    },
    (a) => tool(() => sandbox(a).ports.list()),
  );
  server.registerTool(
    'close_port',
    {
      description: 'Close an exposed port (its URL stops working, open connections through it end).',
      inputSchema: { port: portArg, ...target },
      annotations: hints(false, true, true),
    },
    ({ port, ...a }) => tool(() => ({ port, closed: sandbox(a).ports.close(port) })),
  );
  server.registerTool(
    'list_snapshots',
    { description: 'Your snapshots, oldest first.', inputSchema: {}, annotations: hints(true, false, true) },
    () => tool(() => ls.snapshots.list(tenantOf)),
  );
  server.registerTool(
    'delete_snapshot',
    {
      description: 'Delete a snapshot (sandboxes started from it keep running).',
      inputSchema: { snapshot: snapshotRef },
      annotations: hints(false, true, true),
    },
    ({ snapshot }) =>
      tool(async () => {
        const { id } = ls.snapshots.get(snapshot, tenantOf);
        await ls.snapshots.delete(id, tenantOf);
        return { id, deleted: true };
      }),
  );
  // The snapshot store (LOCKSTEP_SNAPSHOT_STORE): the tenant's own part of it.
  const storeKey = z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/)
    .describe("A bundle's key in your part of the snapshot store");
  server.registerTool(
    'push_snapshot',
    {
      description:
        'Copy a snapshot into the snapshot store (for another host to pull), under a key (default: its name, else its id). ' +
        'Chunks the store already has are not sent again.',
      inputSchema: { snapshot: snapshotRef, key: storeKey.optional() },
      annotations: hints(false, false, true),
    },
    ({ snapshot, key }) =>
      tool(async () => {
        const { id } = ls.snapshots.get(snapshot, tenantOf);
        return ls.snapshots.push(id, { key, ...tenantOf });
      }),
  );
  server.registerTool(
    'pull_snapshot',
    {
      description:
        'Make a new snapshot here from a bundle in the snapshot store (verified, and only if a trusted host signed it).',
      inputSchema: {
        key: storeKey,
        name: z
          .string()
          .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
          .optional()
          .describe('Its name here (default: the name it had)'),
      },
      annotations: hints(false, false, false),
    },
    ({ key, name }) => tool(async () => ls.snapshots.pull(key, { name, ...tenantOf })),
  );
  server.registerTool(
    'list_stored_snapshots',
    {
      description: 'The bundles in your part of the snapshot store.',
      inputSchema: {},
      annotations: hints(true, false, true),
    },
    () => tool(() => ls.snapshots.listStored(tenantOf)),
  );
  if (scope)
    server.registerTool(
      'start_from_snapshot',
      {
        description:
          'Start sandboxes from a snapshot: its processes resume, with its files, and the lineage is kept (effects recorded before it replay instead of running again).',
        inputSchema: {
          snapshot: snapshotRef,
          count: z.number().int().min(1).max(MAX_SNAPSHOT_STARTS).optional().describe('How many (default 1)'),
        },
        annotations: hints(false, false, false),
      },
      ({ snapshot, count }) =>
        tool(async () => {
          return forkAnswer(await scope.start(snapshot, count ?? 1));
        }),
    );

  server.registerTool(
    'list_checkpoints',
    {
      description: "The sandbox's checkpoints, oldest first.",
      inputSchema: { ...target },
      annotations: hints(true, false, true),
    },
    (a: { sandboxId?: string }) => tool(() => sandbox(a).checkpoints()),
  );

  return server;
}
