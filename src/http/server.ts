/**
 * The HTTP API: a thin layer over the library, on fastify. Every /v1 route
 * needs `Authorization: Bearer <token>`; the token names the tenant, and a
 * tenant sees only its own sandboxes (another tenant's answer exactly like
 * missing ones: 404 with the same body). Inputs are checked by JSON schemas
 * (additionalProperties: false) before any handler runs; errors have one
 * body shape (see errors.ts). POSTs honour Idempotency-Key.
 *
 * MCP over streamable HTTP is at /mcp, behind the same bearer token
 * (routes/mcp.ts).
 *
 * Unauthenticated: /healthz, /openapi.json, /docs (Swagger UI, served from
 * the package, no CDN) and /metrics (Prometheus; give `metricsToken` to
 * require `Authorization: Bearer <metricsToken>` there).
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { Lockstep } from '../api/lockstep.js';
import type { Logger } from '../log.js';
import { ApiContext } from './context.js';
import { HttpError, errorHandler } from './errors.js';
import { IdempotencyStore, requestHash, validateIdempotencyKey } from './idempotency.js';
import { ServerMetrics } from './metrics.js';
import { OperationTracker } from './operations.js';
import { agentRoutes } from './routes/agent.js';
import { AJV_OPTIONS } from './schemas.js';
import { ptyRoutes } from './routes/pty.js';
import { backgroundRoutes } from './routes/background.js';
import { checkpointRoutes } from './routes/checkpoints.js';
import { commandRoutes } from './routes/commands.js';
import { fileRoutes } from './routes/files.js';
import { imageRoutes } from './routes/images.js';
import { mcpRoutes } from './routes/mcp.js';
import { sandboxRoutes } from './routes/sandboxes.js';
import { snapshotRoutes } from './routes/snapshots.js';
import { storeRoutes } from './routes/store.js';
import { portRoutes, proxyRoutes } from './routes/ports.js';
import { RequestLogController } from './request-log.js';
import { VERSION } from '../version.js';

/** Options of createServer. */
export interface ServerOptions {
  lockstep: Lockstep;
  /** pino logger for request logs (default: the manager's). */
  logger?: Logger | undefined;
  /** When set, /metrics requires `Authorization: Bearer <metricsToken>`. */
  metricsToken?: string | undefined;
  /** Largest JSON body (default 1 MiB); larger answers 413. */
  bodyLimit?: number | undefined;
  /** Largest body of a file write, or of a checkpoint with its context (default 16 MiB). */
  fileBodyLimit?: number | undefined;
  /** How often expired sandboxes and idempotency keys are swept (default 60 s; 0: never). */
  sweepIntervalMs?: number | undefined;
  /**
   * How long a create waits for its image when a shipped recipe is made on
   * first use (default 60 s); past that it answers 503 IMAGE_BUILDING with
   * Retry-After while the build goes on, rather than leave the client to its
   * own timeout.
   */
  imageWaitMs?: number | undefined;
  /** How long a sandbox behind an exposed port may take to answer a proxied request's head (default 30 s). */
  proxyAnswerTimeoutMs?: number | undefined;
  /** Clock of the idempotency store (tests). */
  clock?: (() => number) | undefined;
}

/** How a shutdown proceeds. */
export interface ShutdownOptions {
  /** How long in-flight checkpoints, rollbacks, forks and commands may take to finish (default 30 s). */
  graceMs?: number | undefined;
  /** After the grace, how long aborted operations get to settle (default 10 s). */
  abortWaitMs?: number | undefined;
  /** Close the Lockstep manager at the end (default false: the caller owns it). */
  closeLockstep?: boolean | undefined;
}

/** What a shutdown had to cut short. */
export interface ShutdownReport {
  /** Kinds of operations aborted at the deadline. */
  aborted: string[];
  /** Kinds of operations still running when the server gave up on them. */
  abandoned: string[];
}

/** A route the server answers, as registered with fastify (HEAD routes included). */
export interface RouteEntry {
  method: string;
  url: string;
}

/** The fastify instance, with a graceful shutdown and the server's metrics. */
export type LockstepServer = FastifyInstance & {
  /** Every route, in registration order (complete once the server is ready); tests enumerate the API from it. */
  readonly routes: readonly RouteEntry[];
  /** Stops accepting, lets in-flight operations finish (then aborts them), closes; idempotent. */
  shutdown(opts?: ShutdownOptions): Promise<ShutdownReport>;
  readonly metrics: ServerMetrics;
  readonly operations: OperationTracker;
};

const MiB = 1024 * 1024;

const version = VERSION;

function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  const m = typeof h === 'string' ? /^Bearer[ \t]+([^\s]+)[ \t]*$/i.exec(h) : null;
  return m?.[1];
}

const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/**
 * Compares a presented secret with the expected one's digest in constant
 * time: both sides are hashed to 32 bytes first, so neither the content nor
 * the length of the right token leaks through how long a wrong one takes.
 */
function sameSecret(expected: Buffer, presented: string | undefined): boolean {
  return timingSafeEqual(expected, digest(presented ?? '')) && presented !== undefined;
}

/** Builds the API server; call listen() on it. The caller keeps ownership of the Lockstep. */
export function createServer(opts: ServerOptions): LockstepServer {
  const ls = opts.lockstep;
  const metrics = new ServerMetrics(ls);
  const operations = new OperationTracker();
  const ctx = new ApiContext(
    ls,
    metrics,
    operations,
    new IdempotencyStore(ls.tenants.replies, opts.clock),
    opts.imageWaitMs,
  );
  const fileBodyLimit = opts.fileBodyLimit ?? 16 * MiB;
  const metricsDigest = opts.metricsToken === undefined ? undefined : digest(opts.metricsToken);

  const app = Fastify({
    loggerInstance: opts.logger ?? ls.logger,
    logController: new RequestLogController(),
    bodyLimit: opts.bodyLimit ?? MiB,
    // A client's X-Request-Id is kept (to follow a call across services) if
    // it is a plain token; anything else could forge or flood log lines.
    requestIdHeader: false,
    genReqId: (req) => {
      const h = req.headers['x-request-id'];
      return typeof h === 'string' && /^[A-Za-z0-9._:-]{1,128}$/.test(h) ? h : `req_${randomBytes(8).toString('hex')}`;
    },
    return503OnClosing: true,
    // Errors fastify raises before routing (a path with bad percent-encoding,
    // an over-long parameter) get the one error body too.
    frameworkErrors: (err, req, reply) => errorHandler(err, req, reply),
    ajv: { customOptions: { ...AJV_OPTIONS } },
  }) as unknown as FastifyInstance;

  // First hook of all, so that no route (plugins' included) is registered before it.
  const routes: RouteEntry[] = [];
  app.addHook('onRoute', (r) => {
    for (const method of [r.method].flat()) routes.push({ method, url: r.url });
  });

  // Response schemas document the API in OpenAPI; they must not reshape
  // what is sent (fast-json-stringify drops and coerces fields).
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler((req, reply) => {
    void reply
      .code(404)
      .send({ error: { code: 'ROUTE_NOT_FOUND', message: `No route ${req.method} ${req.url.split('?')[0]}` } });
  });

  let draining = false;
  app.addHook('onRequest', async (req, reply) => {
    void reply.header('x-request-id', req.id);
    if (draining) {
      void reply.header('connection', 'close');
      throw new HttpError(503, 'SERVER_SHUTTING_DOWN', 'The server is shutting down; retry on its successor');
    }
  });
  app.addHook('onSend', async (_req, reply) => {
    if (draining) void reply.header('connection', 'close');
  });
  app.addHook('onResponse', async (req, reply) => {
    const labels = {
      method: req.method,
      route: req.routeOptions.url ?? 'unmatched',
      status_code: String(reply.statusCode),
    };
    metrics.requests.inc(labels);
    metrics.requestSeconds.observe(labels, reply.elapsedTime / 1000);
  });

  void app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'Lockstep API',
        version,
        description:
          'Copy-on-write sandboxes for AI agents with aligned checkpoints of ' +
          'files, processes, agent context and side effects. ' +
          'Every /v1 route needs `Authorization: Bearer <token>` (`lockstep tenant add ' +
          'NAME`). Errors: `{"error": {"code", "message", "field"}}`. ' +
          'POSTs accept an `Idempotency-Key` header (replayed for 24 h).',
      },
      components: { securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearerAuth: [] }],
      // In this order in Swagger UI and in docs/http-reference.md's Routes table (scripts/http-reference.mjs).
      tags: [
        'sandboxes',
        'commands',
        'pty',
        'files',
        'checkpoints',
        'effects',
        'observations',
        'verdicts',
        'snapshots',
        'snapshot store',
        'tenant',
        'images',
      ].map((name) => ({ name })),
    },
    // A query of free-form names (patternProperties: GET /v1/sandboxes's
    // metadata.KEY) has no OpenAPI 3.0 parameter form; @fastify/swagger would
    // list the schema's own keywords as parameters. The route's summary and
    // x-lockstep-doc say how to send it instead.
    transform: ({ schema, url }) => {
      const query = schema?.querystring as Record<string, unknown> | undefined;
      if (!query || !('patternProperties' in query)) return { schema, url };
      const { querystring: _free, ...rest } = schema;
      return { schema: rest, url };
    },
  });
  void app.register(swaggerUi, { routePrefix: '/docs', uiConfig: { validatorUrl: null, deepLinking: true } });

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  app.get('/healthz', { schema: { hide: true } }, async () => ({ ok: true, draining, version }));
  app.get('/metrics', { schema: { hide: true } }, async (req, reply) => {
    if (metricsDigest !== undefined && !sameSecret(metricsDigest, bearer(req)))
      throw new HttpError(401, 'UNAUTHENTICATED', 'Send Authorization: Bearer <metrics token>');
    return reply.type(metrics.registry.contentType).send(await metrics.registry.metrics());
  });

  void app.register(
    async (v1) => {
      v1.addHook('onRequest', async (req, reply) => {
        const tenant = ls.tenants.authenticate(bearer(req));
        if (!tenant)
          throw new HttpError(401, 'UNAUTHENTICATED', 'Send Authorization: Bearer <token> with a valid tenant token');
        ctx.setState(req, { tenant });
        // reply.log writes the "request completed" line: bind it too.
        req.log = reply.log = req.log.child({ tenant: tenant.name, tenantId: tenant.id });
      });
      // A POST without a body is an empty object, so that all-optional bodies may be left out.
      v1.addHook('preValidation', async (req) => {
        if (req.body === undefined && req.method === 'POST') req.body = {};
      });
      v1.addHook('preHandler', async (req, reply) => {
        const id = (req.params as { id?: string } | undefined)?.id;
        if (id !== undefined) req.log = reply.log = req.log.child({ sandboxId: id });
        await claimIdempotency(ctx, req, reply);
      });
      v1.addHook('onSend', async (req, reply, payload) => {
        settleIdempotency(ctx, req, reply, payload);
        return payload;
      });
      sandboxRoutes(v1, ctx);
      commandRoutes(v1, ctx);
      backgroundRoutes(v1, ctx);
      checkpointRoutes(v1, ctx, { contextBodyLimit: fileBodyLimit });
      agentRoutes(v1, ctx);
      imageRoutes(v1, ctx);
      // Input bytes (stdin, PTY keys) arrive as one Buffer, bounded like the input queue.
      await v1.register(async (raw) => ptyRoutes(raw, ctx));
      snapshotRoutes(v1, ctx);
      storeRoutes(v1, ctx);
      portRoutes(v1, ctx);
      await v1.register(async (files) => {
        // Raw file bytes stay a stream: the route writes them to the file as they arrive.
        files.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
        fileRoutes(files, ctx, { fileBodyLimit });
      });
    },
    { prefix: '/v1' },
  );
  // Exposed ports: its own credentials (the port's token or the tenant's), bodies streamed to the sandbox.
  void app.register(async (proxy) => proxyRoutes(proxy, ctx, { answerTimeoutMs: opts.proxyAnswerTimeoutMs }));
  // MCP's tool arguments carry file contents as JSON text: room for a whole file limit of base64.
  mcpRoutes(app, ctx, { bearer, bodyLimit: Math.ceil(fileBodyLimit * 1.5) + MiB });

  const sweepMs = opts.sweepIntervalMs ?? 60_000;
  const sweeper =
    sweepMs > 0
      ? setInterval(() => {
          if (draining) return;
          try {
            ctx.idempotency.sweep();
          } catch (err) {
            app.log.warn({ err }, 'idempotency sweep failed');
          }
          ls.sweepExpired().catch((err) => app.log.warn({ err }, 'sweeping expired sandboxes failed'));
        }, sweepMs).unref()
      : undefined;
  app.addHook('onClose', async () => clearInterval(sweeper));

  let shutdownPromise: Promise<ShutdownReport> | undefined;
  const shutdown = (o: ShutdownOptions = {}): Promise<ShutdownReport> => {
    shutdownPromise ??= (async () => {
      draining = true;
      app.log.info('shutting down: no new requests; waiting for operations in flight');
      const closing = app.close();
      const report = await operations.drain(o.graceMs ?? 30_000, o.abortWaitMs ?? 10_000);
      if (report.aborted.length)
        app.log.warn(
          { aborted: report.aborted, abandoned: report.abandoned },
          'aborted operations still running at the deadline',
        );
      // Requests that are not tracked operations are quick; a connection
      // still open after this is a client holding on to a finished stream.
      const timer = setTimeout(() => app.server.closeAllConnections(), 2000).unref();
      await closing;
      clearTimeout(timer);
      if (o.closeLockstep) await ls.close();
      return report;
    })();
    return shutdownPromise;
  };

  return Object.assign(app, { shutdown, metrics, operations, routes }) as LockstepServer;
}

async function claimIdempotency(ctx: ApiContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  if (req.method !== 'POST') return;
  const raw = req.headers['idempotency-key'];
  if (raw === undefined) return;
  const key = validateIdempotencyKey(raw);
  const state = ctx.state(req);
  const hash = requestHash(req.method, req.url, req.body);
  const stored = ctx.idempotency.claim(state.tenant.id, key, hash);
  if (stored) {
    if (req.routeOptions.config.replaysItself) {
      state.replay = stored;
      return;
    }
    void reply
      .code(stored.status)
      .header('idempotent-replayed', 'true')
      .type('application/json; charset=utf-8')
      .send(stored.body);
    return;
  }
  state.idempotency = { key, hash, stored: false };
}

/** On the response: store a 2xx JSON answer, and end the claim (streams settle themselves). */
function settleIdempotency(ctx: ApiContext, req: FastifyRequest, reply: FastifyReply, payload: unknown): void {
  const s = ctx.maybeState(req);
  const idem = s?.idempotency;
  if (!s || !idem || idem.stored) return;
  if (typeof payload !== 'string' && !Buffer.isBuffer(payload)) {
    // A stream: the route stores and releases when it ends.
    if (reply.statusCode < 300) return;
  } else if (reply.statusCode >= 200 && reply.statusCode < 300) {
    ctx.idempotency.store(s.tenant.id, idem.key, idem.hash, {
      status: reply.statusCode,
      body: payload.toString(),
      streamed: false,
    });
  }
  idem.stored = true;
  ctx.idempotency.release(s.tenant.id, idem.key);
}
