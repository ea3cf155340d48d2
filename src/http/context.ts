/**
 * What every route handler shares: the manager, the tenant of the request,
 * the in-flight operations, metrics and idempotency (the verbs check quotas).
 */
import { Admission } from '../admission.js';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Lockstep } from '../api/lockstep.js';
import type { Sandbox, SandboxInfo } from '../api/sandbox.js';
import type { Tenant } from '../tenants/tenants.js';
import type { Tenants } from '../api/tenants.js';
import type { ServerMetrics } from './metrics.js';
import type { OperationTracker } from './operations.js';
import type { IdempotencyStore, StoredResponse } from './idempotency.js';
import { HttpError } from './errors.js';

/** A sandbox as a tenant sees it: no host pid, and the tenant named. */
export type TenantSandboxInfo = Omit<SandboxInfo, 'pid'> & { tenantId: string | null };

/**
 * A sandbox as the API (HTTP and MCP) shows it: the library keys sandboxes by
 * the tenant's id; the API also names the tenant, which is the caller. The
 * init's host pid is left out: it names a process of the host's pid
 * namespace (inside its own the init is pid 1), which is the operator's
 * business; the manager's log and the library's SandboxInfo keep it.
 */
export function tenantSandboxInfo(info: SandboxInfo, tenant: Tenant): TenantSandboxInfo {
  const { pid: _hostPid, ...shown } = info;
  return { ...shown, tenant: tenant.name, tenantId: tenant.id };
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The route replays a stored idempotent response itself (it may stream it). */
    replaysItself?: boolean;
  }
}

/** Per-request state set by the hooks. */
export interface RequestState {
  tenant: Tenant;
  idempotency?: { key: string; hash: string; stored: boolean };
  /** A stored response to replay; set only on routes that replay themselves (config.replaysItself). */
  replay?: StoredResponse;
}

/** Shared by the route modules. */
/**
 * What one tenant, and all of them together, can keep in flight on these
 * routes; past it, 429 RATE_LIMITED with Retry-After (nothing queues). Each
 * wait holds a pidfd watch; each foreground command (JSON or streamed) holds
 * a process in the sandbox, an enter helper on the host and, streamed, an
 * open response. A request that ends, or whose client goes away, gives its
 * place back at once (its signal stops the wait or the command). 64 per
 * tenant is far more than an agent's tool calls run at once; 1024 in all
 * keeps the manager's fds and helpers bounded whatever the tenants do.
 */
export const COMMAND_ROUTE_LIMITS = {
  waits: { perTenant: 64, total: 1024 },
  commands: { perTenant: 64, total: 1024 },
  /** Open PTY output streams: each polls its transcript until the PTY ends or the client leaves. */
  streams: { perTenant: 32, total: 512 },
} as const;

export class ApiContext {
  /** Waits (background commands and PTYs alike), foreground commands and PTY streams in flight, per tenant and in all. */
  readonly admission = {
    waits: new Admission({
      what: 'command and PTY waits',
      perKey: COMMAND_ROUTE_LIMITS.waits.perTenant,
      total: COMMAND_ROUTE_LIMITS.waits.total,
    }),
    commands: new Admission({
      what: 'commands in flight',
      perKey: COMMAND_ROUTE_LIMITS.commands.perTenant,
      total: COMMAND_ROUTE_LIMITS.commands.total,
    }),
    streams: new Admission({
      what: 'PTY output streams',
      perKey: COMMAND_ROUTE_LIMITS.streams.perTenant,
      total: COMMAND_ROUTE_LIMITS.streams.total,
    }),
  };
  private readonly states = new WeakMap<FastifyRequest, RequestState>();

  constructor(
    readonly lockstep: Lockstep,
    readonly metrics: ServerMetrics,
    readonly operations: OperationTracker,
    readonly idempotency: IdempotencyStore,
    /** How long a create waits for an image made on first use before answering 503 IMAGE_BUILDING. */
    readonly imageWaitMs = 60_000,
  ) {}

  get tenants(): Tenants {
    return this.lockstep.tenants;
  }

  setState(req: FastifyRequest, s: RequestState): void {
    this.states.set(req, s);
  }

  /** The state, or undefined before authentication (or when it failed). */
  maybeState(req: FastifyRequest): RequestState | undefined {
    return this.states.get(req);
  }

  state(req: FastifyRequest): RequestState {
    const s = this.states.get(req);
    if (!s) throw new HttpError(401, 'UNAUTHENTICATED', 'Send Authorization: Bearer <token>');
    return s;
  }

  tenant(req: FastifyRequest): Tenant {
    return this.state(req).tenant;
  }

  /** The request's sandbox (params.id), if the tenant owns it; SANDBOX_NOT_FOUND otherwise. */
  sandbox(req: FastifyRequest): Sandbox {
    const id = (req.params as { id: string }).id;
    return this.lockstep.get(id, this.tenant(req).id);
  }

  /** A sandbox as the API shows it to the request's tenant (tenantSandboxInfo). */
  present(req: FastifyRequest, info: SandboxInfo): TenantSandboxInfo {
    return tenantSandboxInfo(info, this.tenant(req));
  }

  /**
   * Runs a long operation tracked for graceful shutdown; its signal aborts on
   * shutdown past the deadline, or when the client goes away if `abortOnDisconnect`.
   */
  operation<T>(
    kind: string,
    reply: FastifyReply,
    fn: (signal: AbortSignal) => Promise<T>,
    opts: { abortOnDisconnect?: boolean } = {},
  ): Promise<T> {
    if (this.operations.isDraining)
      throw new HttpError(503, 'SERVER_SHUTTING_DOWN', 'The server is shutting down; retry on its successor');
    let linked: AbortSignal | undefined;
    if (opts.abortOnDisconnect) {
      const c = new AbortController();
      reply.raw.once('close', () => {
        if (!reply.raw.writableFinished) c.abort(new Error('client went away'));
      });
      linked = c.signal;
    }
    return this.operations.run(kind, fn, linked);
  }
}
