/**
 * The MCP server: one sandbox exposed to any MCP client as tools. Each tool
 * calls the same library method the CLI and the HTTP API call, and answers
 * with JSON text; a LockstepError becomes a tool error whose text is the
 * same `{"error": {"code", "message", "field"}}` body the HTTP API sends.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { createRequire } from 'node:module';
import type { Lockstep } from '../lockstep.js';
import type { Sandbox } from '../sandboxes/sandbox.js';
import { CONTEXT_FORMATS } from '../context/formats.js';
import { MAX_FORKS } from '../checkpoints/fork.js';
import type { JsonValue } from '../effects/idempotency.js';
import { LockstepError } from '../errors.js';
import { contextFromWire, rollbackToWire } from '../wire.js';

/** Options of createMcpServer. */
export interface McpServerOptions {
  lockstep: Lockstep;
  /** The sandbox the tools act on. */
  sandboxId: string;
  /** Called with the ids of sandboxes the fork tool starts (the stdio runner removes them with a sandbox it created). */
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
    return { isError: true, content: [{ type: 'text', text: JSON.stringify({ error: { code: e.code, message: e.message, ...field } }, null, 2) }] };
  }
}

const toolCallId = z.string().min(1).max(200).optional().describe("Your tool-call id, recorded with the observation for provenance");
const path = z.string().min(1).max(4096).describe('Path inside the sandbox; relative paths are under /workspace');

/** Builds the MCP server for one sandbox; connect it to a transport. */
export function createMcpServer(opts: McpServerOptions): McpServer {
  const ls = opts.lockstep;
  const sandbox = (): Sandbox => ls.get(opts.sandboxId);
  const server = new McpServer({ name: 'lockstep', version }, { instructions: `Tools act on the Lockstep sandbox ${opts.sandboxId}. Checkpoint before risky steps; rollback returns what went stale and what cannot be undone.` });

  server.registerTool(
    'run_command',
    {
      description: 'Run a command in the sandbox and wait for it. A string runs through /bin/sh -c; an array runs directly. Returns exitCode, stdout, stderr.',
      inputSchema: {
        cmd: z.union([z.string().min(1), z.array(z.string()).min(1)]).describe('Shell command line, or argv'),
        cwd: z.string().startsWith('/').optional().describe('Working directory (default /workspace)'),
        envs: z.record(z.string(), z.string()).optional().describe('Extra environment variables'),
        timeoutMs: z.number().int().positive().max(24 * 3600 * 1000).optional(),
        toolCallId,
      },
    },
    ({ cmd, cwd, envs, timeoutMs, toolCallId: tc }) => tool(() => sandbox().commands.run(cmd, { cwd, envs, timeoutMs, toolCallId: tc })),
  );

  server.registerTool(
    'read_file',
    {
      description: 'Read a file of the sandbox. Text comes back as utf8, other bytes as base64 (or as asked).',
      inputSchema: { path, encoding: z.enum(['utf8', 'base64']).optional(), toolCallId },
    },
    ({ path: p, encoding, toolCallId: tc }) =>
      tool(async () => {
        const r = await sandbox().files.read(p, { toolCallId: tc });
        const enc = encoding ?? (Buffer.from(r.content.toString('utf8'), 'utf8').equals(r.content) ? 'utf8' : 'base64');
        return { path: p, content: r.content.toString(enc), encoding: enc, sha256: r.sha256, bytes: r.content.length, observationId: r.observationId };
      }),
  );

  server.registerTool(
    'write_file',
    {
      description: 'Write a file in the sandbox (parent directories are created).',
      inputSchema: { path, content: z.string().max(16 * 1024 * 1024), encoding: z.enum(['utf8', 'base64']).optional().describe('Encoding of content (default utf8)'), toolCallId },
    },
    ({ path: p, content, encoding, toolCallId: tc }) => tool(async () => ({ path: p, ...(await sandbox().files.write(p, Buffer.from(content, encoding ?? 'utf8'), { toolCallId: tc })) })),
  );

  server.registerTool(
    'list_files',
    { description: 'List a directory of the sandbox.', inputSchema: { path: path.default('/workspace'), toolCallId } },
    ({ path: p, toolCallId: tc }) =>
      tool(async () => {
        const entries = await sandbox().files.list(p, { toolCallId: tc });
        return { path: p, entries: [...entries], observationId: entries.observationId };
      }),
  );

  server.registerTool(
    'checkpoint',
    {
      description: "Checkpoint the sandbox's files and processes, with your context if you give it, so that you can roll back to this point.",
      inputSchema: {
        label: z.string().max(200).optional(),
        context: z.union([z.record(z.string(), z.unknown()), z.array(z.unknown())]).optional().describe(`Your context: {format: ${CONTEXT_FORMATS.join('|')}, ...}, or with contextFormat just the messages array`),
        contextFormat: z.enum(CONTEXT_FORMATS as [string, ...string[]]).optional(),
      },
    },
    ({ label, context, contextFormat }) =>
      tool(async () => {
        const ctx = context === undefined ? undefined : contextFromWire(context, contextFormat);
        return sandbox().checkpoint({ label, context: ctx });
      }),
  );

  server.registerTool(
    'rollback',
    {
      description:
        'Roll the sandbox back to a checkpoint. Returns the rollback report: the context stored at the checkpoint, the observations that went stale, ' +
        'the effects after the checkpoint that the rollback cannot undo, and a recovery summary to continue from.',
      inputSchema: {
        checkpointId: z.string().min(1),
        policy: z.enum(['warn', 'refuse']).optional().describe('"refuse": do not roll back if irreversible effects happened since'),
        failure: z.string().max(4000).optional().describe('Why the abandoned attempt failed'),
        lessons: z.array(z.string().max(2000)).max(100).optional().describe('What you learnt that stays true'),
      },
    },
    ({ checkpointId, policy, failure, lessons }) => tool(async () => rollbackToWire(await sandbox().rollback(checkpointId, { policy, failure, lessons }), true)),
  );

  server.registerTool(
    'fork',
    {
      description: 'Start independent sandboxes from a checkpoint; returns their ids.',
      inputSchema: { checkpointId: z.string().min(1), count: z.number().int().min(1).max(MAX_FORKS).optional() },
    },
    ({ checkpointId, count }) =>
      tool(async () => {
        const results = await sandbox().fork(checkpointId, { count });
        const ids = results.flatMap((r) => (r.ok ? [r.id] : []));
        opts.onFork?.(ids);
        return { ids, errors: results.flatMap((r) => (r.ok ? [] : [r.error])) };
      }),
  );

  server.registerTool(
    'record_effect',
    {
      description:
        'Record a side effect outside the sandbox (a payment, an e-mail, an API call) with its output, under an idempotency key. ' +
        'Recording the same key again (a retry, after a rollback, or in a fork) records nothing new and returns the output recorded the first time ' +
        'with replayed: true: then do not perform the effect again.',
      inputSchema: {
        kind: z.string().min(1).max(200).describe('What kind of effect, e.g. "email.send"'),
        input: z.any().describe('What the effect was asked to do (JSON)'),
        key: z.string().min(1).max(200).describe('Idempotency key: the same key means the same effect'),
        output: z.any().optional().describe('What the effect returned (JSON)'),
        reversibility: z.enum(['sandbox-local', 'compensable', 'irreversible']).optional().describe('Default irreversible'),
        compensation: z.object({ kind: z.string().min(1), input: z.any() }).optional().describe('For compensable effects: the action that takes it back'),
      },
    },
    ({ kind, input, key, output, reversibility, compensation }) =>
      tool(() => {
        const effects = sandbox().effects;
        const b = effects.begin({
          kind,
          input: (input ?? null) as JsonValue,
          key,
          reversibility: reversibility ?? 'irreversible',
          ...(compensation ? { compensation: { kind: compensation.kind, input: (compensation.input ?? null) as JsonValue } } : {}),
        });
        if (b.replayed) return { replayed: true, effectId: b.effectId, output: b.output ?? null };
        effects.commit(b.effectId, output as JsonValue | undefined);
        return { replayed: false, effectId: b.effectId, status: 'committed' };
      }),
  );

  server.registerTool('list_checkpoints', { description: "The sandbox's checkpoints, oldest first.", inputSchema: {} }, () => tool(() => sandbox().checkpoints()));

  return server;
}
