/**
 * Routes: the effect ledger (begin, commit, fail, resolve, list), the
 * observations recorded in a sandbox, and verdicts about its files.
 * An effect id is accepted only under the sandbox that recorded it.
 */
import type { FastifyInstance } from 'fastify';
import type { EffectSpec, Reversibility } from '../../effects/effect-ledger.js';
import type { EffectScope, JsonValue } from '../../effects/idempotency.js';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';

interface BeginBody {
  kind: string;
  input: JsonValue;
  reversibility: Reversibility;
  scope?: EffectScope;
  key?: string;
  toolCallId?: string;
  compensation?: { kind: string; input: JsonValue };
}

type EffectParams = { id: string; effectId: string };

/** An error as the caller reported it, shaped like an Error for the ledger. */
function reportedError(e: string | { name?: string; message: string; code?: string }): Error {
  if (typeof e === 'string') return new Error(e);
  return Object.assign(new Error(e.message), {
    name: e.name ?? 'Error',
    ...(e.code !== undefined ? { code: e.code } : {}),
  });
}

export function agentRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['effects'];

  app.post<{ Params: { id: string }; Body: BeginBody }>(
    '/sandboxes/:id/effects',
    {
      schema: {
        tags,
        operationId: 'beginEffect',
        'x-lockstep-doc': {
          input: '`{kind, input, reversibility, scope, key, toolCallId, compensation}`',
          success: '201 begun, or 200 `{replayed: true, output}`',
        },
        summary:
          'Record the intent of an effect before running it (201), or get ' +
          'what it returned last time (200, replayed: true)',
        params: S.sandboxParams,
        body: S.effectBeginBody,
        response: { 200: S.beginResult, 201: S.beginResult, ...S.errors(409, 413) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const b = req.body;
      const spec: EffectSpec = { kind: b.kind, input: b.input, reversibility: b.reversibility };
      if (b.scope !== undefined) spec.scope = b.scope;
      if (b.key !== undefined) spec.key = b.key;
      if (b.toolCallId !== undefined) spec.toolCallId = b.toolCallId;
      if (b.compensation !== undefined) spec.compensation = b.compensation;
      const r = sb.effects.begin(spec);
      return reply.code(r.replayed ? 200 : 201).send(r);
    },
  );

  app.get(
    '/sandboxes/:id/effects',
    {
      schema: {
        tags,
        operationId: 'listEffects',
        'x-lockstep-doc': { success: '200 effects' },
        summary: 'Effects recorded by the sandbox, in order',
        params: S.sandboxParams,
        response: { 200: S.arrayOf(S.effectRecord, 'Ledger rows'), ...S.errors() },
      },
    },
    async (req) => {
      return ctx.sandbox(req).effects.list();
    },
  );

  app.get<{ Params: EffectParams }>(
    '/sandboxes/:id/effects/:effectId',
    {
      schema: {
        tags,
        operationId: 'getEffect',
        'x-lockstep-doc': { success: '200 effect' },
        summary: 'One effect',
        params: S.effectParams,
        response: { 200: S.effectRecord, ...S.errors() },
      },
    },
    async (req) => {
      return ctx.sandbox(req).effects.get(req.params.effectId);
    },
  );

  app.post<{ Params: EffectParams; Body: { output?: JsonValue } }>(
    '/sandboxes/:id/effects/:effectId/commit',
    {
      schema: {
        tags,
        operationId: 'commitEffect',
        'x-lockstep-doc': { input: '`{output}`', success: '200 effect' },
        summary: 'Record that the effect happened, with its output',
        params: S.effectParams,
        body: S.effectCommitBody,
        response: { 200: S.effectRecord, ...S.errors(409, 413) },
      },
    },
    async (req) => {
      const effects = ctx.sandbox(req).effects;
      effects.get(req.params.effectId); // EFFECT_NOT_FOUND unless this sandbox recorded it
      effects.commit(req.params.effectId, req.body.output);
      return effects.get(req.params.effectId);
    },
  );

  app.post<{
    Params: EffectParams;
    Body: { error: string | { name?: string; message: string; code?: string }; definite: boolean };
  }>(
    '/sandboxes/:id/effects/:effectId/fail',
    {
      schema: {
        tags,
        operationId: 'failEffect',
        'x-lockstep-doc': { input: '`{error, definite}`', success: '200 effect' },
        summary: 'Record that the effect failed (definite: it certainly did not happen)',
        params: S.effectParams,
        body: S.effectFailBody,
        response: { 200: S.effectRecord, ...S.errors(409, 413) },
      },
    },
    async (req) => {
      const effects = ctx.sandbox(req).effects;
      effects.get(req.params.effectId);
      effects.fail(req.params.effectId, reportedError(req.body.error), { definite: req.body.definite });
      return effects.get(req.params.effectId);
    },
  );

  app.post<{ Params: EffectParams; Body: { outcome: 'committed' | 'failed'; output?: JsonValue } }>(
    '/sandboxes/:id/effects/:effectId/resolve',
    {
      schema: {
        tags,
        operationId: 'resolveEffect',
        'x-lockstep-doc': { input: '`{outcome, output}`', success: '200 effect' },
        summary: 'Settle an effect whose outcome is unknown, after checking the outside world',
        params: S.effectParams,
        body: S.effectResolveBody,
        response: { 200: S.effectRecord, ...S.errors(409, 413) },
      },
    },
    async (req) => {
      const effects = ctx.sandbox(req).effects;
      effects.get(req.params.effectId);
      const { outcome, output } = req.body;
      return effects.resolveUnknown(
        req.params.effectId,
        outcome === 'committed' ? (output === undefined ? { outcome } : { outcome, output }) : { outcome },
      );
    },
  );

  app.get<{ Params: { id: string }; Querystring: { includeStale?: 'true' | 'false' } }>(
    '/sandboxes/:id/observations',
    {
      schema: {
        tags: ['observations'],
        operationId: 'listObservations',
        'x-lockstep-doc': { input: '`?includeStale=true`', success: '200 observations' },
        summary: 'What was observed in the sandbox (commands, file reads, writes, listings)',
        params: S.sandboxParams,
        querystring: S.observationsQuery,
        response: { 200: S.arrayOf(S.observation, 'Observations'), ...S.errors() },
      },
    },
    async (req) => {
      return ctx.sandbox(req).observations({ includeStale: req.query.includeStale === 'true' });
    },
  );

  app.post<{ Params: { id: string }; Body: { path: string; verdict: string; toolCallId?: string } }>(
    '/sandboxes/:id/verdicts',
    {
      schema: {
        tags: ['verdicts'],
        operationId: 'recordVerdict',
        'x-lockstep-doc': {
          input: '`{path, verdict, toolCallId}`',
          success: '201 verdict (`contentHash`: sha256 of the file, or `identity:…` over 64 MiB; see "Files")',
        },
        summary: "Record a verdict about a file as it is now (bound to its content's hash)",
        params: S.sandboxParams,
        body: S.verdictBody,
        response: { 201: S.verdict, ...S.errors(413) },
      },
    },
    async (req, reply) => {
      const v = await ctx.sandbox(req).verdicts.record(req.body);
      return reply.code(201).send(v);
    },
  );

  app.get<{ Params: { id: string }; Querystring: { stale?: 'true' | 'false' } }>(
    '/sandboxes/:id/verdicts',
    {
      schema: {
        tags: ['verdicts'],
        operationId: 'listVerdicts',
        'x-lockstep-doc': { input: '`?stale=true`', success: '200 verdicts' },
        summary: 'Verdicts recorded in the sandbox (stale=true: only those whose file changed since)',
        params: S.sandboxParams,
        querystring: S.verdictsQuery,
        response: { 200: S.arrayOf(S.listedVerdict, 'Verdicts'), ...S.errors() },
      },
    },
    async (req) => {
      const v = ctx.sandbox(req).verdicts;
      return req.query.stale === 'true' ? v.stale() : v.list();
    },
  );
}
