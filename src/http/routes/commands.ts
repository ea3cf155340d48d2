/**
 * Routes: run a command (JSON, or streamed as NDJSON or server-sent events),
 * and wait for or kill a background one.
 *
 * Streams: one event per stdout/stderr chunk as it arrives, then one
 * "result" event (exitCode, signal, truncated, durationMs, observationId),
 * or one "error" event ({error: {code, message, field?}}) if the command
 * could not run after the stream had started. NDJSON lines are
 * `{"type": "stdout"|"stderr"|"result"|"error", ...}`; SSE events carry the
 * same JSON as data, with the type as the event name.
 */
import { PassThrough } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ObservedRunResult } from '../../api/sandbox-commands.js';
import type { ApiContext } from '../context.js';
import { toErrorResponse } from '../errors.js';
import { renameField } from '../../api/wire.js';
import * as S from '../schemas.js';

interface RunBody {
  cmd: string | string[];
  cwd?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  toolCallId?: string;
  background?: boolean;
  stdin?: boolean;
}

type StreamMode = 'ndjson' | 'sse';

const WIRE_NAMES = { command: 'cmd', env: 'envs' };

function streamMode(req: FastifyRequest): StreamMode | undefined {
  const accept = req.headers.accept ?? '';
  if (accept.includes('application/x-ndjson')) return 'ndjson';
  if (accept.includes('text/event-stream')) return 'sse';
  return undefined;
}

/** Writes typed events in one of the two stream formats. */
class EventStream {
  readonly body = new PassThrough();
  constructor(private readonly mode: StreamMode) {}
  event(type: string, data: Record<string, unknown>): void {
    if (this.body.writableEnded) return;
    if (this.mode === 'ndjson') this.body.write(JSON.stringify({ type, ...data }) + '\n');
    else this.body.write(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`);
  }
  end(): void {
    this.body.end();
  }
}

function startStream(reply: FastifyReply, mode: StreamMode): EventStream {
  const s = new EventStream(mode);
  void reply
    .code(200)
    .header(
      'content-type',
      mode === 'ndjson' ? 'application/x-ndjson; charset=utf-8' : 'text/event-stream; charset=utf-8',
    )
    .header('cache-control', 'no-cache')
    .header('x-accel-buffering', 'no')
    .send(s.body);
  return s;
}

/** The final event of a stream: the result without the output already streamed. */
function resultEvent(r: ObservedRunResult): Record<string, unknown> {
  const { stdout: _o, stderr: _e, ...rest } = r;
  return rest;
}

export function commandRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['commands'];
  const { waits, commands } = ctx.admission;

  app.post<{ Params: { id: string }; Body: RunBody }>(
    '/sandboxes/:id/commands',
    {
      config: { replaysItself: true },
      schema: {
        tags,
        operationId: 'runCommand',
        'x-lockstep-doc': {
          input: '`{cmd, cwd, envs, timeoutMs, toolCallId, background, stdin}`',
          success: '200 result, a stream, or `{pid}`',
        },
        summary: 'Run a command (JSON, or streamed with Accept: application/x-ndjson or text/event-stream)',
        params: S.sandboxParams,
        body: S.runBody,
        response: { 200: S.runResult, ...S.errors(409, 413, 504) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const state = ctx.state(req);
      const mode = req.body.background ? undefined : streamMode(req);
      const { cmd, cwd, envs, timeoutMs, toolCallId } = req.body;

      if (state.replay) {
        if (!mode)
          return reply
            .code(state.replay.status)
            .type('application/json; charset=utf-8')
            .header('idempotent-replayed', 'true')
            .send(state.replay.body);
        const r = JSON.parse(state.replay.body) as ObservedRunResult;
        reply.header('idempotent-replayed', 'true');
        const s = startStream(reply, mode);
        if (r.stdout) s.event('stdout', { data: r.stdout });
        if (r.stderr) s.event('stderr', { data: r.stderr });
        s.event('result', resultEvent(r));
        s.end();
        return reply;
      }

      if (req.body.background) {
        const handle = await sb.commands
          .run(cmd, { cwd, envs, toolCallId, background: true, stdin: req.body.stdin })
          .catch((e) => Promise.reject(renameField(e, WIRE_NAMES)));
        return { pid: handle.pid };
      }

      const run = (signal: AbortSignal, onStdout?: (s: string) => void, onStderr?: (s: string) => void) =>
        sb.commands
          .run(cmd, { cwd, envs, timeoutMs, toolCallId, signal, onStdout, onStderr })
          .catch((e) => Promise.reject(renameField(e, WIRE_NAMES)));

      if (!mode)
        return commands.run(state.tenant.id, () =>
          ctx.operation('command', reply, (signal) => run(signal), { abortOnDisconnect: true }),
        );

      // Admitted before the stream starts, so that a refusal is a plain 429.
      const release = commands.enter(state.tenant.id);
      let s: EventStream;
      try {
        s = startStream(reply, mode);
      } catch (e) {
        release();
        throw e;
      }
      Promise.resolve()
        .then(() =>
          ctx.operation(
            'command',
            reply,
            (signal) =>
              run(
                signal,
                (d) => s.event('stdout', { data: d }),
                (d) => s.event('stderr', { data: d }),
              ),
            { abortOnDisconnect: true },
          ),
        )
        .then((r) => {
          const idem = state.idempotency;
          if (idem)
            ctx.idempotency.store(state.tenant.id, idem.key, idem.hash, {
              status: 200,
              body: JSON.stringify(r),
              streamed: true,
            });
          s.event('result', resultEvent(r));
        })
        .catch((e) => {
          const { body, internal } = toErrorResponse(e);
          if (internal) req.log.error({ err: e }, 'streamed command failed');
          s.event('error', body as unknown as Record<string, unknown>);
        })
        .finally(() => {
          if (state.idempotency) {
            state.idempotency.stored = true;
            ctx.idempotency.release(state.tenant.id, state.idempotency.key);
          }
          release();
          s.end();
        });
      return reply;
    },
  );

  app.post<{ Params: { id: string; pid: string }; Body: { timeoutMs?: number } }>(
    '/sandboxes/:id/commands/:pid/wait',
    {
      schema: {
        tags,
        operationId: 'waitCommand',
        'x-lockstep-doc': { input: '`{timeoutMs}`', success: '200 `{pid, exitCode}`' },
        summary: 'Wait for a background command; its exit code (null if killed before reporting one)',
        params: S.pidParams,
        body: S.waitBody,
        response: { 200: S.commandExit, ...S.errors(504) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const pid = Number(req.params.pid);
      const handle = sb.commands.byPid(pid);
      // The request's signal reaches the wait: a client that goes away (or a
      // shutdown) ends the pidfd watch and the timer, and frees the place.
      const r = await waits.run(ctx.tenant(req).id, () =>
        ctx.operation(
          'wait',
          reply,
          (signal) =>
            handle.wait({ signal, ...(req.body.timeoutMs !== undefined ? { timeoutMs: req.body.timeoutMs } : {}) }),
          { abortOnDisconnect: true },
        ),
      );
      return { pid, exitCode: r.exitCode };
    },
  );

  app.post<{ Params: { id: string; pid: string }; Body: { signal?: NodeJS.Signals } }>(
    '/sandboxes/:id/commands/:pid/kill',
    {
      schema: {
        tags,
        operationId: 'killCommand',
        'x-lockstep-doc': { input: '`{signal}`', success: '200 `{pid, killed}`' },
        summary: 'Send a signal (default SIGKILL) to a background command',
        params: S.pidParams,
        body: S.killBody,
        response: { 200: S.pidKilled, ...S.errors() },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      const pid = Number(req.params.pid);
      const killed = await sb.commands.byPid(pid).kill(req.body.signal ?? 'SIGKILL');
      return { pid, killed };
    },
  );
}
