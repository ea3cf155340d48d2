/**
 * The members of Lockstep the front ends use instead of the engine (the CLI,
 * the HTTP server and MCP reach nothing else): `tenants`, its stored replies,
 * `logger`, and a sandbox's `tree()`. On the fake host, without root.
 */
import test from 'ava';
import pino from 'pino';
import { Writable } from 'node:stream';
import { openFake } from '../fakes/manager.js';

test('tenants: add, get, list, authenticate, usage, quota and remove, keyed by the tenant id', async (t) => {
  const { ls } = await openFake(t);
  const { tenant, token } = ls.tenants.add('acme', { maxSandboxes: 1 });
  t.is(ls.tenants.get('acme').id, tenant.id);
  t.is(ls.tenants.byId(tenant.id)?.name, 'acme');
  t.is(ls.tenants.byId('tn_missing'), undefined);
  t.deepEqual(
    ls.tenants.list().map((x) => x.name),
    ['acme'],
  );
  t.is(ls.tenants.authenticate(token)?.id, tenant.id);
  t.is(ls.tenants.authenticate(token + 'x'), undefined);
  t.throws(() => ls.tenants.add('acme'), { code: 'TENANT_EXISTS' });

  await ls.create({ tenant: tenant.id, memoryMb: 64 });
  t.like(ls.tenants.usage(tenant.id), { sandboxes: 1, memoryMb: 64 });
  t.throws(() => ls.tenants.checkQuota(tenant, { count: 1, memoryMb: 64 }), { code: 'QUOTA_EXCEEDED' });
  t.throws(() => ls.tenants.remove('acme'), { code: 'TENANT_HAS_SANDBOXES' });
  t.throws(() => ls.tenants.get('nobody'), { code: 'TENANT_NOT_FOUND' });
});

test('tenants.purge removes the sandboxes, then the tenant and its stored replies', async (t) => {
  const { ls } = await openFake(t);
  const { tenant, token } = ls.tenants.add('acme');
  const sb = await ls.create({ tenant: tenant.id });
  ls.tenants.replies.put(tenant.id, 'k1', 'hash', { status: 201, body: '{}', streamed: false }, 1000);
  t.like(ls.tenants.replies.find(tenant.id, 'k1'), { status: 201, requestHash: 'hash', createdAt: 1000 });

  const report = await ls.tenants.purge('acme');
  t.deepEqual(report, { tenant: 'acme', tenantId: tenant.id, sandboxes: [sb.id] });
  t.deepEqual(ls.list(), []);
  t.deepEqual(ls.tenants.list(), []);
  t.is(ls.tenants.authenticate(token), undefined);
  t.is(ls.tenants.replies.find(tenant.id, 'k1'), undefined);
});

test('stored replies: replaced under the same key, swept by age, forgotten per tenant', async (t) => {
  const { ls } = await openFake(t);
  const r = ls.tenants.replies;
  r.put('tn_a', 'k', 'h1', { status: 200, body: 'one', streamed: false }, 10);
  r.put('tn_a', 'k', 'h2', { status: 201, body: 'two', streamed: true }, 20);
  r.put('tn_b', 'k', 'h3', { status: 200, body: 'three', streamed: false }, 30);
  t.deepEqual(r.find('tn_a', 'k'), {
    requestHash: 'h2',
    status: 201,
    body: 'two',
    streamed: true,
    createdAt: 20,
    kept: true,
    replyBytes: 3,
  });
  t.is(r.deleteUpTo(20), 1);
  t.is(r.find('tn_a', 'k'), undefined);
  r.forgetTenant('tn_b');
  t.is(r.find('tn_b', 'k'), undefined);
});

test('logger is the one given to open(); a sandbox draws its checkpoint tree', async (t) => {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  const { ls } = await openFake(t, { open: { logger: pino({ level: 'info' }, sink) } });
  ls.logger.child({ component: 'test' }).info('hello');
  t.true(lines.some((l) => l.includes('"component":"test"') && l.includes('"msg":"hello"')));

  const sb = await ls.create();
  const c1 = await sb.checkpoint({ label: 'first' });
  const tree = sb.tree();
  t.true(tree.includes(c1.id), tree);
  t.true(tree.includes('first'), tree);
});
