/**
 * Route: MCP over streamable HTTP at /mcp, behind the tenant's bearer token.
 *
 * Each `initialize` opens a session (Mcp-Session-Id) with an MCP server of
 * the tenant's scope (src/mcp/server.ts): its tools create, list and kill
 * the tenant's sandboxes and act on any of them by id, under the same
 * quotas as the REST routes. A session belongs to the tenant that opened
 * it: every request is authenticated again, and another tenant's session id
 * answers exactly like an unknown one (404). Sessions idle for longer than
 * SESSION_IDLE_MS are closed, and a tenant has at most MAX_SESSIONS open:
 * the next initialize closes that tenant's least recently used one (MCP
 * clients often leave without ending their session; refusing new ones would
 * lock a tenant out until the idle sweep, and evicting only its own sessions
 * keeps one tenant from pushing out another's).
 */
import { randomUUID } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { createMcpServer, type TenantScope } from '../../mcp/server.js';
import type { Tenant } from '../../tenants/tenants.js';
import { NotFoundError } from '../../errors.js';
import { tenantSandboxInfo, type ApiContext } from '../context.js';
import { HttpError } from '../errors.js';

/** Sessions one tenant may hold open at once. */
export const MAX_SESSIONS = 16;
/** A session unused for this long is closed. */
export const SESSION_IDLE_MS = 30 * 60 * 1000;

interface Session {
  tenantId: string;
  transport: StreamableHTTPServerTransport;
  server: McpServer;
  lastUsed: number;
}

/** The open sessions, by id. */
class McpSessions {
  readonly byId = new Map<string, Session>();

  /** Closes the tenant's least recently used sessions until it has room for one more. */
  async makeRoom(tenantId: string): Promise<void> {
    const own = [...this.byId]
      .filter(([, s]) => s.tenantId === tenantId)
      .sort(([, a], [, b]) => a.lastUsed - b.lastUsed);
    for (const [id] of own.slice(0, Math.max(0, own.length - MAX_SESSIONS + 1))) await this.close(id);
  }

  async close(id: string): Promise<void> {
    const s = this.byId.get(id);
    if (!s) return;
    this.byId.delete(id);
    await s.server.close().catch(() => undefined);
  }

  async sweep(now: number): Promise<void> {
    for (const [id, s] of this.byId) if (now - s.lastUsed > SESSION_IDLE_MS) await this.close(id);
  }

  async closeAll(): Promise<void> {
    for (const id of [...this.byId.keys()]) await this.close(id);
  }
}

/** What a tenant's MCP session may do, as its tenant (whose quotas the verbs check). */
function tenantScope(ctx: ApiContext, tenantId: string): TenantScope {
  const current = (): Tenant => {
    const t = ctx.tenants.byId(tenantId);
    if (!t) throw new NotFoundError('tenant', tenantId);
    return t;
  };
  return {
    id: tenantId,
    // The verbs check the tenant's quotas, on the tenant as it is now.
    create: (opts) => ctx.lockstep.create({ ...opts, tenant: tenantId }),
    fork: (sandbox, checkpointId, count) => sandbox.fork(checkpointId, { count }),
    start: (snapshot, count) => {
      const snap = ctx.lockstep.snapshots.get(snapshot, { tenant: tenantId });
      return ctx.lockstep.snapshots.start(snap.id, { count, tenant: tenantId });
    },
    present: (info) => tenantSandboxInfo(info, current()),
  };
}

export function mcpRoutes(
  app: FastifyInstance,
  ctx: ApiContext,
  opts: { bearer: (req: FastifyRequest) => string | undefined; bodyLimit: number },
): void {
  const sessions = new McpSessions();
  const sweeper = setInterval(() => void sessions.sweep(Date.now()), 60_000).unref();
  app.addHook('onClose', async () => {
    clearInterval(sweeper);
    await sessions.closeAll();
  });

  app.route({
    method: ['GET', 'POST', 'DELETE'],
    url: '/mcp',
    bodyLimit: opts.bodyLimit,
    schema: { hide: true },
    handler: async (req, reply) => {
      const tenant = ctx.tenants.authenticate(opts.bearer(req));
      if (!tenant)
        throw new HttpError(401, 'UNAUTHENTICATED', 'Send Authorization: Bearer <token> with a valid tenant token');
      req.log = reply.log = req.log.child({ tenant: tenant.name, tenantId: tenant.id, component: 'mcp' });
      const sid = req.headers['mcp-session-id'];
      let session: Session | undefined;
      if (typeof sid === 'string') {
        session = sessions.byId.get(sid);
        if (!session || session.tenantId !== tenant.id)
          throw new HttpError(
            404,
            'MCP_SESSION_NOT_FOUND',
            'No MCP session with that Mcp-Session-Id: initialize a new one',
            { field: 'Mcp-Session-Id' },
          );
      } else if (req.method === 'POST' && isInitializeRequest(req.body)) {
        await sessions.makeRoom(tenant.id);
        const server = createMcpServer({ lockstep: ctx.lockstep, tenant: tenantScope(ctx, tenant.id) });
        const opened: Session = {
          tenantId: tenant.id,
          server,
          lastUsed: Date.now(),
          transport: undefined as unknown as StreamableHTTPServerTransport,
        };
        opened.transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => void sessions.byId.set(id, opened),
          onsessionclosed: (id) => void sessions.close(id),
        });
        await server.connect(opened.transport);
        session = opened;
      } else {
        throw new HttpError(
          400,
          'INVALID_ARGUMENT',
          'Send an MCP initialize request first, then the Mcp-Session-Id header it returns',
          { field: 'Mcp-Session-Id' },
        );
      }
      session.lastUsed = Date.now();
      // The transport writes the answer (JSON or an SSE stream) itself.
      reply.hijack();
      await session.transport.handleRequest(req.raw, reply.raw, req.body);
    },
  });
}
