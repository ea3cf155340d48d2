import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { Catalog, type SandboxState } from '../../src/catalog/catalog.js';
import { MIGRATIONS, type TableGroup } from '../../src/catalog/migrations.js';
import {
  addTenant,
  authenticate,
  getTenant,
  listTenants,
  migrateTenants,
  removeTenant,
  revokeTenantToken,
  TOKEN_PREFIX,
  type TenantQuotas,
} from '../../src/tenants/tenants.js';
import {
  QuotaGate,
  StoreReservation,
  checkLayerQuota,
  checkStoredQuota,
  checkQuota,
  checkStandbyQuota,
  tenantUsage,
} from '../../src/tenants/quotas.js';

function catalog(t: { teardown: (fn: () => void) => void }): Catalog {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-tenants-'));
  const c = new Catalog(path.join(dir, 'catalog.db'));
  c.putImage({ name: 'base', rootfs: '/nowhere', source: 'test', size_bytes: 0, created_at: 0, deleted: 0 });
  t.teardown(() => {
    c.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return c;
}

/** Closes c, sets its file back to the version before the first step of a group of tables, and opens it again. */
function reopenBefore(t: { teardown: (fn: () => void) => void }, c: Catalog, group: TableGroup): Catalog {
  c.db.pragma(`user_version = ${MIGRATIONS.find((m) => m.group === group)!.version - 1}`);
  const file = c.db.name;
  c.close();
  const again = new Catalog(file);
  t.teardown(() => again.close());
  return again;
}

let n = 0;
/** A sandbox row with just what quotas read (raw SQL, so the test does not follow every catalog column). */
function sandbox(c: Catalog, tenant: string | null, memoryMb: number, state: SandboxState = 'running'): string {
  const id = `sbx_unit${n++}`;
  c.db
    .prepare(
      `INSERT INTO sandboxes (id, tenant, image, runtime_layer, state, memory_bytes, hostname, lineage_id, branch_id, created_at)
       VALUES (?, ?, 'base', 'rt', ?, ?, ?, 'lin', 'br', ?)`,
    )
    .run(id, tenant, state, memoryMb * 1024 * 1024, id, Date.now());
  return id;
}

test('a token is shown once: only its sha256 is stored, and it authenticates its tenant only', (t) => {
  const c = catalog(t);
  const a = addTenant(c.db, 'acme', { maxSandboxes: 3 }, () => 1_700_000_000_000);
  const b = addTenant(c.db, 'globex');
  t.true(a.token.startsWith(TOKEN_PREFIX));
  t.is(Buffer.from(a.token.slice(TOKEN_PREFIX.length), 'base64url').length, 32);
  t.not(a.token, b.token);
  t.deepEqual(a.tenant, {
    id: a.tenant.id,
    name: 'acme',
    createdAt: '2023-11-14T22:13:20.000Z',
    maxSandboxes: 3,
    maxMemoryMb: null,
    cpuWeight: null,
    maxCpuWeight: null,
    maxCheckpointMb: null,
    maxDiskMb: null,
    network: null,
    maxNetwork: null,
  });
  t.regex(a.tenant.id, /^tn_[a-z2-7]{20}$/);
  t.not(a.tenant.id, b.tenant.id);

  const stored = c.db.prepare('SELECT * FROM tenants WHERE name = ?').get('acme') as Record<string, unknown>;
  t.deepEqual(stored.token_hash, createHash('sha256').update(a.token).digest());
  const dump = JSON.stringify(c.db.prepare('SELECT * FROM tenants').all());
  t.false(dump.includes(a.token.slice(TOKEN_PREFIX.length)), 'the token itself is nowhere in the table');

  t.is(authenticate(c.db, a.token)?.name, 'acme');
  t.is(authenticate(c.db, b.token)?.name, 'globex');
  for (const bad of [
    undefined,
    '',
    'acme',
    a.token + 'x',
    a.token.slice(0, -1),
    a.token.replace(TOKEN_PREFIX, 'xxx_'),
    42,
    TOKEN_PREFIX + 'a'.repeat(500),
  ]) {
    t.is(authenticate(c.db, bad), undefined, String(bad));
  }
});

test('names are validated; a name is unique; removal revokes the token and refuses while sandboxes remain', (t) => {
  const c = catalog(t);
  for (const bad of ['', 'Acme', 'a b', '-x', 'x'.repeat(64), '../x'])
    t.throws(() => addTenant(c.db, bad), { code: 'INVALID_ARGUMENT' }, bad);
  t.throws(() => addTenant(c.db, 'ok', { maxSandboxes: -1 }), { code: 'INVALID_ARGUMENT', message: /maxSandboxes/ });
  t.throws(() => addTenant(c.db, 'ok', { maxMemoryMb: 1.5 }), { code: 'INVALID_ARGUMENT', message: /maxMemoryMb/ });
  const { token } = addTenant(c.db, 'acme');
  t.throws(() => addTenant(c.db, 'acme'), { code: 'TENANT_EXISTS' });
  t.deepEqual(
    listTenants(c.db).map((x) => x.name),
    ['acme'],
  );

  const id = sandbox(c, getTenant(c.db, 'acme').id, 64);
  t.throws(() => removeTenant(c.db, 'acme'), { code: 'TENANT_HAS_SANDBOXES' });
  t.is(authenticate(c.db, token)?.name, 'acme');
  c.deleteSandboxRow(id);
  removeTenant(c.db, 'acme');
  t.is(authenticate(c.db, token), undefined);
  t.throws(() => getTenant(c.db, 'acme'), { code: 'TENANT_NOT_FOUND' });
  t.throws(() => removeTenant(c.db, 'acme'), { code: 'TENANT_NOT_FOUND' });

  // A sandbox being removed still belongs to the tenant: the row stays until
  // it is gone (tenants/purge.ts tears sandboxes down first).
  const forced = addTenant(c.db, 'forced');
  const half = sandbox(c, forced.tenant.id, 64, 'removing');
  t.throws(() => removeTenant(c.db, 'forced'), { code: 'TENANT_HAS_SANDBOXES' });
  // Revoked first, as a forced removal does: the token stops working, the tenant is still listed.
  revokeTenantToken(c.db, 'forced');
  t.is(authenticate(c.db, forced.token), undefined);
  t.deepEqual(
    listTenants(c.db).map((x) => x.name),
    ['forced'],
  );
  c.deleteSandboxRow(half);
  removeTenant(c.db, 'forced');
  t.deepEqual(listTenants(c.db), []);
});

test('removing a tenant forgets its stored idempotent responses', (t) => {
  const c = catalog(t);
  // The catalog has the replies table (src/catalog/schema/replies.ts).
  const { tenant } = addTenant(c.db, 'acme');
  c.db
    .prepare(
      "INSERT INTO http_idempotency (tenant, key, request_hash, status, body, streamed, created_at) VALUES (?, 'k', 'h', 201, '{}', 0, 0), ('tn_other', 'k', 'h', 201, '{}', 0, 0), ('acme', 'k2', 'h', 201, '{}', 0, 0)",
    )
    .run(tenant.id);
  removeTenant(c.db, 'acme');
  t.deepEqual(
    c.db.prepare('SELECT tenant FROM http_idempotency ORDER BY tenant').pluck().all(),
    ['acme', 'tn_other'],
    "keyed by id: only this tenant's own rows go",
  );
});

test('a tenant added again under a removed name gets a new id and none of the old rows', (t) => {
  const c = catalog(t);
  const first = addTenant(c.db, 'acme').tenant;
  removeTenant(c.db, 'acme');
  const orphan = sandbox(c, first.id, 64); // as a crash between teardown and removal could leave
  const second = addTenant(c.db, 'acme').tenant;
  t.not(second.id, first.id);
  t.deepEqual(tenantUsage(c.db, second.id), {
    sandboxes: 0,
    memoryMb: 0,
    standbyMemoryMb: 0,
    cpuWeight: 0,
    checkpointMb: 0,
    snapshotMb: 0,
    importingMb: 0,
    diskMb: 0,
  });
  t.is(c.sandbox(orphan)!.tenant, first.id);
});

test('catalogs from before tenant ids: each tenant gets an id and its rows are re-keyed from name to id, once', (t) => {
  let c = catalog(t);
  // The tenants table as it was (no id column), with its rows keyed by name, in a catalog from
  // before the step that makes the tenants table.
  c.db.exec('DROP TABLE tenants; DROP TABLE http_idempotency');
  c.db
    .exec(`CREATE TABLE tenants (name TEXT PRIMARY KEY, token_hash BLOB NOT NULL UNIQUE, created_at INTEGER NOT NULL, max_sandboxes INTEGER, max_memory_mb INTEGER);
    CREATE TABLE http_idempotency (tenant TEXT, key TEXT, request_hash TEXT, status INTEGER, body TEXT, streamed INTEGER, created_at INTEGER)`);
  c.db.prepare("INSERT INTO tenants VALUES ('acme', x'01', 1, NULL, NULL), ('globex', x'02', 2, 5, NULL)").run();
  const a = sandbox(c, 'acme', 64);
  const g = sandbox(c, 'globex', 64);
  const gone = sandbox(c, 'removed-long-ago', 64);
  c.db
    .prepare(
      "INSERT INTO http_idempotency VALUES ('acme', 'k', 'h', 201, '{}', 0, 0), ('removed-long-ago', 'k', 'h', 201, '{}', 0, 0)",
    )
    .run();

  c = reopenBefore(t, c, 'tenants');
  const acme = getTenant(c.db, 'acme');
  const globex = getTenant(c.db, 'globex');
  t.regex(acme.id, /^tn_/);
  t.not(acme.id, globex.id);
  t.is(globex.maxSandboxes, 5);
  t.is(c.sandbox(a)!.tenant, acme.id);
  t.is(c.sandbox(g)!.tenant, globex.id);
  t.is(c.sandbox(gone)!.tenant, 'removed-long-ago', 'rows of no tenant keep a key no id can equal');
  t.deepEqual(
    c.db.prepare('SELECT tenant FROM http_idempotency ORDER BY tenant').pluck().all(),
    ['removed-long-ago', acme.id].sort(),
  );

  // Running it again changes nothing (a new tenant named like an old one stays apart).
  addTenant(c.db, 'removed-long-ago');
  c = reopenBefore(t, c, 'tenants');
  migrateTenants(c.db);
  t.is(getTenant(c.db, 'acme').id, acme.id);
  t.is(c.sandbox(gone)!.tenant, 'removed-long-ago');
  t.deepEqual(tenantUsage(c.db, getTenant(c.db, 'removed-long-ago').id), {
    sandboxes: 0,
    memoryMb: 0,
    standbyMemoryMb: 0,
    cpuWeight: 0,
    checkpointMb: 0,
    snapshotMb: 0,
    importingMb: 0,
    diskMb: 0,
  });
});

test('usage counts existing sandboxes, and the memory of running and creating ones', (t) => {
  const c = catalog(t);
  sandbox(c, 'acme', 128);
  sandbox(c, 'acme', 64, 'creating');
  sandbox(c, 'acme', 512, 'stopped');
  sandbox(c, 'acme', 1024, 'removing');
  sandbox(c, 'other', 2048);
  sandbox(c, null, 4096);
  t.deepEqual(tenantUsage(c.db, 'acme'), {
    sandboxes: 3,
    memoryMb: 192,
    standbyMemoryMb: 0,
    cpuWeight: 200,
    checkpointMb: 0,
    snapshotMb: 0,
    importingMb: 0,
    diskMb: 0,
  });
  t.deepEqual(tenantUsage(c.db, 'nobody'), {
    sandboxes: 0,
    memoryMb: 0,
    standbyMemoryMb: 0,
    cpuWeight: 0,
    checkpointMb: 0,
    snapshotMb: 0,
    importingMb: 0,
    diskMb: 0,
  });
});

const quotaCases: [
  string,
  { maxSandboxes: number | null; maxMemoryMb: number | null },
  { count: number; memoryMb: number },
  string | null,
][] = [
  ['no limits', { maxSandboxes: null, maxMemoryMb: null }, { count: 64, memoryMb: 1 << 20 }, null],
  ['exactly at the sandbox limit', { maxSandboxes: 3, maxMemoryMb: null }, { count: 1, memoryMb: 64 }, null],
  ['one past the sandbox limit', { maxSandboxes: 3, maxMemoryMb: null }, { count: 2, memoryMb: 64 }, 'maxSandboxes'],
  ['exactly at the memory limit', { maxSandboxes: null, maxMemoryMb: 384 }, { count: 2, memoryMb: 128 }, null],
  ['past the memory limit', { maxSandboxes: null, maxMemoryMb: 384 }, { count: 2, memoryMb: 129 }, 'maxMemoryMb'],
  ['a zero quota', { maxSandboxes: 0, maxMemoryMb: null }, { count: 1, memoryMb: 16 }, 'maxSandboxes'],
];
for (const [name, quotas, want, exceeded] of quotaCases) {
  test(`quota check: ${name}`, (t) => {
    const c = catalog(t);
    const { tenant } = addTenant(c.db, 'acme', quotas);
    sandbox(c, tenant.id, 64);
    sandbox(c, tenant.id, 64);
    if (exceeded === null) t.notThrows(() => checkQuota(c.db, tenant, want));
    else {
      const e = t.throws(() => checkQuota(c.db, tenant, want), { code: 'QUOTA_EXCEEDED' });
      t.is((e as unknown as { details: { quota: string } }).details.quota, exceeded);
    }
  });
}

test('the quota gate runs one check-and-create at a time per tenant, and tenants in parallel', async (t) => {
  const gate = new QuotaGate();
  const log: string[] = [];
  let release!: () => void;
  const blocked = new Promise<void>((r) => (release = r));
  const first = gate.run('a', async () => {
    log.push('a1 start');
    await blocked;
    log.push('a1 end');
  });
  const second = gate.run('a', async () => {
    log.push('a2');
  });
  const other = gate.run('b', async () => {
    log.push('b1');
  });
  await other;
  t.deepEqual(log, ['a1 start', 'b1']);
  release();
  await Promise.all([first, second]);
  t.deepEqual(log, ['a1 start', 'b1', 'a1 end', 'a2']);
  // A failure does not block the next one.
  await t.throwsAsync(
    gate.run('a', async () => Promise.reject(new Error('boom'))),
    { message: 'boom' },
  );
  t.is(await gate.run('a', async () => 7), 7);
});

/** A checkpoint row of a sandbox with the given sizes (JSON as the checkpoint verb writes it). */
function checkpointOf(c: Catalog, sandboxId: string, sizes: Record<string, number>): void {
  c.insertLayer(`lyr_${sandboxId}_${n}`, 'checkpoint', sandboxId);
  c.insertCheckpoint({
    id: `ckpt_unit${n++}`,
    sandbox_id: sandboxId,
    parent_id: null,
    layer_id: `lyr_${sandboxId}_${n - 1}`,
    image: 'base',
    runtime_layer: 'rt',
    branch_id: 'br',
    label: null,
    ledger_cursor: 0,
    context_id: null,
    sizes: JSON.stringify(sizes),
    timings: '{}',
    created_at: Date.now(),
  });
}

test('usage counts warm standbys, CPU weights and checkpoint bytes (process image + layer)', (t) => {
  const c = catalog(t);
  const a = sandbox(c, 'acme', 64);
  const b = sandbox(c, 'acme', 128);
  c.updateSandbox(a, { cpu_weight: 400 });
  c.setStandby(a, { instance: `${a}.abc`, checkpoint: 'ckpt_x', pid: null, start: null, at: 0 });
  c.updateSandbox(b, { cpu_weight: 50 });
  checkpointOf(c, a, { processImageBytes: 3 * 1024 * 1024, layerBytes: 5 * 1024 * 1024 });
  checkpointOf(c, b, { processImageBytes: 1024 * 1024 }); // a store without quotas records no layer size
  const other = sandbox(c, 'other', 64);
  checkpointOf(c, other, { processImageBytes: 100 * 1024 * 1024 });
  t.deepEqual(tenantUsage(c.db, 'acme'), {
    sandboxes: 2,
    memoryMb: 192,
    standbyMemoryMb: 64,
    cpuWeight: 450,
    checkpointMb: 9,
    snapshotMb: 0,
    importingMb: 0,
    // maxDiskMb counts the checkpoint bytes too (these sandboxes have no disk limit).
    diskMb: 9,
  });
});

test('a standby that would not fit maxMemoryMb is refused, naming the quota; one that fits is not', (t) => {
  const c = catalog(t);
  const acme = addTenant(c.db, 'acme', { maxMemoryMb: 192 });
  const a = sandbox(c, acme.tenant.id, 64);
  sandbox(c, acme.tenant.id, 64);
  const tenant = getTenant(c.db, 'acme');
  t.notThrows(() => checkStandbyQuota(c.db, tenant, 64 * 1024 * 1024), '128 + 64 = 192 fits exactly');
  c.setStandby(a, { instance: `${a}.abc`, checkpoint: 'ckpt_x', pid: null, start: null, at: 0 });
  const e = t.throws(() => checkStandbyQuota(c.db, tenant, 64 * 1024 * 1024), { code: 'QUOTA_EXCEEDED' });
  t.like((e as unknown as { details: object }).details, { quota: 'maxMemoryMb', limit: 192, used: 192, requested: 64 });
  // The standby counts against creates too.
  const e2 = t.throws(() => checkQuota(c.db, tenant, { count: 1, memoryMb: 16 }), { code: 'QUOTA_EXCEEDED' });
  t.like((e2 as unknown as { details: object }).details, { quota: 'maxMemoryMb', used: 192 });
});

test('checkpoint bytes: a checkpoint that would take the tenant past maxCheckpointMb is refused; CPU weight sums against maxCpuWeight', (t) => {
  const c = catalog(t);
  const acme = addTenant(c.db, 'acme', { maxCheckpointMb: 10, maxCpuWeight: 300, cpuWeight: 100 });
  const a = sandbox(c, acme.tenant.id, 64);
  c.updateSandbox(a, { cpu_weight: 200 });
  checkpointOf(c, a, { processImageBytes: 6 * 1024 * 1024 });
  const tenant = getTenant(c.db, 'acme');
  t.notThrows(() => checkStoredQuota(c.db, tenant, 4 * 1024 * 1024), '6 + 4 = 10 MiB fits exactly');
  const e = t.throws(() => checkStoredQuota(c.db, tenant, 4 * 1024 * 1024 + 1), { code: 'QUOTA_EXCEEDED' });
  t.like((e as unknown as { details: object }).details, { quota: 'maxCheckpointMb', limit: 10, used: 6 });
  t.notThrows(
    () => checkQuota(c.db, tenant, { count: 1, memoryMb: 16 }),
    'the tenant default weight 100: 200 + 100 = 300',
  );
  const e2 = t.throws(() => checkQuota(c.db, tenant, { count: 1, memoryMb: 16, cpuWeight: 101 }), {
    code: 'QUOTA_EXCEEDED',
  });
  t.like((e2 as unknown as { details: object }).details, {
    quota: 'maxCpuWeight',
    limit: 300,
    used: 200,
    requested: 101,
  });
});

const badTenantQuotas: [string, Record<string, unknown>][] = [
  ['cpuWeight', { cpuWeight: 0 }],
  ['cpuWeight', { cpuWeight: 10_001 }],
  ['maxCpuWeight', { maxCpuWeight: -1 }],
  ['maxCpuWeight', { maxCpuWeight: 1.5 }],
  ['maxCheckpointMb', { maxCheckpointMb: '10' }],
  ['maxCheckpointMb', { maxCheckpointMb: 2 ** 40 }],
];
for (const [field, quotas] of badTenantQuotas) {
  test(`bad tenant quota ${JSON.stringify(quotas)} is refused naming ${field}`, (t) => {
    const c = catalog(t);
    const e = t.throws(() => addTenant(c.db, 'acme', quotas as TenantQuotas), { code: 'INVALID_ARGUMENT' });
    t.is((e as unknown as { field: string }).field, field);
    t.deepEqual(listTenants(c.db), []);
  });
}

test("maxDiskMb counts writable layers' limits, checkpoint bytes and imports in flight; a reservation is released whole", (t) => {
  const c = catalog(t);
  const MiB = 1024 * 1024;
  const acme = addTenant(c.db, 'acme', { maxDiskMb: 100, maxCheckpointMb: 50 });
  const a = sandbox(c, acme.tenant.id, 64);
  c.updateSandbox(a, { disk_bytes: 60 * MiB });
  checkpointOf(c, a, { processImageBytes: 4 * MiB, layerBytes: 6 * MiB });
  const tenant = getTenant(c.db, 'acme');
  t.is(tenantUsage(c.db, tenant.id).diskMb, 70);
  t.notThrows(() => checkLayerQuota(c.db, tenant, 30 * MiB), '60 + 10 + 30 = 100 MiB fits exactly');
  const e = t.throws(() => checkLayerQuota(c.db, tenant, 30 * MiB + 1), { code: 'QUOTA_EXCEEDED' });
  t.like((e as unknown as { details: object }).details, { quota: 'maxDiskMb', limit: 100, used: 70 });
  t.throws(
    () => checkLayerQuota(c.db, tenant, null),
    { code: 'LIMIT_UNSUPPORTED' },
    'an unlimited layer cannot be counted',
  );
  t.notThrows(() => checkLayerQuota(c.db, undefined, null), 'no tenant, no quota');

  // Two imports: each reservation counts against the other and against checkpoints.
  const r1 = new StoreReservation(c.db, tenant);
  const r2 = new StoreReservation(c.db, tenant);
  r1.grow(20 * MiB);
  t.is(tenantUsage(c.db, tenant.id).importingMb, 20);
  const e2 = t.throws(() => r2.grow(20 * MiB + 1), { code: 'QUOTA_EXCEEDED' });
  t.like((e2 as unknown as { details: object }).details, { quota: 'maxCheckpointMb', limit: 50, used: 30 });
  t.is(r2.bytes, 0, 'a refused growth holds nothing');
  t.throws(() => checkStoredQuota(c.db, tenant, 20 * MiB + 1), { code: 'QUOTA_EXCEEDED' });
  t.notThrows(() => checkStoredQuota(c.db, tenant, 20 * MiB + 1, r1), 'its own reservation is not counted twice');
  r1.release();
  r1.release();
  t.is(tenantUsage(c.db, tenant.id).importingMb, 0);
  const e3 = t.throws(() => r2.grow(40 * MiB), { code: 'QUOTA_EXCEEDED' });
  t.like(
    (e3 as unknown as { details: object }).details,
    { quota: 'maxDiskMb', limit: 100, used: 70 },
    '60 + 10 + 40 > 100',
  );
  t.notThrows(() => r2.grow(30 * MiB), 'released: 60 + 10 + 30 = 100 MiB fits');
  t.throws(
    () => checkLayerQuota(c.db, tenant, 1),
    { code: 'QUOTA_EXCEEDED' },
    'the reservation counts against layers too',
  );
  r2.release();
});
