/**
 * Routes: exposed ports. Under /v1 (the tenant's bearer token): expose a
 * port of a sandbox, list and close them. At /ports/<exposure id>/… the
 * proxy: HTTP requests (and WebSocket upgrades) go to that port inside the
 * sandbox, for whoever sends its token (`X-Lockstep-Token`, or
 * `?lockstep_token=` for a link a browser opens) or the owning tenant's
 * `Authorization: Bearer`. The credential is removed before the request is
 * forwarded: the sandbox never sees a token.
 *
 * No proxy library: the connection is one the manager opens inside the
 * sandbox's network namespace (Lockstep.connectExposedPort), which Node's own
 * HTTP client takes through `createConnection`; the sandbox is hostile, so
 * its answer's head is bounded (16 KiB, 30 s), the connection closes after
 * 60 s without a byte either way, and bodies stream with backpressure (the
 * manager never buffers one).
 */
import http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { LockstepError } from '../../errors.js';
import type { ExposureCredentials } from '../../network/exposed-ports.js';
import type { ApiContext } from '../context.js';
import { HttpError, toErrorResponse } from '../errors.js';
import * as S from '../schemas.js';

/** How long the sandbox may take to send its answer's status line and headers. */
export const ANSWER_TIMEOUT_MS = 30_000;
/** A proxied connection with no byte in either direction for this long is closed. */
export const IDLE_TIMEOUT_MS = 60_000;
const MAX_ANSWER_HEAD_BYTES = 16 * 1024;

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);
const TOKEN_HEADER = 'x-lockstep-token';
const TOKEN_QUERY = 'lockstep_token';

const portBody = {
  type: 'object',
  additionalProperties: false,
  required: ['port'],
  properties: { port: { type: 'integer', minimum: 1, maximum: 65535, description: 'A port the sandbox listens on' } },
};
const portParams = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'port'],
  properties: {
    id: (S.sandboxParams.properties as Record<string, unknown>).id,
    port: { type: 'string', maxLength: 8 },
  },
};

interface Presented {
  creds: ExposureCredentials;
  /** The Authorization header carried the credential: it is not forwarded. */
  usedAuthorization: boolean;
  any: boolean;
}

/** The credentials a proxied request carries (header, query or the tenant's bearer token). */
function presented(ctx: ApiContext, headers: http.IncomingHttpHeaders, url: URL): Presented {
  const h = headers[TOKEN_HEADER];
  const token = (typeof h === 'string' ? h : undefined) ?? url.searchParams.get(TOKEN_QUERY) ?? undefined;
  const auth = typeof headers.authorization === 'string' ? headers.authorization : undefined;
  const bearer = auth ? /^Bearer[ \t]+([^\s]+)[ \t]*$/i.exec(auth)?.[1] : undefined;
  if (token !== undefined) return { creds: { token }, usedAuthorization: false, any: true };
  if (bearer === undefined) return { creds: {}, usedAuthorization: false, any: false };
  const tenant = ctx.tenants.authenticate(bearer);
  // A bearer token that is no tenant's may be the exposure's own.
  return { creds: tenant ? { tenant: tenant.id } : { token: bearer }, usedAuthorization: true, any: true };
}

function unauthenticated(): HttpError {
  return new HttpError(
    401,
    'UNAUTHENTICATED',
    "Send the exposed port's token as X-Lockstep-Token (or ?lockstep_token=), or the tenant's Authorization: Bearer <token>",
  );
}

function unreachable(sandboxId: string, port: number, why: string): LockstepError {
  return new LockstepError('PORT_UNREACHABLE', `Port ${port} of sandbox ${sandboxId} ${why}`, {
    details: { sandboxId, port },
  });
}

/**
 * The request's path below /ports/<id>, exactly as the client encoded it (a
 * URL parser would resolve `..` and decode `%2F`), with the query minus the token.
 */
function upstreamPath(rawUrl: string, url: URL): string {
  const rawPath = rawUrl.split('?')[0]!;
  const below = rawPath.slice('/ports/'.length);
  const slash = below.indexOf('/');
  url.searchParams.delete(TOKEN_QUERY);
  const q = url.searchParams.toString();
  return `${slash < 0 ? '/' : below.slice(slash)}${q ? `?${q}` : ''}`;
}

/** A Lockstep token anywhere in a value: a tenant's (lst_) or an exposure's (lsp_). */
const TOKEN_PATTERN = /ls[tp]_[A-Za-z0-9_-]{8,}/;

/**
 * Whether a header the client sent carries a Lockstep credential, in any
 * form: a tenant's or an exposure's token in the value (Bearer, Basic's
 * decoded user:password, anything else), or a bearer value that
 * authenticates as a tenant whatever it looks like. Such a header never
 * reaches the sandbox, whichever credential admitted the request.
 */
function carriesCredential(ctx: ApiContext, value: string): boolean {
  if (TOKEN_PATTERN.test(value)) return true;
  const basic = /^Basic[ \t]+([A-Za-z0-9+/=]+)[ \t]*$/i.exec(value)?.[1];
  if (basic !== undefined && TOKEN_PATTERN.test(Buffer.from(basic, 'base64').toString('latin1'))) return true;
  const bearer = /^Bearer[ \t]+([^\s]+)[ \t]*$/i.exec(value)?.[1];
  return bearer !== undefined && ctx.tenants.authenticate(bearer) !== undefined;
}

/**
 * The Cookie header without Lockstep's own: a cookie named lockstep* (the
 * API sets none, the name is reserved) or whose value is a Lockstep token.
 * Undefined when none is left.
 */
function cookiesWithoutCredentials(value: string): string | undefined {
  const kept = value
    .split(';')
    .map((c) => c.trim())
    .filter((c) => c !== '' && !/^lockstep/i.test(c) && !TOKEN_PATTERN.test(c));
  return kept.length ? kept.join('; ') : undefined;
}

/**
 * What of a client's header goes on to the sandbox: undefined to drop it.
 * Dropped: hop-by-hop headers, the exposure token's header, an
 * Authorization that admitted the request or carries any Lockstep
 * credential, and Lockstep's cookies. An application's own Authorization
 * (Basic with its own password, a bearer of its own) goes through.
 */
function forwardedValue(ctx: ApiContext, p: Presented, name: string, value: string): string | undefined {
  if (HOP_BY_HOP.has(name) || name === TOKEN_HEADER) return undefined;
  if (name === 'authorization') return p.usedAuthorization || carriesCredential(ctx, value) ? undefined : value;
  if (name === 'cookie') return cookiesWithoutCredentials(value);
  return value;
}

function forwardedHeaders(
  ctx: ApiContext,
  req: http.IncomingMessage,
  p: Presented,
  prefix: string,
): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined) continue;
    const kept = Array.isArray(v)
      ? v.map((one) => forwardedValue(ctx, p, k, one)).filter((one) => one !== undefined)
      : forwardedValue(ctx, p, k, v);
    if (kept === undefined || (Array.isArray(kept) && kept.length === 0)) continue;
    out[k] = kept;
  }
  out['x-forwarded-for'] = req.socket.remoteAddress ?? '';
  out['x-forwarded-prefix'] = prefix;
  return out;
}

export function portRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['sandboxes'];
  app.post<{ Body: { port: number } }>(
    '/sandboxes/:id/ports',
    {
      schema: {
        tags,
        operationId: 'exposePort',
        'x-lockstep-doc': {
          input: '`{port}` (1–65535, something in the sandbox must listen on it: else 409 `PORT_NOT_LISTENING`)',
          success: '201 `{id, sandboxId, port, path, url, token, createdAt}` (the token only here)',
        },
        summary: 'Expose a port the sandbox listens on (the token is shown only here)',
        params: S.sandboxParams,
        body: portBody,
        response: { 201: S.exposed, ...S.errors(409, 429) },
      },
    },
    async (req, reply) => {
      const sb = ctx.sandbox(req);
      const exposed = await sb.ports.expose(req.body.port);
      // The server knows where it is reached: the URL uses the request's own origin unless LOCKSTEP_PUBLIC_URL says.
      const host = req.headers.host;
      const url = ctx.lockstep.publicUrl ?? (host ? `${req.protocol}://${host}` : undefined);
      return reply.code(201).send(url ? { ...exposed, url: url + exposed.path } : exposed);
    },
  );
  app.get(
    '/sandboxes/:id/ports',
    {
      schema: {
        tags,
        operationId: 'listPorts',
        'x-lockstep-doc': { success: '200 `[{id, sandboxId, port, path, url, createdAt}]`' },
        summary: "The sandbox's exposed ports (without tokens)",
        params: S.sandboxParams,
        response: {
          200: S.arrayOf(S.exposure, 'By port'),
          ...S.errors(),
        },
      },
    },
    async (req) => ctx.sandbox(req).ports.list(),
  );
  app.delete<{ Params: { id: string; port: string } }>(
    '/sandboxes/:id/ports/:port',
    {
      schema: {
        tags,
        operationId: 'closePort',
        'x-lockstep-doc': { success: '200 `{port, closed}`' },
        summary: 'Close an exposed port and the connections open through it',
        params: portParams,
        response: { 200: S.portClosed, ...S.errors() },
      },
    },
    async (req) => {
      const sb = ctx.sandbox(req);
      const closed = sb.ports.close(req.params.port as unknown as number);
      return { port: Number(req.params.port), closed };
    },
  );
}

/** The proxy at /ports/<id>/… (outside /v1: its own credentials), and WebSocket upgrades to it. */
export async function proxyRoutes(
  app: FastifyInstance,
  ctx: ApiContext,
  opts: { answerTimeoutMs?: number | undefined } = {},
): Promise<void> {
  const answerTimeoutMs = opts.answerTimeoutMs ?? ANSWER_TIMEOUT_MS;
  // Bodies are not parsed: they stream to the sandbox as they arrive.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_req, _payload, done) => done(null, undefined));

  const handler = async (req: FastifyRequest, reply: FastifyReply) => {
    const params = req.params as { exposure: string; '*'?: string };
    const url = new URL(req.raw.url ?? '/', 'http://proxy.invalid');
    const p = presented(ctx, req.headers, url);
    if (!p.any) throw unauthenticated();
    const { socket, sandboxId, port } = await ctx.lockstep.connectExposedPort(params.exposure, p.creds);
    return new Promise<FastifyReply>((resolve, reject) => {
      socket.setTimeout(IDLE_TIMEOUT_MS, () => socket.destroy(unreachable(sandboxId, port, 'sent nothing for 60 s')));
      const up = http.request({
        method: req.method,
        path: upstreamPath(req.raw.url ?? '/', url),
        headers: forwardedHeaders(ctx, req.raw, p, `/ports/${params.exposure}`),
        createConnection: () => socket,
        maxHeaderSize: MAX_ANSWER_HEAD_BYTES,
      });
      let answered: http.IncomingMessage | undefined;
      const timer = setTimeout(
        () => up.destroy(unreachable(sandboxId, port, `did not answer within ${answerTimeoutMs} ms`)),
        answerTimeoutMs,
      );
      // The client went away: so does the connection into the sandbox.
      reply.raw.once('close', () => {
        if (!reply.raw.writableFinished) up.destroy();
      });
      up.on('response', (res) => {
        answered = res;
        clearTimeout(timer);
        const status = res.statusCode ?? 0;
        if (status < 200 || status > 599) {
          res.destroy();
          return reject(unreachable(sandboxId, port, `answered with status ${status}`));
        }
        void reply.code(status);
        for (const [k, v] of Object.entries(res.headers))
          if (v !== undefined && !HOP_BY_HOP.has(k)) void reply.header(k, v);
        // Marks the answer as the sandbox's, not the API's (RFC 9110's Via, after any the sandbox sent).
        const via = res.headers.via;
        void reply.header('via', via ? `${via}, 1.1 lockstep` : '1.1 lockstep');
        res.on('error', () => reply.raw.destroy());
        if (req.method === 'HEAD') {
          // No body follows a HEAD's answer; its headers (content-length included) are the sandbox's.
          res.resume();
          return resolve(reply.send());
        }
        resolve(reply.send(res));
      });
      up.on('error', (e) => {
        clearTimeout(timer);
        // After the answer: cut the client's copy short, unless the answer was whole (bytes the sandbox sends
        // after a complete answer, as some servers do after a HEAD's, are dropped).
        if (answered) return void (answered.complete || reply.raw.writableFinished || reply.raw.destroy());
        reject(e instanceof LockstepError ? e : unreachable(sandboxId, port, `did not answer HTTP (${e.message})`));
      });
      req.raw.pipe(up);
    });
  };
  const methods: ('GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE' | 'OPTIONS')[] = [
    'GET',
    'POST',
    'PUT',
    'PATCH',
    'DELETE',
    'OPTIONS',
  ];
  // HEAD is proxied as itself (not as a GET whose body is dropped).
  for (const url of ['/ports/:exposure', '/ports/:exposure/*'])
    app.route({ method: [...methods, 'HEAD'], url, schema: { hide: true }, exposeHeadRoute: false, handler });

  // With an upgrade listener, Node hands every request with an Upgrade header here (an HTTP
  // client may offer `Upgrade: h2c` on any call): those not for /ports are answered as plain requests.
  app.server.on('upgrade', (req: http.IncomingMessage, client: Duplex, head: Buffer) => {
    if (!/^\/ports\//.test(req.url ?? '')) return asPlainRequest(app.server, req, client as net.Socket);
    // Upgraded connections leave the HTTP server's books: the server's close ends them itself.
    upgraded.add(client);
    client.once('close', () => upgraded.delete(client));
    void upgrade(ctx, req, client, head);
  });
  const upgraded = new Set<Duplex>();
  app.addHook('preClose', async () => {
    for (const c of upgraded) c.destroy();
  });
}

/** Serves an upgrade request as the server would without an upgrade listener, then closes the connection. */
function asPlainRequest(server: http.Server, req: http.IncomingMessage, socket: net.Socket): void {
  const res = new http.ServerResponse(req);
  res.shouldKeepAlive = false;
  res.assignSocket(socket);
  res.on('finish', () => {
    res.detachSocket(socket);
    socket.end();
  });
  socket.on('error', () => socket.destroy());
  server.emit('request', req, res);
}

/** Answers an upgrade the proxy refuses, in the API's error shape. */
function refuse(client: Duplex, err: unknown): void {
  const { status, body } = toErrorResponse(err);
  const text = JSON.stringify(body);
  client.end(
    `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\n` +
      `content-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
}

/** A WebSocket (or any) upgrade to an exposed port: the head is forwarded without our credential, then bytes both ways. */
async function upgrade(ctx: ApiContext, req: http.IncomingMessage, client: Duplex, head: Buffer): Promise<void> {
  client.on('error', () => client.destroy());
  const url = new URL(req.url ?? '/', 'http://proxy.invalid');
  const m = /^\/ports\/([^/?]+)/.exec(req.url ?? '');
  if (!m) return refuse(client, new HttpError(404, 'ROUTE_NOT_FOUND', 'No route for an upgrade there'));
  const p = presented(ctx, req.headers, url);
  if (!p.any) return refuse(client, unauthenticated());
  let socket: net.Socket;
  try {
    socket = (await ctx.lockstep.connectExposedPort(m[1]!, p.creds)).socket;
  } catch (e) {
    return refuse(client, e);
  }
  const lines = [`${req.method ?? 'GET'} ${upstreamPath(req.url ?? '/', url)} HTTP/1.1`];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const k = req.rawHeaders[i]!;
    const kept = forwardedValue(ctx, p, k.toLowerCase(), req.rawHeaders[i + 1]!);
    // Hop-by-hop headers are the upgrade's own here: Connection and Upgrade go through.
    const lk = k.toLowerCase();
    if (kept !== undefined) lines.push(`${k}: ${kept}`);
    else if (HOP_BY_HOP.has(lk)) lines.push(`${k}: ${req.rawHeaders[i + 1]}`);
  }
  const end = () => {
    socket.destroy();
    client.destroy();
  };
  socket.on('error', end);
  client.on('error', end);
  socket.on('close', end);
  client.on('close', end);
  socket.setTimeout(IDLE_TIMEOUT_MS, end);
  socket.write(lines.join('\r\n') + '\r\n\r\n');
  if (head.length) socket.write(head);
  socket.pipe(client);
  client.pipe(socket);
}
