/**
 * Routes: read, write, remove and list files. Paths are resolved by the
 * library beneath the sandbox root (openat2 RESOLVE_BENEATH), so ".." and
 * symlinks that lead outside answer 400 PATH_ESCAPES_SANDBOX.
 *
 * Only regular files are read or written: a FIFO, device, socket or symlink
 * leaf answers 400 FILE_TYPE_NOT_SUPPORTED (the manager never opens them).
 *
 * Reads answer JSON ({content, encoding, sha256, observationId}; files up to
 * the file limit, else 413 FILE_TOO_LARGE) or, with Accept:
 * application/octet-stream, the raw bytes: up to BUFFERED_READ_BYTES with the
 * hash and the observation id in X-Lockstep-Sha256 /
 * X-Lockstep-Observation-Id headers, larger files streamed in chunks with
 * the two as HTTP trailers. Writes take raw bytes (Content-Type:
 * application/octet-stream), streamed to the file as they arrive, or JSON
 * {content, encoding}; both up to the file limit (413 past it, the file
 * unchanged).
 */
import { TextDecoder } from 'node:util';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance } from 'fastify';
import { InvalidArgumentError, LockstepError } from '../../errors.js';
import { HttpError } from '../errors.js';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';

interface PathQuery {
  path: string;
  toolCallId?: string;
  encoding?: 'utf8' | 'base64';
}

interface ListQuery {
  path: string;
  toolCallId?: string;
  limit?: string;
  cursor?: string;
}

interface WriteJson {
  content: string;
  encoding?: 'utf8' | 'base64';
  mode?: number;
  toolCallId?: string;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Raw reads up to this size are buffered so the hash can go in a header; larger ones stream. */
export const BUFFERED_READ_BYTES = 1024 * 1024;

function tooLarge(): HttpError {
  return new HttpError(413, 'PAYLOAD_TOO_LARGE', 'The request body is larger than this route accepts', {
    field: 'body',
  });
}

function isUtf8(b: Buffer): boolean {
  try {
    utf8.decode(b);
    return true;
  } catch {
    return false;
  }
}

function isStream(b: unknown): b is IncomingMessage {
  return typeof b === 'object' && b !== null && typeof (b as IncomingMessage).pipe === 'function';
}

export function fileRoutes(app: FastifyInstance, ctx: ApiContext, opts: { fileBodyLimit: number }): void {
  const tags = ['files'];

  app.get<{ Params: { id: string }; Querystring: PathQuery }>(
    '/sandboxes/:id/files',
    {
      schema: {
        tags,
        operationId: 'readFile',
        'x-lockstep-doc': {
          input: '`?path=&encoding=&toolCallId=`',
          success: '200 `{path, content, encoding, sha256, bytes, observationId}` or raw bytes (see "Files")',
        },
        summary: 'Read a file (JSON, or raw bytes with Accept: application/octet-stream)',
        params: S.sandboxParams,
        querystring: S.readQuery,
        response: { 200: S.fileRead, ...S.errors() },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      if ((req.headers.accept ?? '').includes('application/octet-stream')) {
        const rs = await sb.files.readStream(req.query.path, { toolCallId: req.query.toolCallId });
        void reply.type('application/octet-stream');
        if (rs.size > BUFFERED_READ_BYTES) {
          // The hash is known only at the end: trailers (the body is chunked).
          void reply.trailer('x-lockstep-sha256', async () => (await rs.done).sha256);
          void reply.trailer('x-lockstep-observation-id', async () => (await rs.done).observationId ?? '');
          return reply.send(rs.stream);
        }
        const chunks: Buffer[] = [];
        for await (const c of rs.stream) chunks.push(c as Buffer);
        const done = await rs.done;
        return reply
          .header('x-lockstep-sha256', done.sha256)
          .header('x-lockstep-observation-id', done.observationId)
          .send(Buffer.concat(chunks));
      }
      // JSON holds the whole file in memory (twice, as base64): only up to the file limit.
      const r = await sb.files.read(req.query.path, { toolCallId: req.query.toolCallId, maxBytes: opts.fileBodyLimit });
      const encoding = req.query.encoding ?? (isUtf8(r.content) ? 'utf8' : 'base64');
      return {
        path: req.query.path,
        content: r.content.toString(encoding),
        encoding,
        sha256: r.sha256,
        bytes: r.content.length,
        observationId: r.observationId,
      };
    },
  );

  app.put<{ Params: { id: string }; Querystring: PathQuery; Body: WriteJson | IncomingMessage }>(
    '/sandboxes/:id/files',
    {
      bodyLimit: opts.fileBodyLimit,
      schema: {
        tags,
        operationId: 'writeFile',
        'x-lockstep-doc': {
          input: '`?path=&toolCallId=`; raw bytes (streamed) or `{content, encoding, mode, toolCallId}`',
          success: '200 `{path, sha256, bytes, observationId}`',
        },
        summary: 'Write a file (raw bytes, or JSON {content, encoding})',
        params: S.sandboxParams,
        querystring: S.pathQuery(),
        body: {
          content: {
            'application/json': { schema: S.writeJsonBody },
            'application/octet-stream': { schema: { description: 'The raw bytes of the file' } },
          },
        },
        response: { 200: S.fileWritten, ...S.errors(413, 415) },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      let data: Buffer;
      let mode: number | undefined;
      let toolCallId = req.query.toolCallId;
      if (isStream(req.body)) {
        // fastify enforces bodyLimit only on bodies it buffers: this one is
        // counted here (the declared length first, then the bytes as they come).
        if (Number(req.headers['content-length'] ?? 0) > opts.fileBodyLimit) throw tooLarge();
        try {
          const r = await sb.files.writeStream(req.query.path, req.body, { maxBytes: opts.fileBodyLimit, toolCallId });
          return { path: req.query.path, ...r };
        } catch (e) {
          if (e instanceof LockstepError && e.code === 'FILE_TOO_LARGE') throw tooLarge();
          throw e;
        }
      } else if (
        req.headers['content-type']?.split(';')[0]?.trim().toLowerCase() !== 'application/json' ||
        typeof req.body !== 'object'
      ) {
        // fastify parses text/plain too, but validates only the types the schema lists.
        throw new HttpError(
          415,
          'UNSUPPORTED_MEDIA_TYPE',
          'Send the file as application/octet-stream, or as JSON {content, encoding}',
          { field: 'Content-Type' },
        );
      } else {
        const b = req.body;
        if (b.encoding === 'base64' && !/^[A-Za-z0-9+/\r\n]*={0,2}\s*$/.test(b.content))
          throw new InvalidArgumentError('content', 'base64 text', b.content);
        data = Buffer.from(b.content, b.encoding ?? 'utf8');
        mode = b.mode;
        toolCallId = b.toolCallId ?? toolCallId;
      }
      const r = await sb.files.write(req.query.path, data, { ...(mode !== undefined ? { mode } : {}), toolCallId });
      return { path: req.query.path, ...r };
    },
  );

  app.delete<{ Params: { id: string }; Querystring: PathQuery }>(
    '/sandboxes/:id/files',
    {
      schema: {
        tags,
        operationId: 'removeFile',
        'x-lockstep-doc': { input: '`?path=&toolCallId=`', success: '200 `{path, removed}`' },
        summary: 'Remove a file, symlink or empty directory',
        params: S.sandboxParams,
        querystring: S.pathQuery(),
        response: { 200: S.done('path', 'removed'), ...S.errors() },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      await sb.files.remove(req.query.path, { toolCallId: req.query.toolCallId });
      return { path: req.query.path, removed: true };
    },
  );

  app.get<{ Params: { id: string }; Querystring: ListQuery }>(
    '/sandboxes/:id/files/list',
    {
      schema: {
        tags,
        operationId: 'listFiles',
        'x-lockstep-doc': {
          input: '`?path=&limit=&cursor=&toolCallId=`',
          success:
            '200 `{path, entries, nextCursor, observationId}`: one page, sorted by name (see "Files"; 429 `RATE_LIMITED`)',
        },
        summary: 'List a directory, one page at a time (sorted by name; nextCursor is null on the last page)',
        params: S.sandboxParams,
        querystring: S.listQuery,
        response: {
          200: S.dirPage,
          ...S.errors(429),
        },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      const { path, toolCallId, limit, cursor } = req.query;
      const page = await sb.files.listPage(path, {
        toolCallId,
        limit: limit === undefined ? undefined : Number(limit),
        cursor,
      });
      return { path, entries: page.entries, nextCursor: page.nextCursor, observationId: page.observationId };
    },
  );

  app.get<{ Params: { id: string }; Querystring: PathQuery }>(
    '/sandboxes/:id/files/exists',
    {
      schema: {
        tags,
        operationId: 'checkFileExists',
        'x-lockstep-doc': { input: '`?path=`', success: '200 `{path, exists}`' },
        summary: 'Whether a path exists (not recorded as an observation)',
        params: S.sandboxParams,
        querystring: S.existsQuery,
        response: { 200: S.fileExists, ...S.errors() },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      return { path: req.query.path, exists: await sb.files.exists(req.query.path) };
    },
  );
}
