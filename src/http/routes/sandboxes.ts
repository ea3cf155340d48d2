/** Routes: create, list, get and delete sandboxes; the caller's tenant. */
import type { FastifyInstance } from 'fastify';
import { LIMITS } from '../../sandboxes/create.js';
import { checkQuota, tenantUsage } from '../../tenants/quotas.js';
import { LockstepError } from '../../errors.js';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';
import type { NetworkMode } from '../../network/policy.js';

interface CreateBody {
  image?: string;
  memoryMb?: number;
  pids?: number;
  cpuWeight?: number;
  cpus?: number;
  ioWeight?: number;
  diskMb?: number;
  envs?: Record<string, string>;
  timeoutMs?: number;
  metadata?: Record<string, string>;
  network?: NetworkMode;
  allowOut?: string[];
  bandwidthMbit?: number;
}

export function sandboxRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['sandboxes'];

  app.post<{ Body: CreateBody }>(
    '/sandboxes',
    {
      schema: {
        tags,
        summary: 'Create a sandbox',
        body: S.createBody,
        response: { 201: S.sandboxInfo, ...S.errors(409, 413, 422, 429) },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req);
      const sb = await ctx.gate.run(tenant.id, async () => {
        checkQuota(ctx.db, tenant, {
          count: 1,
          memoryMb: req.body.memoryMb ?? LIMITS.memoryMb.default,
          cpuWeight: req.body.cpuWeight,
        });
        return ctx.lockstep.create({ ...req.body, tenant: tenant.id }).catch((e: unknown) => {
          // The image named in the body: say which input it was.
          if (e instanceof LockstepError && e.code === 'IMAGE_NOT_FOUND')
            (e.details as Record<string, unknown>).field = 'image';
          throw e;
        });
      });
      req.log = reply.log = req.log.child({ sandboxId: sb.id });
      req.log.info('sandbox created');
      return reply.code(201).send(ctx.present(req, sb.info()));
    },
  );

  app.get(
    '/sandboxes',
    {
      schema: {
        tags,
        summary: "List the tenant's sandboxes",
        response: { 200: S.arrayOf(S.sandboxInfo, 'Sandboxes, oldest first'), ...S.errors() },
      },
    },
    async (req) => {
      return ctx.lockstep.list(ctx.tenant(req).id).map((info) => ctx.present(req, info));
    },
  );

  app.get(
    '/sandboxes/:id',
    {
      schema: {
        tags,
        summary: 'Get a sandbox',
        params: S.sandboxParams,
        response: { 200: S.sandboxInfo, ...S.errors() },
      },
    },
    async (req) => {
      return ctx.present(req, ctx.sandbox(req).info());
    },
  );

  app.delete<{ Params: { id: string } }>(
    '/sandboxes/:id',
    {
      schema: {
        tags,
        summary: 'Remove a sandbox with its processes, files and checkpoints',
        params: S.sandboxParams,
        response: { 200: S.anyObject('{id, removed: true}'), ...S.errors(409) },
      },
    },
    async (req) => {
      const tenant = ctx.tenant(req);
      await ctx.lockstep.remove(req.params.id, tenant.id);
      return { id: req.params.id, removed: true };
    },
  );

  app.get(
    '/tenant',
    {
      schema: {
        tags: ['tenant'],
        summary: 'The calling tenant: its quotas and what it uses',
        response: {
          200: S.anyObject(
            '{id, name, maxSandboxes, maxMemoryMb, cpuWeight, maxCpuWeight, maxCheckpointMb, usage: {sandboxes, memoryMb, standbyMemoryMb, cpuWeight, checkpointMb}}',
          ),
          ...S.errors(),
        },
      },
    },
    async (req) => {
      const t = ctx.tenant(req);
      return { ...t, usage: tenantUsage(ctx.db, t.id) };
    },
  );
}
