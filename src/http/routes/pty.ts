/**
 * Routes: PTYs (sandbox-pty.ts) and the stdin of background commands.
 *
 * Input is raw bytes (application/octet-stream, up to the pending-input
 * bound); output is the transcript read by byte offsets, as JSON (`data` in
 * base64: a terminal writes bytes, not always UTF-8) or as a stream of NDJSON
 * lines until the PTY ends:
 *   {"type":"data","data":"<base64>","offset":N}   N: where the next byte is
 *   {"type":"rewound"}                              a rollback cut the transcript back; data restarts at 0
 *   {"type":"exit","exitCode":N|null,"reason":"exited"|"killed"|"rolled-back"}
 *   {"type":"error","error":{code,message}}
 * A streaming GET plus POSTs, so that a client needs nothing but HTTP/1.1
 * (the Python client uses only the standard library).
 */
import { PassThrough } from 'node:stream';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ApiContext } from '../context.js';
import { toErrorResponse } from '../errors.js';
import { InvalidArgumentError } from '../../errors.js';
import { MAX_PENDING_INPUT_BYTES } from '../../instances/relay.js';
import type { PtyHandle } from '../../api/sandbox-pty.js';
import { renameField } from '../../api/wire.js';
import * as S from '../schemas.js';

/** The raw body of an input route; an empty POST is no bytes. */
function inputBody(req: FastifyRequest): Buffer {
  const body = req.body as unknown;
  if (Buffer.isBuffer(body)) return body;
  if (body && typeof body === 'object' && Object.keys(body).length === 0) return Buffer.alloc(0);
  throw new InvalidArgumentError('body', 'the input bytes as application/octet-stream', body);
}

const rawBody = {
  content: { 'application/octet-stream': { schema: { description: 'The bytes, as they are to be read' } } },
};

/** Registers the routes; `raw` is a scope whose application/octet-stream bodies arrive as one Buffer. */
export function ptyRoutes(raw: FastifyInstance, ctx: ApiContext): void {
  raw.addContentTypeParser(
    'application/octet-stream',
    { parseAs: 'buffer', bodyLimit: MAX_PENDING_INPUT_BYTES },
    (_req, body, done) => done(null, body),
  );
  const tags = ['pty'];
  const pty = (req: FastifyRequest<{ Params: { id: string; pid: string } }>): Promise<PtyHandle> =>
    ctx.sandbox(req).pty.connect(Number(req.params.pid));

  raw.post<{ Params: { id: string; pid: string } }>(
    '/sandboxes/:id/commands/:pid/stdin',
    {
      schema: {
        tags: ['commands'],
        operationId: 'sendCommandStdin',
        'x-lockstep-doc': {
          input: 'raw bytes (`application/octet-stream`, up to 1 MiB)',
          success: '200 `{pid, bytes}` (background command started with `stdin: true`)',
        },
        summary: 'Write bytes to the stdin of a background command started with stdin: true',
        params: S.pidParams,
        response: { 200: S.pidBytes, ...S.errors(409, 413) },
      },
    },
    async (req) => {
      const bytes = inputBody(req);
      const handle = await ctx.sandbox(req).commands.connect(Number(req.params.pid));
      await handle.sendStdin(bytes);
      return { pid: handle.pid, bytes: bytes.length };
    },
  );

  raw.post<{ Params: { id: string; pid: string } }>(
    '/sandboxes/:id/commands/:pid/stdin/close',
    {
      schema: {
        tags: ['commands'],
        operationId: 'closeCommandStdin',
        'x-lockstep-doc': { success: '200 `{pid}`' },
        summary: 'Close the stdin of a background command (it reads EOF after the bytes sent before)',
        params: S.pidParams,
        response: { 200: S.pidOnly, ...S.errors(409) },
      },
    },
    async (req) => {
      const handle = await ctx.sandbox(req).commands.connect(Number(req.params.pid));
      await handle.closeStdin();
      return { pid: handle.pid };
    },
  );

  raw.post<{
    Params: { id: string };
    Body: { cols: number; rows: number; cmd?: string | string[]; cwd?: string; envs?: Record<string, string> };
  }>(
    '/sandboxes/:id/pty',
    {
      schema: {
        tags,
        operationId: 'createPty',
        'x-lockstep-doc': { input: '`{cols, rows, cmd, cwd, envs}`', success: '200 `{pid}` (see "PTYs")' },
        summary: 'Start a program on a new terminal of the sandbox (default /bin/sh -i); its id is the pid',
        params: S.sandboxParams,
        body: S.ptyCreateBody,
        response: { 200: S.pidOnly, ...S.errors(409) },
      },
    },
    async (req) => {
      const { cols, rows, cmd, cwd, envs } = req.body;
      const handle = await ctx
        .sandbox(req)
        .pty.create({ cols, rows, cmd, cwd, envs })
        .catch((e) => Promise.reject(renameField(e, { command: 'cmd', env: 'envs' })));
      return { pid: handle.pid };
    },
  );

  raw.get(
    '/sandboxes/:id/pty',
    {
      schema: {
        tags,
        operationId: 'listPtys',
        'x-lockstep-doc': { success: '200 `[{pid, running, exitCode}]`' },
        summary: 'PTYs of the sandbox: pid, running, exitCode',
        params: S.sandboxParams,
        response: { 200: S.arrayOf(S.processState, 'PTYs, by pid'), ...S.errors(409) },
      },
    },
    async (req) => ctx.sandbox(req).pty.list(),
  );

  raw.get<{ Params: { id: string; pid: string }; Querystring: { offset?: string } }>(
    '/sandboxes/:id/pty/:pid/output',
    {
      schema: {
        tags,
        operationId: 'getPtyOutput',
        'x-lockstep-doc': { input: '`?offset=`', success: '200 `{pid, data (base64), offset, rewound, running}`' },
        summary: 'Terminal output since a byte offset: {pid, data (base64), offset, rewound, running}',
        params: S.pidParams,
        querystring: S.offsetQuery,
        response: { 200: S.ptyOutput, ...S.errors(409) },
      },
    },
    async (req) => {
      const handle = await pty(req);
      const r = await handle.output(Number(req.query.offset ?? 0));
      return {
        pid: handle.pid,
        data: r.data.toString('base64'),
        offset: r.offset,
        rewound: r.rewound,
        running: r.running,
      };
    },
  );

  raw.get<{ Params: { id: string; pid: string }; Querystring: { offset?: string } }>(
    '/sandboxes/:id/pty/:pid/stream',
    {
      schema: {
        tags,
        operationId: 'streamPtyOutput',
        'x-lockstep-doc': { input: '`?offset=`', success: '200 NDJSON until the PTY ends' },
        summary: 'Terminal output from a byte offset as NDJSON lines, until the PTY ends (see docs/http-reference.md)',
        params: S.pidParams,
        querystring: S.offsetQuery,
        response: {
          200: {
            description: 'NDJSON lines (data, rewound, exit, error) until the PTY ends',
            content: { 'application/x-ndjson': { schema: {} } },
          },
          ...S.errors(409),
        },
      },
    },
    async (req, reply) => {
      const handle = await pty(req);
      // Admitted before the answer starts (a refusal is a plain 429); given back when the stream ends.
      const release = ctx.admission.streams.enter(ctx.tenant(req).id);
      const body = new PassThrough();
      const line = (o: Record<string, unknown>) => {
        if (!body.writableEnded) body.write(JSON.stringify(o) + '\n');
      };
      const stop = new AbortController();
      reply.raw.on('close', () => stop.abort());
      void reply
        .code(200)
        .header('content-type', 'application/x-ndjson; charset=utf-8')
        .header('cache-control', 'no-cache')
        .header('x-accel-buffering', 'no')
        .send(body);
      let offset = Number(req.query.offset ?? 0);
      handle
        .follow(
          (data) => {
            offset += data.length;
            line({ type: 'data', data: Buffer.from(data).toString('base64'), offset });
          },
          { from: offset, signal: stop.signal, onRewound: () => ((offset = 0), line({ type: 'rewound' })) },
        )
        .then((exit) => line({ type: 'exit', ...exit }))
        .catch((e) => {
          if (stop.signal.aborted) return;
          const { body: err, internal } = toErrorResponse(e);
          if (internal) req.log.error({ err: e }, 'pty stream failed');
          line({ type: 'error', ...(err as unknown as Record<string, unknown>) });
        })
        .finally(() => {
          release();
          body.end();
        });
      return reply;
    },
  );

  raw.post<{ Params: { id: string; pid: string } }>(
    '/sandboxes/:id/pty/:pid/input',
    {
      schema: {
        tags,
        operationId: 'writePtyInput',
        'x-lockstep-doc': {
          input: 'raw bytes (`application/octet-stream`, up to 1 MiB)',
          success: '200 `{pid, bytes}`',
        },
        summary: 'Type bytes on the terminal (application/octet-stream)',
        params: S.pidParams,
        body: rawBody,
        response: { 200: S.pidBytes, ...S.errors(409, 413) },
      },
    },
    async (req) => {
      const bytes = inputBody(req);
      const handle = await pty(req);
      await handle.write(bytes);
      return { pid: handle.pid, bytes: bytes.length };
    },
  );

  raw.post<{ Params: { id: string; pid: string }; Body: { cols: number; rows: number } }>(
    '/sandboxes/:id/pty/:pid/resize',
    {
      schema: {
        tags,
        operationId: 'resizePty',
        'x-lockstep-doc': { input: '`{cols, rows}`', success: '200 `{pid, cols, rows}`' },
        summary: 'Set the terminal size (the program gets SIGWINCH)',
        params: S.pidParams,
        body: S.ptyResizeBody,
        response: { 200: S.ptySize, ...S.errors(409) },
      },
    },
    async (req) => {
      const handle = await pty(req);
      await handle.resize(req.body.cols, req.body.rows);
      return { pid: handle.pid, cols: req.body.cols, rows: req.body.rows };
    },
  );

  raw.post<{ Params: { id: string; pid: string }; Body: { timeoutMs?: number } }>(
    '/sandboxes/:id/pty/:pid/wait',
    {
      schema: {
        tags,
        operationId: 'waitPty',
        'x-lockstep-doc': { input: '`{timeoutMs}`', success: '200 `{pid, exitCode, reason}`' },
        summary: 'Wait for a PTY to end: {pid, exitCode, reason}',
        params: S.pidParams,
        body: S.waitBody,
        response: { 200: S.ptyExit, ...S.errors(504) },
      },
    },
    async (req, reply) => {
      const handle = await pty(req);
      const r = await ctx.admission.waits.run(ctx.tenant(req).id, () =>
        ctx.operation(
          'wait',
          reply,
          (signal) =>
            handle.wait({ signal, ...(req.body.timeoutMs !== undefined ? { timeoutMs: req.body.timeoutMs } : {}) }),
          { abortOnDisconnect: true },
        ),
      );
      return { pid: handle.pid, ...r };
    },
  );

  raw.post<{ Params: { id: string; pid: string } }>(
    '/sandboxes/:id/pty/:pid/kill',
    {
      schema: {
        tags,
        operationId: 'killPty',
        'x-lockstep-doc': { success: '200 `{pid, killed}`' },
        summary: 'Kill a PTY (its relay and the program on it)',
        params: S.pidParams,
        response: { 200: S.pidKilled, ...S.errors() },
      },
    },
    async (req) => {
      const handle = await pty(req);
      return { pid: handle.pid, killed: await handle.kill() };
    },
  );
}
