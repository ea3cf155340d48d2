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
import { Catalog } from '../../src/catalog/catalog.js';
import { MIGRATIONS, SCHEMA_VERSION, migrateCatalog, type CatalogMigration } from '../../src/catalog/migrations.js';
import { extensionVersion, migrateExtension, registerExtension } from '../../src/catalog/extensions.js';
import { LANGGRAPH_EXTENSION } from '../../src/integrations/langgraph.js';

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
  // The warm standby moved from sandboxes.standby_* to rows of `instances` (step 16).
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

/** The agent-state tables at their version 1, as Lockstep wrote them before catalog version 10 (with agent_state_meta). */
const AGENT_STATE_V1_SQL = `
CREATE TABLE IF NOT EXISTS agent_state_meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_context_items (
  hash BLOB NOT NULL UNIQUE,
  data BLOB NOT NULL,
  refs INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_context_snapshots (
  id            TEXT PRIMARY KEY,
  format        TEXT NOT NULL,
  header_hash   BLOB NOT NULL,
  base_id       TEXT,
  tail          BLOB NOT NULL,
  item_count    INTEGER NOT NULL,
  depth         INTEGER NOT NULL,
  list_digest   BLOB NOT NULL,
  logical_bytes INTEGER NOT NULL,
  dependents    INTEGER NOT NULL DEFAULT 0,
  deleted       INTEGER NOT NULL DEFAULT 0,
  created_at    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_context_snapshots_digest ON agent_context_snapshots(list_digest);
CREATE TABLE IF NOT EXISTS agent_observations (
  seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
  id                  TEXT NOT NULL UNIQUE,
  sandbox_id          TEXT NOT NULL,
  branch_id           TEXT NOT NULL,
  lineage_id          TEXT NOT NULL,
  epoch_checkpoint_id TEXT,
  kind                TEXT NOT NULL CHECK (kind IN ('command','file-read','file-write','file-list','verdict')),
  tool_call_id        TEXT,
  subject             TEXT NOT NULL,
  content_hash        TEXT,
  exit_code           INTEGER,
  summary             TEXT,
  sealed_by           TEXT,
  stale_rollback_id   TEXT,
  stale_at            INTEGER,
  inherited_from      TEXT,
  created_at          INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_observations_sandbox ON agent_observations(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS agent_observations_lineage ON agent_observations(lineage_id, seq);
CREATE TABLE IF NOT EXISTS agent_verdicts (
  seq            INTEGER PRIMARY KEY AUTOINCREMENT,
  id             TEXT NOT NULL UNIQUE,
  sandbox_id     TEXT NOT NULL,
  branch_id      TEXT NOT NULL,
  path           TEXT NOT NULL,
  content_hash   TEXT NOT NULL,
  verdict        TEXT NOT NULL,
  tool_call_id   TEXT,
  observation_id TEXT,
  inherited_from TEXT,
  created_at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_verdicts_sandbox ON agent_verdicts(sandbox_id, path, seq);
CREATE TABLE IF NOT EXISTS agent_effects (
  seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
  id                  TEXT NOT NULL UNIQUE,
  lineage_id          TEXT NOT NULL,
  sandbox_id          TEXT NOT NULL,
  branch_id           TEXT NOT NULL,
  epoch_checkpoint_id TEXT,
  sealed_by           TEXT,
  abandoned_by        TEXT,
  kind                TEXT NOT NULL,
  input               TEXT NOT NULL,
  output              TEXT,
  reversibility       TEXT NOT NULL CHECK (reversibility IN ('sandbox-local','compensable','irreversible')),
  scope               TEXT NOT NULL CHECK (scope IN ('lineage','branch')),
  idempotency_key     TEXT NOT NULL,
  tool_call_id        TEXT,
  compensation        TEXT,
  status              TEXT NOT NULL CHECK (status IN ('pending','committed','failed','unknown','compensated')),
  definite            INTEGER,
  error               TEXT,
  attempt             INTEGER NOT NULL,
  compensates_id      TEXT,
  compensated_by      TEXT,
  commit_order        INTEGER,
  created_at          INTEGER NOT NULL,
  settled_at          INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS agent_effects_live_key ON agent_effects(idempotency_key)
  WHERE status IN ('pending','unknown','committed');
CREATE INDEX IF NOT EXISTS agent_effects_key ON agent_effects(idempotency_key, seq);
CREATE INDEX IF NOT EXISTS agent_effects_sandbox ON agent_effects(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS agent_effects_lineage ON agent_effects(lineage_id, seq);
CREATE INDEX IF NOT EXISTS agent_effects_status ON agent_effects(status);
CREATE INDEX IF NOT EXISTS agent_effects_commit_order ON agent_effects(commit_order);
CREATE TABLE IF NOT EXISTS agent_effect_views (
  sandbox_id TEXT NOT NULL,
  effect_id  TEXT NOT NULL,
  PRIMARY KEY (sandbox_id, effect_id)
) WITHOUT ROWID;
`;

// ---- every older catalog, with every table that lived in it, upgrades keeping its rows ----

/** What a version-1 catalog became by version 8 (steps 2-8), plus the columns added on every open before version 9. */
const V2_TO_V8_SQL = `
ALTER TABLE sandboxes ADD COLUMN expires_at INTEGER;
ALTER TABLE sandboxes ADD COLUMN instance TEXT;
ALTER TABLE sandboxes ADD COLUMN standby_instance TEXT;
ALTER TABLE sandboxes ADD COLUMN standby_checkpoint TEXT;
ALTER TABLE sandboxes ADD COLUMN standby_pid INTEGER;
ALTER TABLE sandboxes ADD COLUMN standby_start INTEGER;
ALTER TABLE checkpoints ADD COLUMN checksums TEXT;
ALTER TABLE checkpoints ADD COLUMN durable_at INTEGER;
ALTER TABLE checkpoints ADD COLUMN boot_id TEXT;
ALTER TABLE sandboxes ADD COLUMN standby_at INTEGER;
CREATE TABLE snapshots (id TEXT PRIMARY KEY, tenant TEXT, name TEXT, metadata TEXT NOT NULL DEFAULT '{}', size_bytes INTEGER NOT NULL,
  layer_id TEXT NOT NULL, process_image TEXT NOT NULL, image TEXT NOT NULL REFERENCES images(name), image_source TEXT NOT NULL,
  runtime_layer TEXT NOT NULL, checksums TEXT NOT NULL, context_id TEXT, lineage_id TEXT NOT NULL, ledger_cursor INTEGER NOT NULL DEFAULT 0,
  source_sandbox TEXT, source_checkpoint TEXT, template TEXT NOT NULL, digest TEXT, bundle_bytes INTEGER, created_at INTEGER NOT NULL);
ALTER TABLE sandboxes ADD COLUMN network TEXT;
ALTER TABLE sandboxes ADD COLUMN net_slot INTEGER;
CREATE UNIQUE INDEX sandboxes_net_slot ON sandboxes(net_slot);
ALTER TABLE checkpoints ADD COLUMN connections TEXT;
CREATE TABLE exposures (id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, tenant TEXT, port INTEGER NOT NULL, token_hash TEXT NOT NULL,
  created_at INTEGER NOT NULL);
ALTER TABLE sandboxes ADD COLUMN cpu_weight INTEGER;
ALTER TABLE sandboxes ADD COLUMN cpu_quota_us INTEGER;
ALTER TABLE sandboxes ADD COLUMN io_weight INTEGER;
ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER;
ALTER TABLE sandboxes ADD COLUMN id_base INTEGER;
CREATE UNIQUE INDEX sandboxes_id_base ON sandboxes(id_base);
UPDATE sandboxes SET expires_at = 1800000000000, instance = 'sbx_old.cd34', standby_at = 5, network = '{"mode":"egress"}',
  net_slot = 3, cpu_weight = 200, id_base = 100000;
UPDATE checkpoints SET checksums = '{"a":1}', durable_at = 1700000000009, boot_id = 'boot-1', connections = '[]';
INSERT INTO snapshots (id, tenant, name, size_bytes, layer_id, process_image, image, image_source, runtime_layer, checksums,
  lineage_id, template, created_at)
  VALUES ('snap_1', NULL, 'golden', 10, 'lyr_snap', 'pi', 'base', 'recipe:base@abc', 'rt1', '{}', 'lin_1', 'tpl', 1700000000010);
INSERT INTO exposures VALUES ('exp_1', 'sbx_old', NULL, 8080, 'hash', 1700000000011);
`;

/** A layer and a checkpoint of sbx_old, in the version-1 columns. */
const CHECKPOINT_ROWS_SQL = `
INSERT INTO layers VALUES ('lyr_ck', 'checkpoint', 'sbx_old', 1700000000002);
INSERT INTO checkpoints (id, sandbox_id, parent_id, layer_id, image, runtime_layer, branch_id, label, ledger_cursor, context_id,
  sizes, timings, created_at)
  VALUES ('ckpt_old', 'sbx_old', NULL, 'lyr_ck', 'base', 'rt1', 'br_1', 'before', 3, 'ctx_old', '{"layer":1}', '{"ms":2}', 1700000000003);
`;

/** Rows of the agent-state tables, in the columns of their version 1. */
const AGENT_STATE_ROWS_SQL = `
INSERT INTO agent_context_items (hash, data, refs) VALUES (x'0102', x'0304', 1);
INSERT INTO agent_context_snapshots (id, format, header_hash, base_id, tail, item_count, depth, list_digest, logical_bytes, created_at)
  VALUES ('ctx_old', 'openai-chat', x'0102', NULL, x'0102', 1, 0, x'05', 12, 1700000000004);
INSERT INTO agent_observations (id, sandbox_id, branch_id, lineage_id, kind, subject, created_at)
  VALUES ('obs_1', 'sbx_old', 'br_1', 'lin_1', 'command', 'ls', 1700000000005);
INSERT INTO agent_verdicts (id, sandbox_id, branch_id, path, content_hash, verdict, created_at)
  VALUES ('vrd_1', 'sbx_old', 'br_1', '/etc/x', 'h1', 'clean', 1700000000006);
INSERT INTO agent_effects (id, lineage_id, sandbox_id, branch_id, kind, input, reversibility, scope, idempotency_key, status,
  attempt, created_at)
  VALUES ('eff_1', 'lin_1', 'sbx_old', 'br_1', 'email', '{}', 'irreversible', 'lineage', 'k1', 'committed', 1, 1700000000007);
INSERT INTO agent_effect_views VALUES ('sbx_old', 'eff_1');
`;

/** The tenants and replies tables as the last Lockstep before version 9 left them (made outside the numbered steps). */
const TENANTS_AND_REPLIES_SQL = `
CREATE TABLE tenants (name TEXT PRIMARY KEY, token_hash BLOB NOT NULL UNIQUE, created_at INTEGER NOT NULL, max_sandboxes INTEGER,
  max_memory_mb INTEGER, id TEXT, default_cpu_weight INTEGER, max_cpu_weight INTEGER, max_checkpoint_mb INTEGER, max_disk_mb INTEGER,
  default_network TEXT, max_network TEXT);
CREATE UNIQUE INDEX tenants_id ON tenants(id);
CREATE TABLE http_idempotency (tenant TEXT NOT NULL, key TEXT NOT NULL, request_hash TEXT NOT NULL, status INTEGER NOT NULL,
  body TEXT NOT NULL, streamed INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, bytes INTEGER NOT NULL DEFAULT 0,
  kept INTEGER NOT NULL DEFAULT 1, reply_bytes INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (tenant, key));
CREATE INDEX http_idempotency_created ON http_idempotency(created_at);
CREATE INDEX http_idempotency_tenant ON http_idempotency(tenant, created_at);
INSERT INTO tenants VALUES ('acme', x'aa', 1700000000000, 3, 512, 'tn_acme', 100, 400, 64, 1024, 'none', 'egress');
UPDATE sandboxes SET tenant = 'tn_acme';
INSERT INTO http_idempotency VALUES ('tn_acme', 'key-1', 'rh', 201, '{"id":"sbx_old"}', 0, 1700000000008, 100, 1, 16);
`;

/** The LangGraph saver's tables, as savers made them on every open before they were a catalog extension. */
const LANGGRAPH_SQL = `
CREATE TABLE langgraph_checkpoints (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
  parent_checkpoint_id TEXT, sandbox_id TEXT NOT NULL, lockstep_checkpoint_id TEXT NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id));
CREATE TABLE langgraph_writes (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL,
  idx INTEGER NOT NULL, channel TEXT NOT NULL, type TEXT NOT NULL, value BLOB NOT NULL, task_path TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx));
INSERT INTO langgraph_checkpoints VALUES ('thread-1', '', 'lg-1', NULL, 'sbx_old', 'ckpt_old', 1700000000012);
INSERT INTO langgraph_writes VALUES ('thread-1', '', 'lg-1', 'task-1', 0, 'messages', 'json', x'7b7d', '');
`;

interface OldCatalog {
  /** user_version the file was left at (0: written before versions were recorded). */
  version: 0 | 1 | 8;
  /** agent_state_meta's version of the agent-state tables, or null without them. */
  agentState: 1 | 2 | 3 | null;
  tenants: boolean;
}

function writeFullOldCatalog(file: string, o: OldCatalog): void {
  const db = new Database(file);
  db.exec(V1_SQL + CHECKPOINT_ROWS_SQL);
  if (o.version === 8) db.exec(V2_TO_V8_SQL);
  if (o.agentState !== null) {
    db.exec(AGENT_STATE_V1_SQL + AGENT_STATE_ROWS_SQL);
    if (o.agentState >= 2)
      db.exec("ALTER TABLE agent_effects ADD COLUMN runner TEXT; UPDATE agent_effects SET runner = '42:7'");
    if (o.agentState >= 3)
      db.exec(`ALTER TABLE agent_verdicts ADD COLUMN sealed_by TEXT; ALTER TABLE agent_verdicts ADD COLUMN abandoned_by TEXT;
        UPDATE agent_verdicts SET sealed_by = 'ckpt_old'`);
    db.prepare("INSERT INTO agent_state_meta VALUES ('schema_version', ?)").run(String(o.agentState));
  }
  if (o.tenants) db.exec(TENANTS_AND_REPLIES_SQL);
  db.exec(LANGGRAPH_SQL);
  db.pragma(`user_version = ${o.version}`);
  db.close();
}

type Dump = Record<string, Record<string, unknown>[]>;

/** Every row of every table (by rowid, or by primary key in WITHOUT ROWID tables). */
function dump(db: Database.Database): Dump {
  const tables = db
    .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
    .all() as { name: string; sql: string }[];
  const out: Dump = {};
  for (const { name, sql } of tables)
    out[name] = db
      .prepare(`SELECT * FROM ${name} ORDER BY ${/WITHOUT ROWID/i.test(sql) ? '1, 2' : 'rowid'}`)
      .all() as Record<string, unknown>[];
  return out;
}

const cases: OldCatalog[] = [];
for (const version of [0, 1, 8] as const)
  for (const agentState of [null, 1, 2, 3] as const)
    // With and without the tenant tables, each at two agent-state versions.
    cases.push({ version, agentState, tenants: agentState === 1 || agentState === 3 });

for (const o of cases) {
  test(`a version-${o.version} catalog, agent state ${o.agentState ?? 'absent'}, tenants ${o.tenants ? 'present' : 'absent'}: every row survives, once`, (t) => {
    const file = tempFile(t);
    writeFullOldCatalog(file, o);
    const before = (() => {
      const db = new Database(file, { readonly: true });
      try {
        return dump(db);
      } finally {
        db.close();
      }
    })();

    const c = new Catalog(file);
    t.teardown(() => c.close());
    t.is(c.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
    const after = dump(c.db);
    t.false('agent_state_meta' in after, 'agent_state_meta is dropped');
    for (const table of ['tenants', 'http_idempotency', 'agent_effects', 'agent_verdicts', 'catalog_extensions'])
      t.true(table in after, `${table} exists`);
    for (const [table, rows] of Object.entries(before)) {
      if (table === 'agent_state_meta') continue;
      t.is(after[table]?.length, rows.length, `${table}: as many rows`);
      // Same values in every old column; added columns may hold their defaults. The
      // standby columns moved to the instances table (step 16): checked below.
      rows.forEach((row, i) => t.like(after[table]![i], withoutStandbyColumns(table, row), `${table} row ${i}`));
    }
    // sbx_old had no standby (standby_instance NULL): no standby row; its live instance is a row.
    t.is(c.standby('sbx_old'), undefined);
    t.like(c.db.prepare("SELECT * FROM instances WHERE sandbox_id = 'sbx_old' AND role = 'live'").get(), {
      id: o.version === 8 ? 'sbx_old.cd34' : 'sbx_old',
    });
    // Columns added by steps keep what the catalog had (version 8) or get the step's values.
    t.like(
      c.sandbox('sbx_old'),
      o.version === 8 ? { instance: 'sbx_old.cd34', cpu_weight: 200 } : { instance: 'sbx_old' },
    );
    t.like(c.checkpoint('ckpt_old'), { label: 'before', durable_at: o.version === 8 ? 1700000000009 : 1700000000003 });

    // The LangGraph tables are the langgraph extension's: registered by its module, versioned on first use.
    t.is(extensionVersion(c.db, LANGGRAPH_EXTENSION.name), 0);
    t.is(migrateExtension(c.db, LANGGRAPH_EXTENSION.name), 0);
    t.is(extensionVersion(c.db, LANGGRAPH_EXTENSION.name), 1);
    t.deepEqual(dump(c.db).langgraph_checkpoints, before.langgraph_checkpoints);
    t.deepEqual(dump(c.db).langgraph_writes, before.langgraph_writes);

    // Opening again is a no-op: no step runs, nothing changes.
    const settled = dump(c.db);
    c.close();
    const again = new Catalog(file);
    t.teardown(() => again.close());
    t.deepEqual(dump(again.db), settled);
    let ran = 0;
    migrateCatalog(
      again.db,
      MIGRATIONS.map((m) => ({ ...m, up: (d: Database.Database) => (ran++, m.up(d)) })),
    );
    t.is(ran, 0);
    t.is(migrateExtension(again.db, LANGGRAPH_EXTENSION.name), 1);
  });
}

test('agent-state tables from a newer build (agent_state_meta above 3) are refused, and the catalog stays at its version', (t) => {
  const file = tempFile(t);
  writeFullOldCatalog(file, { version: 8, agentState: 3, tenants: false });
  const db = new Database(file);
  db.exec("UPDATE agent_state_meta SET value = '4'");
  db.close();
  t.throws(() => new Catalog(file), { code: 'AGENT_STATE_SCHEMA_TOO_NEW' });
  const check = new Database(file, { readonly: true });
  t.teardown(() => check.close());
  t.is(check.pragma('user_version', { simple: true }), 9, 'steps before the agent-state ones committed, one by one');
  t.is(check.prepare('SELECT value FROM agent_state_meta').pluck().get(), '4');
});

test('a new catalog has every table, and no agent_state_meta', (t) => {
  const c = new Catalog(tempFile(t));
  t.teardown(() => c.close());
  const tables = Object.keys(dump(c.db));
  for (const table of [
    'images',
    'sandboxes',
    'layers',
    'checkpoints',
    'operations',
    'snapshots',
    'exposures',
    'agent_context_items',
    'agent_context_snapshots',
    'agent_observations',
    'agent_verdicts',
    'agent_effects',
    'agent_effect_views',
    'tenants',
    'http_idempotency',
    'catalog_extensions',
  ])
    t.true(tables.includes(table), table);
  t.false(tables.includes('agent_state_meta'));
  t.false(tables.includes('langgraph_checkpoints'), 'extension tables wait for their extension');
});

test('extension steps: unknown names are refused; a newer extension version is CATALOG_TOO_NEW naming it', (t) => {
  const c = new Catalog(tempFile(t));
  t.teardown(() => c.close());
  t.throws(() => migrateExtension(c.db, 'nope'), { code: 'INVALID_ARGUMENT' });
  c.db.prepare("INSERT INTO catalog_extensions VALUES ('langgraph', 7)").run();
  const e = t.throws(() => migrateExtension(c.db, LANGGRAPH_EXTENSION.name), { code: 'CATALOG_TOO_NEW' });
  t.like((e as unknown as { details: object }).details, { extension: 'langgraph', found: 7, supported: 1 });
  t.throws(() => registerExtension({ name: 'langgraph', migrations: [] }), { code: 'INVALID_ARGUMENT' });
});

/** A sandboxes row less the standby_* columns, which step 16 moves to the instances table. */
function withoutStandbyColumns(table: string, row: Record<string, unknown>): Record<string, unknown> {
  if (table !== 'sandboxes') return row;
  return Object.fromEntries(Object.entries(row).filter(([k]) => !k.startsWith('standby_')));
}
