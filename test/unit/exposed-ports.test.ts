/**
 * Exposed ports' bookkeeping against a real catalog, with the connection
 * into the sandbox faked (the addon's connectInNetns is what the integration
 * test runs): port validation, what the catalog keeps (the token's hash
 * only), who an exposure opens for, and that stopping or removing the
 * sandbox closes its exposures.
 */
import test from 'ava';
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { Catalog, type SandboxRow } from '../../src/catalog/catalog.js';
import { ExposedPorts, validatePort } from '../../src/network/exposed-ports.js';
import type { Engine } from '../../src/api/engine.js';

function setup(t: { teardown: (fn: () => void) => void }, connect: (port: number) => Promise<number>) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-exposures-'));
  const catalog = new Catalog(path.join(dir, 'catalog.db'));
  catalog.putImage({ name: 'base', rootfs: '/nowhere', source: 'test', size_bytes: 0, created_at: 0, deleted: 0 });
  const engine = {
    catalog,
    config: { publicUrl: 'https://lockstep.example' },
    clock: { now: () => 1_700_000_000_000 },
    proc: { startTime: (pid: number) => (pid === 4242 ? 77 : undefined) },
    native: {
      pidfdOpen: () => fs.openSync('/dev/null', 'r'),
      connectInNetns: (_pidfd: number, port: number) => connect(port),
    },
  } as unknown as Engine;
  const exposures = new ExposedPorts(engine);
  t.teardown(() => {
    catalog.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  let n = 0;
  const sandbox = (tenant: string | null): SandboxRow => {
    const id = `sbx_unit${n++}`;
    catalog.db
      .prepare(
        `INSERT INTO sandboxes (id, tenant, image, runtime_layer, state, init_pid, init_start, hostname, lineage_id, branch_id, created_at, instance)
         VALUES (?, ?, 'base', 'rt', 'running', 4242, 77, ?, 'lin', 'br', 0, ?)`,
      )
      .run(id, tenant, id, id);
    return catalog.sandbox(id)!;
  };
  return { catalog, exposures, sandbox };
}

/**
 * An fd that net.Socket can wrap, standing in for the connected socket
 * connectInNetns hands back: a FIFO opened read-write (Node has no way to
 * duplicate a socket's fd, and a socket cannot be reopened through /proc).
 */
function streamFd(t: { teardown: (fn: () => void) => void }): number {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-fifo-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  execFileSync('mkfifo', [path.join(dir, 'f')]);
  return fs.openSync(path.join(dir, 'f'), fs.constants.O_RDWR | fs.constants.O_NONBLOCK);
}

test('ports: integers 1-65535 (or their decimal text), nothing else', (t) => {
  for (const ok of [1, 80, 65535, '8080']) t.is(validatePort(ok), Number(ok));
  for (const bad of [0, -1, 65536, 1.5, NaN, '80a', '', '0x50', null, undefined, {}, [80]])
    t.throws(() => validatePort(bad), { code: 'INVALID_ARGUMENT' }, JSON.stringify(bad));
  t.is((t.throws(() => validatePort(70000)) as { field?: string }).field, 'port');
});

test('an exposure keeps only the hash of its token, opens for the token or its tenant only, and a refused connect records nothing', async (t) => {
  const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
  let listening = false;
  const { catalog, exposures, sandbox } = setup(t, async () => {
    if (!listening) throw refused;
    return streamFd(t);
  });
  const row = sandbox('tn_a');
  await t.throwsAsync(exposures.expose(row, 8080), { code: 'PORT_NOT_LISTENING' });
  t.deepEqual(exposures.list(row.id), []);
  listening = true;
  const e = await exposures.expose(row, 8080);
  t.regex(e.id, /^exp_[0-9a-f]{16}$/);
  t.is(e.url, `https://lockstep.example/ports/${e.id}/`);
  t.false(JSON.stringify(catalog.db.prepare('SELECT * FROM exposures').all()).includes(e.token));
  t.deepEqual(exposures.list(row.id), [
    { id: e.id, sandboxId: row.id, port: 8080, path: e.path, url: e.url, createdAt: '2023-11-14T22:13:20.000Z' },
  ]);
  t.is(exposures.authorize(e.id, { token: e.token }).port, 8080);
  t.is(exposures.authorize(e.id, { tenant: 'tn_a' }).sandboxId, row.id);
  for (const creds of [{ token: `${e.token}x` }, { tenant: 'tn_b' }, { tenant: null }, {}])
    t.throws(() => exposures.authorize(e.id, creds), { code: 'EXPOSURE_NOT_FOUND' }, JSON.stringify(creds));
  t.throws(() => exposures.authorize('exp_0000000000000000', { token: e.token }), { code: 'EXPOSURE_NOT_FOUND' });
  t.throws(() => exposures.authorize('../etc', { token: e.token }), { code: 'EXPOSURE_NOT_FOUND' });

  // Exposing it again: a new token, the old one stops working.
  const again = await exposures.expose(row, 8080);
  t.throws(() => exposures.authorize(again.id, { token: e.token }), { code: 'EXPOSURE_NOT_FOUND' });
  t.is(exposures.authorize(again.id, { token: again.token }).port, 8080);
  t.is(exposures.list(row.id).length, 1);
  // Close: false the second time.
  t.true(exposures.close(row.id, 8080));
  t.false(exposures.close(row.id, 8080));
});

test('stopping or removing the sandbox closes its exposures; a stopped sandbox cannot expose', async (t) => {
  const { catalog, exposures, sandbox } = setup(t, async () => streamFd(t));
  const a = sandbox(null);
  const b = sandbox(null);
  await exposures.expose(a, 1);
  await exposures.expose(b, 2);
  catalog.updateSandbox(a.id, { state: 'stopped', init_pid: null, init_start: null });
  t.deepEqual(exposures.list(a.id), []);
  t.is(exposures.list(b.id).length, 1);
  await t.throwsAsync(exposures.expose(catalog.sandbox(a.id)!, 1), { code: 'SANDBOX_NOT_RUNNING' });
  catalog.deleteSandboxRow(b.id);
  t.is((catalog.db.prepare('SELECT COUNT(*) AS n FROM exposures').get() as { n: number }).n, 0);
});
