/**
 * Tenant quotas on sandboxes are the verbs' policy, not the front ends': an
 * SDK caller (no HTTP) is refused past maxSandboxes on a create, a fork and
 * a start from a snapshot; a second manager process on the same state
 * directory is refused past maxMemoryMb; and two processes racing for a
 * tenant's last slot get exactly one sandbox, the loser leaving nothing in
 * the catalog or on the host.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import type { Lockstep } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { tenantId, tenantToken } from '../fixtures/http-client.js';
import { hostState } from '../fixtures/host-state.js';

const CREATOR = fileURLToPath(new URL('../../../test/fixtures/quota-create.mjs', import.meta.url));

interface Outcome {
  ok: boolean;
  id?: string;
  code?: string | null;
  details?: Record<string, unknown> | null;
}

/** A second manager process that creates one sandbox (test/fixtures/quota-create.mjs). */
function creator(args: string[]) {
  const child = spawn(process.execPath, [CREATOR, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let onReady: () => void;
  const ready = new Promise<void>((r) => (onReady = r));
  child.stdout.on('data', (b: Buffer) => {
    out += b.toString();
    if (out.includes('ready\n')) onReady();
  });
  child.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const outcome = new Promise<Outcome>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => {
      const line = out.split('\n').find((l) => l.startsWith('result '));
      if (!line) return reject(new Error(`quota-create exited ${code} without a result: ${err.slice(-2000)}`));
      resolve(JSON.parse(line.slice('result '.length)) as Outcome);
    });
  });
  return { ready, outcome };
}

/** Names on the host (run folders, cgroups, writable layers) that no sandbox of the catalog owns. */
function unowned(ls: Lockstep): string[] {
  const keys = new Set(ls.engine.catalog.instanceKeys());
  const s = hostState(ls);
  return [
    ...s.runFolders.filter((n) => !keys.has(n)).map((n) => `run:${n}`),
    ...s.cgroups.filter((n) => !keys.has(n.slice(n.indexOf(':') + 1))).map((n) => `cgroup:${n}`),
    ...s.uppers.filter((n) => !keys.has(n)).map((n) => `upper:${n}`),
  ];
}

integration(test, () => {
  test.serial(
    'an SDK caller past maxSandboxes is refused a create, a fork and a start from a snapshot (QUOTA_EXCEEDED), and nothing is made',
    async (t) => {
      const ls = await openTestLockstep(t);
      tenantToken(ls, 'one', { maxSandboxes: 1 });
      const tenant = tenantId(ls, 'one');
      const a = await ls.create({ image: 'base', memoryMb: 64, tenant });
      const e = await t.throwsAsync(ls.create({ image: 'base', memoryMb: 64, tenant }), { code: 'QUOTA_EXCEEDED' });
      t.like((e as unknown as { details: object }).details, { quota: 'maxSandboxes', limit: 1, used: 1, requested: 1 });

      const ck = await a.checkpoint();
      const f = await t.throwsAsync(a.fork(ck.id), { code: 'QUOTA_EXCEEDED' });
      t.like((f as unknown as { details: object }).details, { quota: 'maxSandboxes', requested: 1 });
      await a.durable(ck.id);
      await ls.snapshots.create(ck.id, { name: 'one-snap', tenant });
      await t.throwsAsync(ls.create({ fromSnapshot: 'one-snap', tenant }), { code: 'QUOTA_EXCEEDED' });
      await t.throwsAsync(ls.snapshots.start('one-snap', { count: 2, tenant }), { code: 'QUOTA_EXCEEDED' });

      t.deepEqual(
        ls.list(tenant).map((s) => s.id),
        [a.id],
      );
      t.deepEqual(ls.engine.catalog.operations(), [], 'no journal entry left');
      await a.settled();
      t.deepEqual(unowned(ls), [], 'nothing on the host beyond the one sandbox (and its standby)');
    },
  );

  test.serial('a second manager process is refused past maxMemoryMb; room freed lets it through', async (t) => {
    const ls = await openTestLockstep(t);
    tenantToken(ls, 'mem', { maxMemoryMb: 192 });
    const tenant = tenantId(ls, 'mem');
    const a = await ls.create({ image: 'base', memoryMb: 128, tenant });

    const refused = await creator([ls.home, tenant, '128']).outcome;
    t.like(refused, {
      ok: false,
      code: 'QUOTA_EXCEEDED',
      details: { quota: 'maxMemoryMb', limit: 192, used: 128, requested: 128 },
    });
    t.is(ls.list(tenant).length, 1);

    await ls.remove(a.id);
    const made = await creator([ls.home, tenant, '128']).outcome;
    t.true(made.ok, JSON.stringify(made));
    t.deepEqual(
      ls.list(tenant).map((s) => s.id),
      [made.id],
    );
  });

  test.serial(
    "two manager processes racing for a tenant's last slot: exactly one wins; the loser leaves no row, layer or cgroup",
    async (t) => {
      const ls = await openTestLockstep(t);
      tenantToken(ls, 'racy', { maxSandboxes: 1 });
      const tenant = tenantId(ls, 'racy');
      const go = path.join(ls.home, 'go');
      const racers = [creator([ls.home, tenant, '32', go]), creator([ls.home, tenant, '32', go])];
      await Promise.all(racers.map((r) => r.ready));
      fs.writeFileSync(go, '');
      const outcomes = await Promise.all(racers.map((r) => r.outcome));

      const winners = outcomes.filter((o) => o.ok);
      t.is(winners.length, 1, JSON.stringify(outcomes));
      t.like(
        outcomes.find((o) => !o.ok),
        { code: 'QUOTA_EXCEEDED', details: { quota: 'maxSandboxes' } },
      );
      t.deepEqual(
        ls.engine.catalog.allSandboxes().map((r) => r.id),
        [winners[0]!.id],
        'one catalog row: the winner',
      );
      t.deepEqual(ls.engine.catalog.operations(), []);
      t.deepEqual(unowned(ls), [], 'no layer, run folder or cgroup of the loser');
      t.deepEqual(hostState(ls).uppers, [winners[0]!.id]);
    },
  );
});
