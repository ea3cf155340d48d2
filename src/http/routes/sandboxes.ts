/** Routes: create, list, get and delete sandboxes; the caller's tenant. */
import type { FastifyInstance } from 'fastify';
import { InvalidStateError, LockstepError } from '../../errors.js';
import type { Lockstep } from '../../api/lockstep.js';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';
import type { NetworkMode } from '../../host/network/policy.js';

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
  fromSnapshot?: string;
  network?: NetworkMode;
  allowOut?: string[];
  bandwidthMbit?: number;
}

/** Seconds a client is told to wait before retrying a create whose image is still being made. */
const IMAGE_RETRY_AFTER_S = 30;

/**
 * Waits up to waitMs for an image made on first use (a shipped recipe not
 * yet in the state directory: built, or linked from the build cache). A
 * build that takes longer goes on in the background, and the request
 * answers 503 IMAGE_BUILDING with Retry-After, rather than hold the client
 * past its own timeout. Errors of the build (IMAGE_NOT_FOUND for a name
 * that is no recipe, IMAGE_BUILD_FAILED) are the request's.
 */
async function imageMadeInTime(
  ls: Lockstep,
  name: string,
  waitMs: number,
  retryAfter: (seconds: number) => void,
): Promise<void> {
  if (typeof name !== 'string' || ls.images.has(name)) return;
  let last = '';
  const made = ls.images.forCreate(name, (line) => (last = line));
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), waitMs)));
  try {
    if ((await Promise.race([made, late])) !== 'late') return;
  } finally {
    clearTimeout(timer);
  }
  made.catch(() => undefined); // a later create reports a failed build
  retryAfter(IMAGE_RETRY_AFTER_S);
  throw new InvalidStateError(
    'IMAGE_BUILDING',
    `Image ${name} is being made on first use (${last || 'starting'}); retry the create in ${IMAGE_RETRY_AFTER_S} s`,
    { field: 'image', image: name, retryAfterSeconds: IMAGE_RETRY_AFTER_S, progress: last },
  );
}

/** IMAGE_NOT_FOUND is about the image named in the body: say which input it was. */
function namingImage(e: unknown): never {
  if (e instanceof LockstepError && e.code === 'IMAGE_NOT_FOUND')
    (e.details as Record<string, unknown>).field = 'image';
  throw e;
}

export function sandboxRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['sandboxes'];

  app.post<{ Body: CreateBody }>(
    '/sandboxes',
    {
      schema: {
        tags,
        operationId: 'createSandbox',
        'x-lockstep-doc': {
          input:
            '`{image, memoryMb, pids, cpuWeight, cpus, ioWeight, diskMb, envs, network, allowOut, bandwidthMbit, timeoutMs, metadata}`, or `{fromSnapshot}` alone',
          success: '201 sandbox (503 `IMAGE_BUILDING` while a shipped recipe is made on first use)',
        },
        summary: 'Create a sandbox',
        body: S.createBody,
        response: { 201: S.sandboxInfo, ...S.errors(409, 413, 422, 429) },
      },
    },
    async (req, reply) => {
      const tenant = ctx.tenant(req);
      // A sandbox started from a snapshot takes its image from the snapshot (already here).
      if (req.body.fromSnapshot === undefined)
        await imageMadeInTime(ctx.lockstep, req.body.image ?? 'base', ctx.imageWaitMs, (s) =>
          reply.header('retry-after', String(s)),
        ).catch(namingImage);
      // The verb checks the tenant's quotas (QUOTA_EXCEEDED, 429).
      const sb = await ctx.lockstep.create({ ...req.body, tenant: tenant.id }).catch(namingImage);
      req.log = reply.log = req.log.child({ sandboxId: sb.id });
      req.log.info('sandbox created');
      return reply.code(201).send(ctx.present(req, sb.info()));
    },
  );

  app.get<{ Querystring: Record<string, string> }>(
    '/sandboxes',
    {
      schema: {
        tags,
        operationId: 'listSandboxes',
        'x-lockstep-doc': {
          input: '`?metadata.KEY=VALUE` (any number; a sandbox must have every label named)',
          success:
            '200 sandboxes, oldest first (400 `INVALID_ARGUMENT` naming a label asked for twice, a value past 1024 characters, an unknown parameter)',
        },
        summary: "List the tenant's sandboxes (`?metadata.KEY=VALUE`: those with every label named)",
        querystring: S.sandboxListQuery,
        response: { 200: S.arrayOf(S.sandboxInfo, 'Sandboxes, oldest first'), ...S.errors() },
      },
    },
    async (req) => {
      // The schema lets only metadata.KEY parameters through.
      const metadata = Object.fromEntries(Object.entries(req.query).map(([k, v]) => [k.slice('metadata.'.length), v]));
      return ctx.lockstep.list(ctx.tenant(req).id, { metadata }).map((info) => ctx.present(req, info));
    },
  );

  app.get(
    '/sandboxes/:id',
    {
      schema: {
        tags,
        operationId: 'getSandbox',
        'x-lockstep-doc': { success: '200 sandbox' },
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
        operationId: 'removeSandbox',
        'x-lockstep-doc': { success: '200 `{id, removed}`' },
        summary: 'Remove a sandbox with its processes, files and checkpoints',
        params: S.sandboxParams,
        response: { 200: S.done('id', 'removed'), ...S.errors(409) },
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
        operationId: 'getTenant',
        'x-lockstep-doc': { success: '200 the tenant, its quotas and usage' },
        summary: 'The calling tenant: its quotas and what it uses',
        response: {
          200: S.tenantInfo,
          ...S.errors(),
        },
      },
    },
    async (req) => {
      const t = ctx.tenant(req);
      return { ...t, usage: ctx.tenants.usage(t.id) };
    },
  );
}
