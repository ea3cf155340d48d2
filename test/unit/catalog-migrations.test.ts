/**
 * The catalog's schema version and its forward migrations, against real
 * SQLite files: old catalogs are built here by hand (the SQL an older
 * Lockstep wrote), then opened with today's Catalog.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import {
  Catalog,
  MIGRATIONS,
  SCHEMA_VERSION,
  migrateCatalog,
  type CatalogMigration,
} from '../../src/catalog/catalog.js';

function tempFile(t: { teardown: (fn: () => void) => void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-migrations-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'lockstep.db');
}

/** The schema of a version-1 catalog, as Lockstep 0.1 wrote it: no lifetimes, no instances. */
const V1_SQL = `
CREATE TABLE images (name TEXT PRIMARY KEY, rootfs TEXT NOT NULL, source TEXT NOT NULL, size_bytes INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE sandboxes (id TEXT PRIMARY KEY, tenant TEXT, image TEXT NOT NULL REFERENCES images(name), runtime_layer TEXT NOT NULL,
  state TEXT NOT NULL, init_pid INTEGER, init_start INTEGER, memory_bytes INTEGER, pids_max INTEGER, hostname TEXT NOT NULL,
  lineage_id TEXT NOT NULL, branch_id TEXT NOT NULL, head_checkpoint_id TEXT, forked_from TEXT, env TEXT NOT NULL DEFAULT '{}',
  metadata TEXT NOT NULL DEFAULT '{}', created_at INTEGER NOT NULL);
CREATE TABLE layers (id TEXT PRIMARY KEY, kind TEXT NOT NULL, sandbox_id TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE checkpoints (id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, parent_id TEXT, layer_id TEXT NOT NULL, image TEXT NOT NULL,
  runtime_layer TEXT NOT NULL, branch_id TEXT NOT NULL, label TEXT, ledger_cursor INTEGER NOT NULL DEFAULT 0, context_id TEXT,
  sizes TEXT NOT NULL DEFAULT '{}', timings TEXT NOT NULL DEFAULT '{}', created_at INTEGER NOT NULL);
CREATE TABLE operations (id TEXT PRIMARY KEY, kind TEXT NOT NULL, sandbox_id TEXT NOT NULL, phase TEXT NOT NULL,
  payload TEXT NOT NULL DEFAULT '{}', started_at INTEGER NOT NULL);
INSERT INTO images VALUES ('base', '/var/lib/lockstep/images/base/rootfs', 'recipe:base@abc', 1234, 1700000000000, 0);
INSERT INTO sandboxes (id, image, runtime_layer, state, init_pid, hostname, lineage_id, branch_id, created_at)
  VALUES ('sbx_old', 'base', 'rt1', 'running', 4242, 'sbx-old', 'lin_1', 'br_1', 1700000000001);
`;

function writeOldCatalog(file: string, version: number, sql = V1_SQL): void {
  const db = new Database(file);
  db.exec(sql);
  if (version >= 2)
    db.exec('ALTER TABLE sandboxes ADD COLUMN expires_at INTEGER; UPDATE sandboxes SET expires_at = 1800000000000');
  db.pragma(`user_version = ${version}`);
  db.close();
}

const columns = (db: Database.Database, table: string) =>
  (db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name);

test('the numbered steps run in order and the last one is the schema version', (t) => {
  t.deepEqual(
    MIGRATIONS.map((m) => m.version),
    MIGRATIONS.map((_, i) => i + 1),
  );
  t.is(SCHEMA_VERSION, MIGRATIONS[MIGRATIONS.length - 1]!.version);
});

test('a new catalog starts at the current schema version with every column', (t) => {
  const file = tempFile(t);
  const c = new Catalog(file);
  t.teardown(() => c.close());
  t.is(c.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  for (const col of ['expires_at', 'instance']) t.true(columns(c.db, 'sandboxes').includes(col), col);
  // The warm standby moved from sandboxes.standby_* to rows of `instances` (step 9).
  for (const col of ['id', 'sandbox_id', 'role', 'checkpoint_id', 'pid', 'start', 'created_at'])
    t.true(columns(c.db, 'instances').includes(col), col);
  t.false(columns(c.db, 'sandboxes').some((col) => col.startsWith('standby_')));
});

for (const from of [0, 1, 2]) {
  test(`a version-${from} catalog is migrated forward on open, keeping its rows`, (t) => {
    const file = tempFile(t);
    // Version 0: a catalog written before versions were recorded, with the v1 tables.
    writeOldCatalog(file, from);
    const c = new Catalog(file);
    t.teardown(() => c.close());
    t.is(c.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
    const row = c.sandbox('sbx_old');
    t.like(row, {
      id: 'sbx_old',
      image: 'base',
      state: 'running',
      init_pid: 4242,
      hostname: 'sbx-old',
      instance: 'sbx_old',
    });
    t.is(c.standby('sbx_old'), undefined);
    t.is(row?.expires_at, from >= 2 ? 1800000000000 : null);
    t.is(c.image('base')?.size_bytes, 1234);
    // The migrated catalog works like a new one.
    c.setStandby('sbx_old', { instance: 'sbx_old.ab12', checkpoint: 'ckpt_1', pid: 99, start: null, at: 5 });
    t.like(c.standby('sbx_old'), { instance: 'sbx_old.ab12', pid: 99 });
  });
}

test('opening a catalog twice runs no step again', (t) => {
  const file = tempFile(t);
  writeOldCatalog(file, 1);
  new Catalog(file).close();
  let ran = 0;
  const db = new Database(file);
  t.teardown(() => db.close());
  const counting = MIGRATIONS.map((m) => ({ ...m, up: (d: Database.Database) => (ran++, m.up(d)) }));
  t.is(migrateCatalog(db, counting), SCHEMA_VERSION);
  t.is(ran, 0);
});

test('a catalog from a newer Lockstep is refused with both versions named, and left untouched', (t) => {
  const file = tempFile(t);
  writeOldCatalog(file, SCHEMA_VERSION + 4);
  const err = t.throws(() => new Catalog(file), { code: 'CATALOG_TOO_NEW' });
  t.regex(err!.message, new RegExp(`schema version ${SCHEMA_VERSION + 4}\\b.*version ${SCHEMA_VERSION}\\b`));
  t.like((err as unknown as { details: object }).details, {
    found: SCHEMA_VERSION + 4,
    supported: SCHEMA_VERSION,
    file,
  });
  const db = new Database(file, { readonly: true });
  t.teardown(() => db.close());
  t.is(db.pragma('user_version', { simple: true }), SCHEMA_VERSION + 4);
  t.false(columns(db, 'sandboxes').includes('instance'));
});

test('a step that fails is rolled back whole: the catalog stays at the last good version', (t) => {
  const file = tempFile(t);
  writeOldCatalog(file, 1);
  const db = new Database(file);
  t.teardown(() => db.close());
  const broken: CatalogMigration[] = [
    ...MIGRATIONS.slice(0, 2),
    {
      version: 3,
      description: 'adds a column, then fails',
      up: (d) => {
        d.exec('ALTER TABLE sandboxes ADD COLUMN half_done TEXT');
        throw new Error('disk on fire');
      },
    },
  ];
  t.throws(() => migrateCatalog(db, broken), { message: 'disk on fire' });
  t.is(db.pragma('user_version', { simple: true }), 2);
  t.true(columns(db, 'sandboxes').includes('expires_at'));
  t.false(columns(db, 'sandboxes').includes('half_done'));
});

test('unsynced() commits without fsync, then puts synchronous=FULL back, also when fn throws; inside a transaction it changes nothing', (t) => {
  const catalog = new Catalog(tempFile(t));
  t.teardown(() => catalog.close());
  const level = () => catalog.db.pragma('synchronous', { simple: true });
  t.is(level(), 2, 'FULL');
  let seen: unknown;
  catalog.unsynced(() => {
    seen = level();
    catalog.beginOperation({ id: 'op_a', kind: 'rollback', sandbox_id: 'sbx_a', phase: 'prepared', payload: '{}' });
  });
  t.is(seen, 1, 'NORMAL while fn runs');
  t.is(level(), 2);
  t.deepEqual(
    catalog.operations().map((o) => o.phase),
    ['prepared'],
    'the step was committed',
  );
  t.throws(
    () =>
      catalog.unsynced(() => {
        throw new Error('boom');
      }),
    { message: 'boom' },
  );
  t.is(level(), 2, 'FULL again after a throw');
  catalog.tx(() => catalog.unsynced(() => (seen = level())));
  t.is(seen, 2, 'a transaction keeps its level');
});
