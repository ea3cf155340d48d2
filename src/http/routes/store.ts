/**
 * Routes: the snapshot store, for a tenant. A push exports one of its
 * snapshots into its own part of the store (`tenants/<tn_…>/`, see
 * src/snapshots/transfer.ts); a pull imports a bundle from that part as a
 * new snapshot; it can list and remove its bundles. Only the store the
 * operator configured (LOCKSTEP_SNAPSHOT_STORE) is used: a request never
 * names a store, a URL or a path, and a key is one segment, so no tenant
 * reaches another's bundles (a key it lacks is 404 BUNDLE_NOT_FOUND, whoever
 * else has one of that name).
 */
import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';

export function storeRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['snapshot store'];
  const ls = ctx.lockstep;

  app.post<{ Params: { snap: string }; Body: { key?: string } }>(
    '/snapshots/:snap/push',
    {
      schema: {
        tags,
        operationId: 'pushSnapshot',
        'x-lockstep-doc': {
          input: '`{key}` (default: its name, else its id; one segment)',
          success:
            "201 `{key, snapshotId, digest, bytes, chunks, uploadedChunks, skippedChunks, ms}` into the tenant's part of the snapshot store (501 `STORE_NOT_CONFIGURED`, 503 `STORE_UNAVAILABLE`)",
        },
        summary:
          "Export the snapshot into the tenant's part of the snapshot store under `key` (default: its name, else its id); chunks the store has are not sent again",
        params: S.snapshotParams,
        body: S.pushBody,
        response: {
          201: S.pushReport,
          ...S.errors(409, 501, 503),
        },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req).id;
      const { id } = ls.snapshots.get(req.params.snap, { tenant });
      const r = await ctx.operation('snapshot-push', reply, (signal) =>
        ls.snapshots.push(id, { tenant, key: req.body?.key, signal }),
      );
      req.log.info({ snapshotId: id, key: r.key, uploadedChunks: r.uploadedChunks }, 'snapshot pushed');
      return reply.code(201).send(r);
    },
  );

  app.get(
    '/store/bundles',
    {
      schema: {
        tags,
        operationId: 'listStoredBundles',
        'x-lockstep-doc': {
          success: "200 `[{name, digest, bytes, chunks, chunkBytes, createdAt}]`: the tenant's bundles in the store",
        },
        summary: "The bundles in the tenant's part of the snapshot store",
        response: { 200: S.arrayOf(S.storedBundle, 'Bundles'), ...S.errors(501, 503) },
      },
    },
    async (req) => ls.snapshots.listStored({ tenant: ctx.tenant(req).id }),
  );

  app.post<{ Params: { key: string }; Body: { name?: string } }>(
    '/store/bundles/:key/pull',
    {
      schema: {
        tags,
        operationId: 'pullStoredBundle',
        'x-lockstep-doc': {
          input: '`{name}`',
          success:
            '201 `{key, snapshot, bytes, ms}` (404 `BUNDLE_NOT_FOUND`, `BUNDLE_CORRUPT`, 422 `BUNDLE_UNTRUSTED`, 429 `QUOTA_EXCEEDED`)',
        },
        summary:
          "Import the bundle stored under `key` in the tenant's part of the store as a new snapshot (verified, signed by a trusted host, within the tenant's quota)",
        params: S.storeKeyParams,
        body: S.storePullBody,
        response: {
          201: S.storePullReport,
          ...S.errors(409, 422, 429, 501, 503),
        },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req).id;
      const r = await ctx.operation('snapshot-store-pull', reply, (signal) =>
        ls.snapshots.pull(req.params.key, { tenant, name: req.body?.name, signal }),
      );
      req.log.info({ snapshotId: r.snapshot.id, key: r.key }, 'snapshot pulled from the store');
      return reply.code(201).send(r);
    },
  );

  app.delete<{ Params: { key: string } }>(
    '/store/bundles/:key',
    {
      schema: {
        tags,
        operationId: 'deleteStoredBundle',
        'x-lockstep-doc': { success: '200 `{key, deleted}` (its chunks go at the next `lockstep store gc`)' },
        summary: "Remove a bundle from the tenant's part of the store",
        params: S.storeKeyParams,
        response: { 200: S.done('key', 'deleted'), ...S.errors(501, 503) },
      },
    },
    async (req) => {
      await ls.snapshots.deleteStored(req.params.key, { tenant: ctx.tenant(req).id });
      return { key: req.params.key, deleted: true };
    },
  );
}
