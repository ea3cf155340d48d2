/**
 * Routes: named snapshots (create, list, get, delete, context, start
 * sandboxes), their bundles (a streamed GET with Range, a streamed import)
 * and pulls from another server. Another tenant's snapshot answers exactly
 * like a missing one (404 SNAPSHOT_NOT_FOUND).
 */
import type { FastifyInstance } from 'fastify';
import { Readable } from 'node:stream';
import type { ApiContext } from '../context.js';
import { HttpError } from '../errors.js';
import { contextToWire } from '../../api/wire.js';
import { forkResultsToWire } from '../fork-results.js';
import * as S from '../schemas.js';

interface SnapParams {
  snap: string;
}

/** Drops the first `n` bytes of a stream (a resumed download's Range). */
async function* skip(stream: Readable, n: number): AsyncGenerator<Buffer> {
  let left = n;
  for await (const c of stream) {
    const chunk = c as Buffer;
    if (left >= chunk.length) {
      left -= chunk.length;
      continue;
    }
    yield left > 0 ? chunk.subarray(left) : chunk;
    left = 0;
  }
}

/** `bytes=N-` (the one form a resumed download sends); anything else is served whole. */
function rangeStart(header: string | undefined): number | null {
  const m = header ? /^bytes=(\d{1,15})-$/.exec(header.trim()) : null;
  return m ? Number(m[1]) : null;
}

export function snapshotRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['snapshots'];
  const ls = ctx.lockstep;

  app.post<{ Body: { checkpointId: string; name?: string; metadata?: Record<string, string> } }>(
    '/snapshots',
    {
      schema: {
        tags,
        operationId: 'createSnapshot',
        'x-lockstep-doc': { input: '`{checkpointId, name, metadata}`', success: '201 snapshot' },
        summary: 'Promote a checkpoint to a named snapshot that outlives its sandbox',
        body: S.snapshotBody,
        response: { 201: S.snapshotInfo, ...S.errors(409) },
      },
    },
    async (req, reply) => {
      const { checkpointId, name, metadata } = req.body;
      const info = await ls.snapshots.create(checkpointId, { name, metadata, tenant: ctx.tenant(req).id });
      req.log.info({ snapshotId: info.id, checkpointId }, 'snapshot created');
      return reply.code(201).send(info);
    },
  );

  app.get(
    '/snapshots',
    {
      schema: {
        tags,
        operationId: 'listSnapshots',
        'x-lockstep-doc': { success: '200 snapshots' },
        summary: "The tenant's snapshots, oldest first",
        response: { 200: S.arrayOf(S.snapshotInfo, 'Snapshots'), ...S.errors() },
      },
    },
    async (req) => ls.snapshots.list({ tenant: ctx.tenant(req).id }),
  );

  app.get<{ Params: SnapParams }>(
    '/snapshots/:snap',
    {
      schema: {
        tags,
        operationId: 'getSnapshot',
        'x-lockstep-doc': { input: '(id or name)', success: '200 snapshot' },
        summary: 'Get a snapshot (by id or name)',
        params: S.snapshotParams,
        response: { 200: S.snapshotInfo, ...S.errors() },
      },
    },
    async (req) => ls.snapshots.get(req.params.snap, { tenant: ctx.tenant(req).id }),
  );

  app.delete<{ Params: SnapParams }>(
    '/snapshots/:snap',
    {
      schema: {
        tags,
        operationId: 'deleteSnapshot',
        'x-lockstep-doc': { success: '200 `{id, deleted}`' },
        summary: 'Delete a snapshot (its files go once no checkpoint or other snapshot holds them)',
        params: S.snapshotParams,
        response: { 200: S.done('id', 'deleted'), ...S.errors(409) },
      },
    },
    async (req) => {
      const tenant = ctx.tenant(req).id;
      const { id } = ls.snapshots.get(req.params.snap, { tenant });
      await ls.snapshots.delete(id, { tenant });
      return { id, deleted: true };
    },
  );

  app.get<{ Params: SnapParams }>(
    '/snapshots/:snap/context',
    {
      schema: {
        tags,
        operationId: 'getSnapshotContext',
        'x-lockstep-doc': { success: '200 `{snapshotId, context}`' },
        summary: 'The context stored with a snapshot (null if none)',
        params: S.snapshotParams,
        response: { 200: S.snapshotContext, ...S.errors() },
      },
    },
    async (req) => {
      const tenant = ctx.tenant(req).id;
      const { id } = ls.snapshots.get(req.params.snap, { tenant });
      return { snapshotId: id, context: contextToWire(ls.snapshots.context(id, { tenant })) };
    },
  );

  app.post<{ Params: SnapParams; Body: { count?: number } }>(
    '/snapshots/:snap/sandboxes',
    {
      schema: {
        tags,
        operationId: 'startSnapshotSandboxes',
        'x-lockstep-doc': { input: '`{count}`', success: '200 `{results, ids, errors}` (see "Fork results")' },
        summary: 'Start sandboxes from a snapshot (its processes, files and lineage resume)',
        params: S.snapshotParams,
        body: S.snapshotStartBody,
        response: { 200: S.forkResult, ...S.errors(409, 429) },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req);
      const count = req.body.count ?? 1;
      const snap = ls.snapshots.get(req.params.snap, { tenant: tenant.id });
      // The verb checks the tenant's quotas for all the starts (QUOTA_EXCEEDED, 429, none made).
      const results = await ctx.operation('fork', reply, (signal) =>
        ls.snapshots.start(snap.id, { count, tenant: tenant.id, signal }),
      );
      const answer = forkResultsToWire(results);
      if (answer.errors.length)
        req.log.warn({ errors: results.flatMap((r) => (r.ok ? [] : [r.error])) }, 'starts failed');
      req.log.info({ snapshotId: snap.id, sandboxes: answer.ids }, 'started from a snapshot');
      return answer;
    },
  );

  app.get<{ Params: SnapParams }>(
    '/snapshots/:snap/bundle',
    {
      schema: {
        tags,
        operationId: 'exportSnapshot',
        'x-lockstep-doc': {
          input: '`Range: bytes=N-`, `If-Range`',
          success: '200 the bundle (streamed, `ETag`: its digest when known), 206 from N, 416 past its end',
        },
        summary:
          'Export the snapshot as one bundle stream (application/octet-stream). `Range: bytes=N-` resumes a download (206; `If-Range` with the ETag, the bundle digest)',
        params: S.snapshotParams,
        response: {
          200: { description: 'The bundle', content: { 'application/octet-stream': { schema: {} } } },
          206: {
            description: 'The bundle from the requested offset',
            content: { 'application/octet-stream': { schema: {} } },
          },
          ...S.errors(409, 416),
        },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req).id;
      const { id } = ls.snapshots.get(req.params.snap, { tenant });
      let start = rangeStart(req.headers.range);
      let etag: string | undefined;
      let total: number | undefined;
      if (start !== null) {
        // Content-Range names the total: the digest and length are computed once if not known yet.
        const known = await ls.snapshots.bundleIdentity(id, { tenant });
        etag = `"${known.digest}"`;
        total = known.bytes;
        const ifRange = req.headers['if-range'];
        if (typeof ifRange === 'string' && ifRange !== etag) start = null;
        else if (start >= total) {
          return reply
            .code(416)
            .header('content-range', `bytes */${total}`)
            .send({
              error: { code: 'BAD_REQUEST', message: `The bundle has ${total} bytes; nothing starts at ${start}` },
            });
        }
      } else {
        const row = ls.snapshots.get(id, { tenant });
        if (row.digest) etag = `"${row.digest}"`;
      }
      const { stream } = await ls.snapshots.openExport(id, { tenant });
      void reply.type('application/octet-stream').header('accept-ranges', 'bytes');
      if (etag) void reply.header('etag', etag);
      req.log.info({ snapshotId: id, from: start ?? 0 }, 'snapshot export');
      if (start !== null && start > 0)
        return reply
          .code(206)
          .header('content-range', `bytes ${start}-${total! - 1}/${total}`)
          .send(Readable.from(skip(stream, start), { objectMode: false }));
      return reply.send(stream);
    },
  );

  void app.register(async (raw) => {
    // The bundle stays a stream: the import reads it as it arrives (no body limit: bundles are large).
    raw.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
    raw.post<{ Querystring: { name?: string } }>(
      '/snapshots/import',
      {
        schema: {
          tags,
          operationId: 'importSnapshot',
          'x-lockstep-doc': {
            input: '`?name=`; the bundle, `application/octet-stream` (streamed)',
            success:
              '201 snapshot (`BUNDLE_CORRUPT`, `IMAGE_NOT_FOUND`, 422 `SNAPSHOT_INCOMPATIBLE`, 422 `BUNDLE_UNTRUSTED`, 429 `QUOTA_EXCEEDED`)',
          },
          summary:
            'Import a snapshot bundle (application/octet-stream, streamed); nothing is kept unless all of it verifies',
          querystring: S.importQuery,
          response: { 201: S.snapshotInfo, ...S.errors(409, 415, 422) },
        },
      },
      async (req, reply) => {
        const body = req.body as Readable | undefined;
        if (!body || typeof body.pipe !== 'function')
          throw new HttpError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Send the bundle as application/octet-stream', {
            field: 'Content-Type',
          });
        const info = await ctx.operation('snapshot-import', reply, (signal) =>
          ls.snapshots.import(body, { tenant: ctx.tenant(req).id, name: req.query.name, signal }),
        );
        req.log.info({ snapshotId: info.id, digest: info.digest }, 'snapshot imported');
        return reply.code(201).send(info);
      },
    );
  });

  app.post<{ Body: { from: string; snapshot: string; token: string; name?: string } }>(
    '/snapshots/pull',
    {
      schema: {
        tags,
        operationId: 'pullSnapshot',
        'x-lockstep-doc': {
          input:
            '`{from, snapshot, token, name}` (`from` one of `LOCKSTEP_PULL_SOURCES`, else 403 `PULL_SOURCE_NOT_ALLOWED`)',
          success: '201 `{snapshot, bundleBytes, receivedBytes, resumed, restarted, downloadMs, importMs}`',
        },
        summary:
          'Pull a snapshot from another Lockstep server (one of LOCKSTEP_PULL_SOURCES) with a token of the tenant there; an interrupted download resumes',
        body: S.pullBody,
        response: {
          201: S.pullReport,
          ...S.errors(403, 409, 422),
        },
      },
    },
    async (req, reply) => {
      const { from, snapshot, token, name } = req.body;
      let origin: string;
      try {
        origin = new URL(from).origin;
      } catch {
        origin = '';
      }
      // The server fetches what the request names: only from where its operator allows.
      if (!ls.snapshots.pullAllowed(origin))
        throw new HttpError(
          403,
          'PULL_SOURCE_NOT_ALLOWED',
          `This server pulls snapshots only from the origins in LOCKSTEP_PULL_SOURCES; ${JSON.stringify(origin || from)} is not one of them`,
          { field: 'from' },
        );
      const result = await ctx.operation('snapshot-pull', reply, (signal) =>
        ls.snapshots.pull({ from, snapshot, token, name, tenant: ctx.tenant(req).id, signal }),
      );
      req.log.info({ snapshotId: result.snapshot.id, from: origin, resumed: result.resumed }, 'snapshot pulled');
      return reply.code(201).send(result);
    },
  );
}
