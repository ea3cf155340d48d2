/**
 * Exposed ports through a real `lockstep serve` on loopback, into real
 * sandboxes (`none` mode: loopback only, reached by the manager inside their
 * network namespace). A port is reachable with its token or its tenant's
 * credentials and unreachable without them or for another tenant (the same
 * 404 as a missing one); the credential never reaches the sandbox; bad and
 * silent ports get typed errors; a sandbox that accepts and never answers
 * gets a 502 while another tenant's request is served; a rollback keeps the
 * exposure (it reaches the restored listener), a fork does not inherit it;
 * stopping or removing the sandbox closes it (docs/network.md, "Exposed ports").
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken, type ApiClient } from '../fixtures/http-client.js';
import type { Lockstep, Sandbox } from '../../src/index.js';

const serverScript = fs.readFileSync(
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/port-server.py'),
  'utf8',
);

let ls: Lockstep;
let base: string;
let api: ApiClient;
let tokenA: string;
let tokenB: string;
const teardowns: (() => Promise<void>)[] = [];

/** Starts the echo server on `port` in the sandbox and waits until it accepts. */
async function serve(sb: Sandbox, port: number, who: string): Promise<void> {
  await sb.files.write('/workspace/server.py', serverScript);
  await sb.files.write('/workspace/who', who);
  await sb.commands.run(['python3', '/workspace/server.py', String(port)], { background: true });
  await eventually(
    async () =>
      (await sb.commands.run(['python3', '-c', `import socket; socket.create_connection(('127.0.0.1', ${port}))`]))
        .exitCode === 0,
    15_000,
    100,
  );
}

async function proxied(
  url: string,
  headers: Record<string, string> = {},
  init: RequestInit = {},
): Promise<{ status: number; body: any; text: string }> {
  const res = await fetch(url, { ...init, headers });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, body, text };
}

integration(test, () => {
  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['dev'] });
    const started = await startServer({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, ls, {
      proxyAnswerTimeoutMs: 1500,
    });
    api = started.client;
    base = started.client.base;
    tokenA = tenantToken(ls, 'ports-a');
    tokenB = tenantToken(ls, 'ports-b');
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  test.serial(
    'an exposed port answers with its token or its tenant’s token, not without, not for another tenant; the credential is not forwarded',
    async (t) => {
      const a = api.as(tokenA);
      const b = api.as(tokenB);
      const id: string = (await a.post('/v1/sandboxes', { image: 'dev', memoryMb: 256 })).body.id;
      t.teardown(() => ls.remove(id).catch(() => undefined));
      await serve(ls.get(id), 8000, 'sandbox-a');
      const exposed = await a.post(`/v1/sandboxes/${id}/ports`, { port: 8000 });
      t.is(exposed.status, 201, exposed.text);
      const { url, token, path: p } = exposed.body as { url: string; token: string; path: string };
      t.is(url, `${base}${p}`);
      t.regex(token, /^lsp_/);

      // With the token: the sandbox's own answer, below the prefix, query kept, token gone.
      const ok = await proxied(`${url}hello/there?x=1`, { 'x-lockstep-token': token });
      t.is(ok.status, 200, ok.text);
      t.is(ok.body.who, 'sandbox-a');
      t.is(ok.body.path, '/hello/there?x=1');
      t.is(ok.body.headers['x-lockstep-token'], undefined);
      t.is(ok.body.headers['x-forwarded-prefix'], p.replace(/\/$/, ''));
      // A POST body streams through; the token in the query is removed.
      const post = await proxied(`${url}form?lockstep_token=${token}&y=2`, {}, { method: 'POST', body: 'a=b' });
      t.is(post.body.method, 'POST');
      t.is(post.body.body, 'a=b');
      t.is(post.body.path, '/form?y=2');
      // The tenant's own bearer token opens it too, and is not forwarded.
      const viaTenant = await proxied(url, { authorization: `Bearer ${tokenA}` });
      t.is(viaTenant.body.who, 'sandbox-a');
      t.is(viaTenant.body.headers.authorization, undefined);
      // An application's own Authorization passes through when the token is sent apart.
      const appAuth = await proxied(url, { 'x-lockstep-token': token, authorization: 'Basic YXBwOnB3' });
      t.is(appAuth.body.headers.authorization, 'Basic YXBwOnB3');

      // Without credentials: 401. Wrong token, another tenant, a missing id: the same 404.
      const none = await proxied(url);
      t.is(none.status, 401);
      t.is(none.body.error.code, 'UNAUTHENTICATED');
      const missingUrl = `${base}/ports/exp_0000000000000000/`;
      const cases: [string, Record<string, string>][] = [
        ['wrong token', { 'x-lockstep-token': `${token}x` }],
        ['another tenant', { authorization: `Bearer ${tokenB}` }],
        ['a token of no one', { authorization: 'Bearer lsp_nothing' }],
      ];
      for (const [what, headers] of cases) {
        const r = await proxied(url, headers);
        const m = await proxied(missingUrl, headers);
        t.is(r.status, 404, what);
        t.is(r.body.error.code, 'EXPOSURE_NOT_FOUND', what);
        t.deepEqual(
          r.text.replace(p.split('/')[2]!, '<ID>'),
          m.text.replace('exp_0000000000000000', '<ID>'),
          `${what}: same as a missing id`,
        );
      }
      // Tenant B sees nothing of it through the API either.
      t.is((await b.get(`/v1/sandboxes/${id}/ports`)).status, 404);
      t.is((await b.del(`/v1/sandboxes/${id}/ports/8000`)).status, 404);
      const listed = (await a.get(`/v1/sandboxes/${id}/ports`)).body as { port: number; token?: string }[];
      t.deepEqual(
        listed.map((e) => [e.port, e.token]),
        [[8000, undefined]],
      );
      // Only the hash is stored.
      const rows = ls.engine.catalog.db.prepare('SELECT * FROM exposures WHERE sandbox_id = ?').all(id) as {
        token_hash: string;
      }[];
      t.is(rows.length, 1);
      t.false(JSON.stringify(rows).includes(token));

      // A WebSocket-style upgrade goes through, without the token.
      const upgraded = await new Promise<string>((resolve, reject) => {
        const s = net.connect({ host: '127.0.0.1', port: Number(new URL(base).port) });
        let got = '';
        s.on('data', (d) => {
          got += d.toString();
          if (got.includes('\r\n\r\n') && !got.includes('ping-42')) s.write('ping-42');
          if (got.includes('ping-42')) {
            s.destroy();
            resolve(got);
          }
        });
        s.on('error', reject);
        s.write(
          `GET ${p}ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Lockstep-Token: ${token}\r\n\r\n`,
        );
      });
      t.regex(upgraded, /^HTTP\/1\.1 101 /);
      t.regex(upgraded, /X-Saw-Token: no/);
      // An Upgrade offered on any other route (as HTTP/2 clients offer h2c) is answered as a plain request.
      const plain = await new Promise<string>((resolve) => {
        const s = net.connect({ host: '127.0.0.1', port: Number(new URL(base).port) });
        let got = '';
        s.on('data', (d) => (got += d.toString()));
        s.on('close', () => resolve(got));
        s.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\r\n`);
      });
      t.regex(plain, /^HTTP\/1\.1 200 [^]*"ok":true/);

      // Closing it: the URL stops working, and closing again is no error.
      t.deepEqual((await a.del(`/v1/sandboxes/${id}/ports/8000`)).body, { port: 8000, closed: true });
      t.is((await proxied(url, { 'x-lockstep-token': token })).status, 404);
      t.deepEqual((await a.del(`/v1/sandboxes/${id}/ports/8000`)).body, { port: 8000, closed: false });
    },
  );

  test.serial(
    'no Lockstep credential reaches the sandbox: the port token with the tenant’s bearer token too, a token in Basic or a cookie, over HTTP and an upgrade',
    async (t) => {
      const a = api.as(tokenA);
      const id: string = (await a.post('/v1/sandboxes', { image: 'dev', memoryMb: 256 })).body.id;
      t.teardown(() => ls.remove(id).catch(() => undefined));
      await serve(ls.get(id), 8001, 'sandbox-creds');
      const exposed = await a.post(`/v1/sandboxes/${id}/ports`, { port: 8001 });
      t.is(exposed.status, 201, exposed.text);
      const { url, token, path: p } = exposed.body as { url: string; token: string; path: string };
      const basicOf = (user: string, pw: string) => `Basic ${Buffer.from(`${user}:${pw}`).toString('base64')}`;

      // As API clients do: the port token in its header and the tenant's bearer token as well.
      const both = await proxied(url, { 'x-lockstep-token': token, authorization: `Bearer ${tokenA}` });
      t.is(both.status, 200, both.text);
      t.is(both.body.who, 'sandbox-creds');
      t.is(both.body.headers.authorization, undefined, 'the tenant token is not forwarded');
      // Another tenant's token, or the exposure's own, in Authorization beside the token query: dropped too.
      for (const auth of [`Bearer ${tokenB}`, `Bearer ${token}`, basicOf('x', tokenA)]) {
        const r = await proxied(`${url}?lockstep_token=${token}`, { authorization: auth });
        t.is(r.status, 200, r.text);
        t.is(r.body.headers.authorization, undefined, auth.slice(0, 12));
      }
      // Cookies: Lockstep's (reserved lockstep* names, or a token as the value) dropped, the application's kept.
      const cookied = await proxied(url, {
        'x-lockstep-token': token,
        cookie: `app=1; lockstep_session=abc; stolen=${tokenA}; theme=dark`,
      });
      t.is(cookied.body.headers.cookie, 'app=1; theme=dark');
      const onlyOurs = await proxied(url, { 'x-lockstep-token': token, cookie: `lockstep=1; t=${token}` });
      t.is(onlyOurs.body.headers.cookie, undefined);
      // The application's own Authorization still reaches it.
      const app = await proxied(url, { 'x-lockstep-token': token, authorization: basicOf('app', 'pw') });
      t.is(app.body.headers.authorization, basicOf('app', 'pw'));

      // An upgrade with the token, the tenant's bearer token and a Lockstep cookie: the sandbox sees none of them.
      const upgraded = await new Promise<string>((resolve, reject) => {
        const s = net.connect({ host: '127.0.0.1', port: Number(new URL(base).port) });
        let got = '';
        const timer = setTimeout(() => reject(new Error(`no upgrade answer within 10 s: ${got}`)), 10_000);
        s.on('data', (d) => {
          got += d.toString();
          if (got.includes('\r\n\r\n')) {
            clearTimeout(timer);
            s.destroy();
            resolve(got);
          }
        });
        s.on('error', reject);
        s.write(
          `GET ${p}ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Lockstep-Token: ${token}\r\n` +
            `Authorization: Bearer ${tokenA}\r\nCookie: lockstep_s=1; app=2\r\n\r\n`,
        );
      });
      t.regex(upgraded, /^HTTP\/1\.1 101 /);
      t.regex(upgraded, /X-Saw-Token: no\r\n/);
      t.regex(upgraded, /X-Saw-Authorization: -\r\n/);
      t.regex(upgraded, /X-Saw-Cookie: app=2\r\n/);
    },
  );

  test.serial('bad ports and silent ports are typed errors; nothing is recorded for them', async (t) => {
    const sb = await ls.create({ image: 'dev', memoryMb: 256, tenant: tenantId(ls, 'ports-a') });
    t.teardown(() => sb.kill().catch(() => undefined));
    for (const bad of [0, 65536, -1, 1.5, 'http' as unknown as number])
      await t.throwsAsync(sb.ports.expose(bad), { code: 'INVALID_ARGUMENT' }, String(bad));
    const e = await t.throwsAsync(sb.ports.expose(8999));
    t.is((e as { code?: string }).code, 'PORT_NOT_LISTENING');
    const a = api.as(tokenA);
    const r = await a.post(`/v1/sandboxes/${sb.id}/ports`, { port: 70000 });
    t.is(r.status, 400);
    t.is(r.body.error.field, 'port');
    const silent = await a.post(`/v1/sandboxes/${sb.id}/ports`, { port: 8999 });
    t.is(silent.status, 409);
    t.is(silent.body.error.code, 'PORT_NOT_LISTENING');
    t.is((await a.del(`/v1/sandboxes/${sb.id}/ports/abc`)).body.error.field, 'port');
    t.deepEqual(sb.ports.list(), []);
  });

  test.serial(
    'a sandbox that accepts and never answers, or never accepts, gets a 502 after the bound, and another tenant is served meanwhile; removing its tenant closes its port',
    async (t) => {
      const hostile = await ls.create({ image: 'dev', memoryMb: 256, tenant: tenantId(ls, 'ports-b') });
      const fine = await ls.create({ image: 'dev', memoryMb: 256, tenant: tenantId(ls, 'ports-a') });
      t.teardown(() => hostile.kill().catch(() => undefined));
      t.teardown(() => fine.kill().catch(() => undefined));
      await serve(hostile, 8000, 'hostile');
      await serve(fine, 8000, 'fine');
      const h = await hostile.ports.expose(8000);
      const f = await fine.ports.expose(8000);
      const order: string[] = [];
      const hung = proxied(`${base}${h.path}hang`, { 'x-lockstep-token': h.token }).then((r) => {
        order.push('hung');
        return r;
      });
      const served = proxied(`${base}${f.path}`, { 'x-lockstep-token': f.token }).then((r) => {
        order.push('served');
        return r;
      });
      const [hr, sr] = await Promise.all([hung, served]);
      t.is(sr.body.who, 'fine');
      t.is(hr.status, 502);
      t.is(hr.body.error.code, 'PORT_UNREACHABLE');
      t.deepEqual(order, ['served', 'hung']);
      // The server is still fine for everyone.
      t.is((await proxied(`${base}${f.path}`, { 'x-lockstep-token': f.token })).body.who, 'fine');
      // A listener whose accept queue is full (it never accepts): the connect inside the sandbox gives up
      // after its bound, on a thread of its own, and the answer is the same typed 502.
      await hostile.commands.run(
        [
          'python3',
          '-c',
          "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',8100))\ns.listen(0)\ntime.sleep(3600)",
        ],
        { background: true },
      );
      const full = (await eventually(() => hostile.ports.expose(8100).catch(() => undefined), 15_000, 100))!;
      const stuck = proxied(`${base}${full.path}`, { 'x-lockstep-token': full.token });
      t.is((await proxied(`${base}${f.path}`, { 'x-lockstep-token': f.token })).body.who, 'fine');
      const sr2 = await stuck;
      t.is(sr2.status, 502);
      t.is(sr2.body.error.code, 'PORT_UNREACHABLE');
      t.regex(sr2.body.error.message, /did not accept a connection within 3000 ms/);
      // Removing the tenant closes its exposures (its sandboxes go); the other tenant's stays.
      await ls.tenants.purge('ports-b');
      t.is((await proxied(`${base}${h.path}`, { 'x-lockstep-token': h.token })).status, 404);
      t.is((await proxied(`${base}${f.path}`, { 'x-lockstep-token': f.token })).body.who, 'fine');
    },
  );

  test.serial(
    'a checkpoint taken while a proxied connection is open succeeds and the connection carries on; a rollback to it closes that connection, and the restored listener answers',
    async (t) => {
      const sb = await ls.create({ image: 'dev', memoryMb: 256 });
      t.teardown(() => sb.kill().catch(() => undefined));
      await serve(sb, 8000, 'open');
      const e = await sb.ports.expose(8000);
      // An upgraded (echo) connection through the proxy: the sandbox holds an established TCP socket.
      const s = net.connect({ host: '127.0.0.1', port: Number(new URL(base).port) });
      t.teardown(() => s.destroy());
      let got = '';
      const closed = new Promise<void>((resolve) => s.on('close', () => resolve()));
      s.on('data', (d) => (got += d.toString()));
      s.on('error', () => undefined);
      s.write(
        `GET ${e.path}ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Lockstep-Token: ${e.token}\r\n\r\n`,
      );
      await eventually(() => got.includes('\r\n\r\n'), 10_000, 20);
      t.regex(got, /^HTTP\/1\.1 101 /);

      const ckpt = await sb.checkpoint();
      // The dump left the tree running: the connection still echoes.
      s.write('after-checkpoint');
      await eventually(() => got.includes('after-checkpoint'), 10_000, 20);

      await sb.settled();
      await sb.rollback(ckpt.id);
      // The restored tree got its sockets back closed: the proxied connection ends ...
      await closed;
      // ... and the restored listener answers a new request through the same exposure.
      const r = await eventually(
        async () => (await proxied(`${base}${e.path}`, { 'x-lockstep-token': e.token })).body.who,
        10_000,
        100,
      );
      t.is(r, 'open');
    },
  );

  test.serial(
    'a rollback keeps the exposure (it reaches the restored listener); a fork does not inherit it; stop and remove close it',
    async (t) => {
      const sb = await ls.create({ image: 'dev', memoryMb: 256 });
      t.teardown(() => sb.kill().catch(() => undefined));
      await serve(sb, 8000, 'v1');
      const e = await sb.ports.expose(8000);
      const url = `${base}${e.path}`;
      const hdr = { 'x-lockstep-token': e.token };
      t.is((await proxied(url, hdr)).body.who, 'v1');
      const ckpt = await sb.checkpoint();
      await sb.files.write('/workspace/who', 'v2');
      t.is((await proxied(url, hdr)).body.who, 'v2');

      // Fork: its own sandbox, no exposure; the parent's URL still reaches the parent.
      const [res] = await sb.fork(ckpt.id);
      t.true(res!.ok, JSON.stringify(res));
      const child = ls.get((res as { id: string }).id);
      t.teardown(() => child.kill().catch(() => undefined));
      t.deepEqual(child.ports.list(), []);
      t.is((await proxied(url, hdr)).body.who, 'v2');
      const ce = await child.ports.expose(8000);
      t.not(ce.id, e.id);
      t.is((await proxied(`${base}${ce.path}`, { 'x-lockstep-token': ce.token })).body.who, 'v1');
      t.is((await proxied(`${base}${ce.path}`, hdr)).status, 404, "the parent's token does not open the fork's");

      // Rollback (warm standby: a new tree in a new namespace): same URL and token, the restored listener answers.
      await sb.settled();
      const report = await sb.rollback(ckpt.id);
      t.is(report.path, 'standby');
      t.deepEqual(
        sb.ports.list().map((x) => x.id),
        [e.id],
      );
      t.is((await eventually(async () => (await proxied(url, hdr)).body.who, 10_000, 100)) as string, 'v1');
      // The CRIU path too.
      await sb.checkpoint();
      await sb.settled();
      t.is((await sb.rollback(ckpt.id)).path, 'restore');
      t.is((await eventually(async () => (await proxied(url, hdr)).body.who, 10_000, 100)) as string, 'v1');

      // Removing the fork closes its exposure, rows included.
      await child.kill();
      t.is((await proxied(`${base}${ce.path}`, { 'x-lockstep-token': ce.token })).status, 404);
      t.is(
        (
          ls.engine.catalog.db.prepare('SELECT COUNT(*) AS n FROM exposures WHERE sandbox_id = ?').get(child.id) as {
            n: number;
          }
        ).n,
        0,
      );
      // Stopping the sandbox (its init exits) closes the parent's.
      await sb.commands.run(['kill', '-TERM', '1']).catch(() => undefined);
      await eventually(() => ls.get(sb.id).info().state === 'stopped', 15_000, 100);
      t.deepEqual(sb.ports.list(), []);
      t.is((await proxied(url, hdr)).status, 404);
    },
  );
});
