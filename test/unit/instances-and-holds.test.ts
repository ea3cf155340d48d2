/**
 * The `instances` and `holds` tables (catalog step 16, src/catalog/schema/instances.ts):
 * the triggers that keep them, and the migration of a catalog whose warm
 * standbys were still in sandboxes.standby_* columns. Real SQLite files.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Catalog } from '../../src/catalog/catalog.js';
import { MIGRATIONS, SCHEMA_VERSION, migrateCatalog } from '../../src/catalog/migrations.js';
import type { CheckpointRow, SandboxRow } from '../../src/catalog/catalog.js';

function tempFile(t: { teardown: (fn: () => void) => void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-holds-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'lockstep.db');
}

function open(t: { teardown: (fn: () => void) => void }): Catalog {
  const c = new Catalog(tempFile(t));
  t.teardown(() => c.close());
  c.putImage({ name: 'base', rootfs: '/r', source: 's', size_bytes: 0, created_at: 0, deleted: 0 });
  return c;
}

function sandbox(id: string): SandboxRow {
  return {
    id,
    tenant: null,
    image: 'base',
    runtime_layer: 'rt',
    state: 'running',
    init_pid: 100,
    init_start: 5,
    memory_bytes: null,
    pids_max: null,
    hostname: id,
    lineage_id: 'lin',
    branch_id: 'br',
    head_checkpoint_id: null,
    forked_from: null,
    env: '{}',
    metadata: '{}',
    created_at: 1,
    expires_at: null,
    instance: id,
    cpu_weight: null,
    cpu_quota_us: null,
    io_weight: null,
    disk_bytes: null,
    id_base: null,
  };
}

function checkpoint(id: string, sandboxId: string, layerId: string): CheckpointRow {
  return {
    id,
    sandbox_id: sandboxId,
    parent_id: null,
    layer_id: layerId,
    image: 'base',
    runtime_layer: 'rt',
    branch_id: 'br',
    label: null,
    ledger_cursor: 0,
    context_id: null,
    sizes: '{}',
    timings: '{}',
    created_at: 2,
  };
}

function insertSnapshot(c: Catalog, id: string, layerId: string, processImage: string): void {
  c.db
    .prepare(
      `INSERT INTO snapshots (id, size_bytes, layer_id, process_image, image, image_source, runtime_layer, checksums,
         lineage_id, template, created_at) VALUES (?, 0, ?, ?, 'base', 's', 'rt', '{}', 'lin', '{}', 3)`,
    )
    .run(id, layerId, processImage);
}

const instances = (c: Catalog) =>
  c.db.prepare('SELECT id, sandbox_id, role, checkpoint_id, pid, start FROM instances ORDER BY id').all();

test('a layer held by a checkpoint and a snapshot is held until both rows are gone', (t) => {
  const c = open(t);
  c.insertSandbox(sandbox('sbx_a'));
  c.insertLayer('lyr_1', 'checkpoint', 'sbx_a');
  c.insertCheckpoint(checkpoint('ckpt_1', 'sbx_a', 'lyr_1'));
  insertSnapshot(c, 'snap_1', 'lyr_1', 'ckpt_1');
  t.deepEqual(
    c.holders('layer', 'lyr_1').map((h) => `${h.holder_kind}:${h.holder_id}`),
    ['checkpoint:ckpt_1', 'snapshot:snap_1'],
  );
  c.deleteCheckpointRow('ckpt_1');
  t.true(c.isHeld('layer', 'lyr_1'), 'the snapshot still holds it');
  t.true(c.isHeld('process-image', 'ckpt_1'), 'and the process image');
  c.db.prepare('DELETE FROM snapshots WHERE id = ?').run('snap_1');
  t.false(c.isHeld('layer', 'lyr_1'));
  t.false(c.isHeld('process-image', 'ckpt_1'));
});

test('the other order: the snapshot goes first, the checkpoint still holds', (t) => {
  const c = open(t);
  c.insertSandbox(sandbox('sbx_a'));
  c.insertLayer('lyr_1', 'checkpoint', 'sbx_a');
  c.insertCheckpoint(checkpoint('ckpt_1', 'sbx_a', 'lyr_1'));
  insertSnapshot(c, 'snap_1', 'lyr_1', 'ckpt_1');
  c.db.prepare('DELETE FROM snapshots WHERE id = ?').run('snap_1');
  t.deepEqual(c.holders('layer', 'lyr_1'), [{ holder_kind: 'checkpoint', holder_id: 'ckpt_1' }]);
  c.deleteCheckpointRow('ckpt_1');
  t.false(c.isHeld('layer', 'lyr_1'));
});

test('an image is held by its sandbox, the sandbox instances, checkpoints and snapshots, and released with them', (t) => {
  const c = open(t);
  c.insertSandbox(sandbox('sbx_a'));
  c.setStandby('sbx_a', { instance: 'sbx_a.st', checkpoint: 'ckpt_1', pid: 300, start: 7, at: 9 });
  c.insertLayer('lyr_1', 'checkpoint', 'sbx_a');
  c.insertCheckpoint(checkpoint('ckpt_1', 'sbx_a', 'lyr_1'));
  insertSnapshot(c, 'snap_1', 'lyr_1', 'ckpt_1');
  t.deepEqual(
    c
      .holders('image', 'base')
      .map((h) => `${h.holder_kind}:${h.holder_id}`)
      .sort(),
    ['checkpoint:ckpt_1', 'instance:sbx_a', 'instance:sbx_a.st', 'sandbox:sbx_a', 'snapshot:snap_1'],
  );
  t.is(c.imageReferences('base'), 5);
  c.deleteCheckpointRow('ckpt_1');
  c.deleteSandboxRow('sbx_a');
  t.deepEqual(instances(c), [], 'the sandbox row takes its instances with it');
  t.deepEqual(c.holders('image', 'base'), [{ holder_kind: 'snapshot', holder_id: 'snap_1' }]);
  c.db.prepare('DELETE FROM snapshots WHERE id = ?').run('snap_1');
  t.is(c.imageReferences('base'), 0);
});

test('the live instance row follows the sandbox row; a swapped-in standby becomes the live one', (t) => {
  const c = open(t);
  c.insertSandbox(sandbox('sbx_a'));
  t.deepEqual(instances(c), [
    { id: 'sbx_a', sandbox_id: 'sbx_a', role: 'live', checkpoint_id: null, pid: 100, start: 5 },
  ]);
  c.updateSandbox('sbx_a', { init_pid: 200, init_start: 6 });
  t.like(instances(c)[0], { id: 'sbx_a', role: 'live', pid: 200, start: 6 });
  c.setStandby('sbx_a', { instance: 'sbx_a.st', checkpoint: 'ckpt_1', pid: 300, start: 7, at: 9 });
  t.deepEqual(c.standby('sbx_a'), {
    sandboxId: 'sbx_a',
    instance: 'sbx_a.st',
    checkpoint: 'ckpt_1',
    pid: 300,
    start: 7,
    at: 9,
  });
  // A rollback swaps the standby in (src/checkpoints/rollback.ts commitRollback).
  c.tx(() => {
    c.clearStandby('sbx_a');
    c.updateSandbox('sbx_a', { instance: 'sbx_a.st', init_pid: 300, init_start: 7 });
  });
  t.deepEqual(instances(c), [
    { id: 'sbx_a.st', sandbox_id: 'sbx_a', role: 'live', checkpoint_id: null, pid: 300, start: 7 },
  ]);
  t.is(c.standby('sbx_a'), undefined);
  t.deepEqual([...c.instanceKeys()], ['sbx_a.st']);
  t.deepEqual(c.holders('image', 'base'), [
    { holder_kind: 'instance', holder_id: 'sbx_a.st' },
    { holder_kind: 'sandbox', holder_id: 'sbx_a' },
  ]);
});

test('setStandby replaces the sandbox standby; clearStandby forgets it', (t) => {
  const c = open(t);
  c.insertSandbox(sandbox('sbx_a'));
  c.insertSandbox({ ...sandbox('sbx_b'), created_at: 2 });
  c.setStandby('sbx_a', { instance: 'sbx_a.1', checkpoint: 'ckpt_1', pid: 1, start: 1, at: 20 });
  c.setStandby('sbx_b', { instance: 'sbx_b.1', checkpoint: 'ckpt_2', pid: 2, start: 2, at: 10 });
  c.setStandby('sbx_a', { instance: 'sbx_a.2', checkpoint: 'ckpt_3', pid: 3, start: 3, at: 30 });
  t.deepEqual(
    c.standbys().map((s) => s.instance),
    ['sbx_b.1', 'sbx_a.2'],
    'least recently made first',
  );
  t.false(
    c.holders('image', 'base').some((h) => h.holder_id === 'sbx_a.1'),
    'the replaced standby holds nothing',
  );
  c.clearStandby('sbx_a');
  t.is(c.standby('sbx_a'), undefined);
  t.deepEqual([...c.instanceKeys()].sort(), ['sbx_a', 'sbx_b', 'sbx_b.1']);
});

/** A version-15 catalog, as the previous Lockstep wrote it: its standby in sandboxes.standby_*. */
function writeVersion15(file: string): void {
  const db = new Database(file);
  migrateCatalog(db, MIGRATIONS.slice(0, 15));
  db.exec(`
INSERT INTO images (name, rootfs, source, created_at) VALUES ('base', '/r', 's', 0);
INSERT INTO sandboxes (id, image, runtime_layer, state, init_pid, init_start, hostname, lineage_id, branch_id, created_at,
    instance, standby_instance, standby_checkpoint, standby_pid, standby_start, standby_at)
  VALUES ('sbx_a', 'base', 'rt', 'running', 100, 5, 'a', 'lin', 'br', 1, 'sbx_a.1', 'sbx_a.st', 'ckpt_1', 300, 7, 1234),
         ('sbx_b', 'base', 'rt', 'stopped', NULL, NULL, 'b', 'lin', 'br', 2, 'sbx_b', NULL, NULL, NULL, NULL, NULL);
INSERT INTO layers (id, kind, sandbox_id, created_at) VALUES ('lyr_1', 'checkpoint', 'sbx_a', 2);
INSERT INTO checkpoints (id, sandbox_id, layer_id, image, runtime_layer, branch_id, created_at)
  VALUES ('ckpt_1', 'sbx_a', 'lyr_1', 'base', 'rt', 'br', 2);
INSERT INTO snapshots (id, size_bytes, layer_id, process_image, image, image_source, runtime_layer, checksums,
    lineage_id, template, created_at) VALUES ('snap_1', 0, 'lyr_1', 'ckpt_1', 'base', 's', 'rt', '{}', 'lin', '{}', 3);`);
  db.close();
}

test('a catalog with standby columns set upgrades to instances rows, without the columns, and holds filled', (t) => {
  const file = tempFile(t);
  writeVersion15(file);
  const c = new Catalog(file);
  t.teardown(() => c.close());
  t.is(c.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  const cols = (c.db.prepare('PRAGMA table_info(sandboxes)').all() as { name: string }[]).map((r) => r.name);
  t.deepEqual(
    cols.filter((n) => n.startsWith('standby_')),
    [],
  );
  t.deepEqual(instances(c), [
    { id: 'sbx_a.1', sandbox_id: 'sbx_a', role: 'live', checkpoint_id: null, pid: 100, start: 5 },
    { id: 'sbx_a.st', sandbox_id: 'sbx_a', role: 'standby', checkpoint_id: 'ckpt_1', pid: 300, start: 7 },
    { id: 'sbx_b', sandbox_id: 'sbx_b', role: 'live', checkpoint_id: null, pid: null, start: null },
  ]);
  t.deepEqual(c.standby('sbx_a'), {
    sandboxId: 'sbx_a',
    instance: 'sbx_a.st',
    checkpoint: 'ckpt_1',
    pid: 300,
    start: 7,
    at: 1234,
  });
  t.is(c.standby('sbx_b'), undefined);
  t.deepEqual(
    c.holders('layer', 'lyr_1').map((h) => `${h.holder_kind}:${h.holder_id}`),
    ['checkpoint:ckpt_1', 'snapshot:snap_1'],
  );
  t.is(c.imageReferences('base'), 7, 'two sandboxes, their three instances, a checkpoint and a snapshot');
});

test('the step is one transaction: a failure in it leaves the version-15 catalog as it was', (t) => {
  const file = tempFile(t);
  writeVersion15(file);
  const db = new Database(file);
  t.teardown(() => db.close());
  const step = MIGRATIONS[15]!;
  const broken = [
    ...MIGRATIONS.slice(0, 15),
    {
      ...step,
      up: (d: Database.Database) => {
        step.up(d);
        throw new Error('disk full');
      },
    },
  ];
  t.throws(() => migrateCatalog(db, broken), { message: 'disk full' });
  t.is(db.pragma('user_version', { simple: true }), 15);
  const cols = (db.prepare('PRAGMA table_info(sandboxes)').all() as { name: string }[]).map((r) => r.name);
  t.true(cols.includes('standby_instance'));
  t.is(db.prepare("SELECT name FROM sqlite_master WHERE name IN ('instances', 'holds')").all().length, 0);
});
