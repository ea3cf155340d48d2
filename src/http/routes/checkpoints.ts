/** Routes: checkpoints with the agent's context, rollback (with its report) and fork. */
import type { FastifyInstance } from 'fastify';
import type { RollbackPolicy } from '../../effects/effect-ledger.js';
import type { ApiContext } from '../context.js';
import { contextFromWire, contextToWire, rollbackToWire } from '../../api/wire.js';
import * as S from '../schemas.js';
import { forkResultsToWire } from '../fork-results.js';

interface CheckpointBody {
  label?: string;
  context?: unknown;
  contextFormat?: string;
}

interface RollbackBody {
  checkpointId: string;
  policy?: RollbackPolicy;
  failure?: string;
  lessons?: string[];
  withRecoverySummary?: boolean;
}

export function checkpointRoutes(app: FastifyInstance, ctx: ApiContext, opts: { contextBodyLimit: number }): void {
  const tags = ['checkpoints'];
  const m = ctx.metrics;

  app.post<{ Params: { id: string }; Body: CheckpointBody }>(
    '/sandboxes/:id/checkpoints',
    // An agent's transcript with tool outputs easily passes the JSON limit.
    {
      bodyLimit: opts.contextBodyLimit,
      schema: {
        tags,
        operationId: 'createCheckpoint',
        'x-lockstep-doc': { input: '`{label, context, contextFormat}`', success: '201 checkpoint' },
        summary: "Checkpoint files, processes and the agent's context together",
        params: S.sandboxParams,
        body: S.checkpointBody,
        response: { 201: S.checkpointInfo, ...S.errors(409, 413, 429) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const { label, context, contextFormat } = req.body;
      const ctxValue = context === undefined ? undefined : contextFromWire(context, contextFormat);
      const info = await m.time(m.checkpointSeconds, () =>
        ctx.operation('checkpoint', reply, (signal) => sb.checkpoint({ label, context: ctxValue, signal })),
      );
      req.log.info({ checkpointId: info.id }, 'checkpoint taken');
      return reply.code(201).send(info);
    },
  );

  app.get(
    '/sandboxes/:id/checkpoints',
    {
      schema: {
        tags,
        operationId: 'listCheckpoints',
        'x-lockstep-doc': { success: '200 checkpoints' },
        summary: "The sandbox's checkpoints, oldest first",
        params: S.sandboxParams,
        response: { 200: S.arrayOf(S.checkpointInfo, 'Checkpoints'), ...S.errors() },
      },
    },
    async (req) => {
      return ctx.sandbox(req).checkpoints();
    },
  );

  app.get<{ Params: { id: string; ckpt: string } }>(
    '/sandboxes/:id/checkpoints/:ckpt/context',
    {
      schema: {
        tags,
        operationId: 'getCheckpointContext',
        'x-lockstep-doc': { success: '200 `{checkpointId, context}`' },
        summary: 'The context stored with a checkpoint (null if none)',
        params: S.checkpointParams,
        response: { 200: S.checkpointContext, ...S.errors(409) },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      return { checkpointId: req.params.ckpt, context: contextToWire(sb.context(req.params.ckpt)) };
    },
  );

  app.delete<{ Params: { id: string; ckpt: string } }>(
    '/sandboxes/:id/checkpoints/:ckpt',
    {
      schema: {
        tags,
        operationId: 'deleteCheckpoint',
        'x-lockstep-doc': { success: '200 `{id, deleted}`' },
        summary: 'Delete a checkpoint (its children move to its parent)',
        params: S.checkpointParams,
        response: { 200: S.done('id', 'deleted'), ...S.errors(409) },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      await sb.deleteCheckpoint(req.params.ckpt);
      return { id: req.params.ckpt, deleted: true };
    },
  );

  app.post<{ Params: { id: string }; Body: RollbackBody }>(
    '/sandboxes/:id/rollback',
    {
      schema: {
        tags,
        operationId: 'rollbackSandbox',
        'x-lockstep-doc': {
          input: '`{checkpointId, policy, failure, lessons, withRecoverySummary}`',
          success: '200 rollback report',
        },
        summary: 'Roll back to a checkpoint; returns the rollback report',
        params: S.sandboxParams,
        body: S.rollbackBody,
        response: { 200: S.rollbackReport, ...S.errors(409, 413) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const { checkpointId, policy, failure, lessons, withRecoverySummary } = req.body;
      // Rollback takes no AbortSignal: once begun it runs to its commit (a
      // half-done rollback is what the reaper exists for), so a shutdown waits.
      const report = await m.time(m.rollbackSeconds, () =>
        ctx.operation('rollback', reply, () => sb.rollback(checkpointId, { policy, failure, lessons })),
      );
      req.log.info({ checkpointId }, 'rolled back');
      return rollbackToWire(report, withRecoverySummary !== false);
    },
  );

  app.post<{ Params: { id: string }; Body: { checkpointId: string; count?: number } }>(
    '/sandboxes/:id/fork',
    {
      schema: {
        tags,
        operationId: 'forkSandbox',
        'x-lockstep-doc': {
          input: '`{checkpointId, count}`',
          success: '200 `{results, ids, errors}` (see "Fork results")',
        },
        summary: 'Start sandboxes from a checkpoint',
        params: S.sandboxParams,
        body: S.forkBody,
        response: { 200: S.forkResult, ...S.errors(409, 413, 429) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const count = req.body.count ?? 1;
      // The verb checks the tenant's quotas for all the forks (QUOTA_EXCEEDED, 429, none made).
      const results = await m.time(m.forkSeconds, () =>
        ctx.operation('fork', reply, (signal) => sb.fork(req.body.checkpointId, { count, signal })),
      );
      const answer = forkResultsToWire(results);
      if (answer.errors.length)
        req.log.warn({ errors: results.flatMap((r) => (r.ok ? [] : [r.error])) }, 'forks failed');
      req.log.info({ checkpointId: req.body.checkpointId, forks: answer.ids }, 'forked');
      return answer;
    },
  );
}
