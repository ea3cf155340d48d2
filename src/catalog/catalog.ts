/**
 * The catalog: durable metadata in SQLite (WAL, synchronous=FULL). It holds
 * images, sandboxes, layers, checkpoints and the operation journal that
 * makes checkpoint, rollback and fork crash-safe. A checkpoint exists once
 * its row is committed; everything on disk without a row is garbage the
 * reaper removes.
 */
import Database from 'better-sqlite3';
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import { NotFoundError } from '../errors.js';

export type SandboxState = 'creating' | 'running' | 'stopped' | 'removing';

export interface ImageRow {
  name: string;
  rootfs: string;
  source: string;
  size_bytes: number;
  created_at: number;
  deleted: number;
}

export interface SandboxRow {
  id: string;
  tenant: string | null;
  image: string;
  runtime_layer: string;
  state: SandboxState;
  init_pid: number | null;
  init_start: number | null;
  memory_bytes: number | null;
  pids_max: number | null;
  hostname: string;
  lineage_id: string;
  branch_id: string;
  head_checkpoint_id: string | null;
  forked_from: string | null;
  env: string;
  metadata: string;
  created_at: number;
  /** When the sandbox is removed automatically (ms since the epoch), or null. */
  expires_at: number | null;
  /**
   * Key of the host resources (run folder, writable layer, cgroup) of the
   * running instance. It starts as the sandbox id; a rollback to a warm
   * standby swaps in the standby's key.
   */
  instance: string;
  /** A frozen, already-restored instance of standby_checkpoint, or null. */
  standby_instance: string | null;
  standby_checkpoint: string | null;
  standby_pid: number | null;
  standby_start: number | null;
  /**
   * First host id of the sandbox's user namespace (root inside is this host
   * uid/gid; the range is ID_RANGE_SIZE long), or null without one. Unique:
   * no two sandboxes share a range; deleting the row frees it.
   */
  id_base: number | null;
}

export interface CheckpointRow {
  id: string;
  sandbox_id: string;
  parent_id: string | null;
  layer_id: string;
  image: string;
  runtime_layer: string;
  branch_id: string;
  label: string | null;
  ledger_cursor: number;
  context_id: string | null;
  sizes: string;
  timings: string;
  created_at: number;
}

export interface OperationRow {
  id: string;
  kind: 'checkpoint' | 'rollback' | 'fork' | 'create' | 'remove';
  sandbox_id: string;
  phase: string;
  payload: string;
  started_at: number;
}

const SCHEMA_VERSION = 3;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS images (
  name TEXT PRIMARY KEY,
  rootfs TEXT NOT NULL,
  source TEXT NOT NULL,
  size_bytes INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  tenant TEXT,
  image TEXT NOT NULL REFERENCES images(name),
  runtime_layer TEXT NOT NULL,
  state TEXT NOT NULL,
  init_pid INTEGER,
  init_start INTEGER,
  memory_bytes INTEGER,
  pids_max INTEGER,
  hostname TEXT NOT NULL,
  lineage_id TEXT NOT NULL,
  branch_id TEXT NOT NULL,
  head_checkpoint_id TEXT,
  forked_from TEXT,
  env TEXT NOT NULL DEFAULT '{}',
  metadata TEXT NOT NULL DEFAULT '{}',
  created_at INTEGER NOT NULL,
  expires_at INTEGER,
  instance TEXT,
  standby_instance TEXT,
  standby_checkpoint TEXT,
  standby_pid INTEGER,
  standby_start INTEGER
);
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes(tenant);
CREATE TABLE IF NOT EXISTS layers (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('upper', 'checkpoint')),
  sandbox_id TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
  id TEXT PRIMARY KEY,
  sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
  parent_id TEXT,
  layer_id TEXT NOT NULL REFERENCES layers(id),
  image TEXT NOT NULL REFERENCES images(name),
  runtime_layer TEXT NOT NULL,
  branch_id TEXT NOT NULL,
  label TEXT,
  ledger_cursor INTEGER NOT NULL DEFAULT 0,
  context_id TEXT,
  sizes TEXT NOT NULL DEFAULT '{}',
  timings TEXT NOT NULL DEFAULT '{}',
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_sandbox ON checkpoints(sandbox_id);
CREATE TABLE IF NOT EXISTS operations (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  phase TEXT NOT NULL,
  payload TEXT NOT NULL DEFAULT '{}',
  started_at INTEGER NOT NULL
);
`;

/** Random ids with a readable prefix: sbx_, ckpt_, lyr_, op_, br_. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(9).toString('base64url').replace(/[-_]/g, 'x').toLowerCase()}`;
}

/** Typed access to the catalog database. */
export class Catalog {
  readonly db: Database.Database;
  private readonly extraMigrations: ((db: Database.Database) => void)[] = [];

  constructor(file: string, migrations: ((db: Database.Database) => void)[] = []) {
    const existed = fs.existsSync(file);
    this.db = new Database(file);
    if (!existed) fs.chmodSync(file, 0o600);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.pragma('foreign_keys = ON');
    this.db.pragma('busy_timeout = 10000');
    this.extraMigrations = migrations;
    this.migrate();
  }

  private migrate(): void {
    // IMMEDIATE: take the write lock up front, so concurrent managers opening
    // the same directory wait (busy_timeout) instead of failing to upgrade a
    // read transaction ("database is locked").
    this.db.transaction(() => {
      this.db.exec(SCHEMA);
      // v2: sandbox lifetimes. Catalogs made by v1 lack the column.
      const cols = this.db.prepare('PRAGMA table_info(sandboxes)').all() as { name: string }[];
      if (!cols.some((c) => c.name === 'expires_at')) this.db.exec('ALTER TABLE sandboxes ADD COLUMN expires_at INTEGER');
      // v3: instances and warm standbys.
      for (const [col, type] of [['instance', 'TEXT'], ['standby_instance', 'TEXT'], ['standby_checkpoint', 'TEXT'], ['standby_pid', 'INTEGER'], ['standby_start', 'INTEGER']] as const) {
        if (!cols.some((c) => c.name === col)) this.db.exec(`ALTER TABLE sandboxes ADD COLUMN ${col} ${type}`);
      }
      this.db.exec('UPDATE sandboxes SET instance = id WHERE instance IS NULL');
      // User namespaces: each sandbox's host id range.
      if (!cols.some((c) => c.name === 'id_base')) this.db.exec('ALTER TABLE sandboxes ADD COLUMN id_base INTEGER');
      this.db.exec('CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_id_base ON sandboxes(id_base)');
      for (const m of this.extraMigrations) m(this.db);
      if (this.db.pragma('user_version', { simple: true }) !== SCHEMA_VERSION) this.db.pragma(`user_version = ${SCHEMA_VERSION}`);
    }).immediate();
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /** Runs fn in one transaction (nested calls become savepoints). */
  tx<T>(fn: () => T): T {
    return this.db.transaction(fn).immediate();
  }

  // ---- images
  image(name: string): ImageRow | undefined {
    return this.db.prepare('SELECT * FROM images WHERE name = ?').get(name) as ImageRow | undefined;
  }
  liveImage(name: string): ImageRow {
    const row = this.image(name);
    if (!row || row.deleted) throw new NotFoundError('image', name);
    return row;
  }
  /** The image of an existing sandbox or checkpoint, even if it was removed (hidden) since. */
  /** Every instance key the catalog knows (current and standby), for the reaper. */
  instanceKeys(): Set<string> {
    const keys = new Set<string>();
    for (const r of this.allSandboxes()) {
      keys.add(r.instance ?? r.id);
      if (r.standby_instance) keys.add(r.standby_instance);
    }
    return keys;
  }

  liveImageOrHidden(name: string): ImageRow {
    const row = this.image(name);
    if (!row) throw new NotFoundError('image', name);
    return row;
  }
  images(): ImageRow[] {
    return this.db.prepare('SELECT * FROM images WHERE deleted = 0 ORDER BY name').all() as ImageRow[];
  }
  allImages(): ImageRow[] {
    return this.db.prepare('SELECT * FROM images ORDER BY name').all() as ImageRow[];
  }
  putImage(row: ImageRow): void {
    this.db
      .prepare('INSERT OR REPLACE INTO images (name, rootfs, source, size_bytes, created_at, deleted) VALUES (@name, @rootfs, @source, @size_bytes, @created_at, @deleted)')
      .run(row);
  }
  markImageDeleted(name: string): void {
    this.db.prepare('UPDATE images SET deleted = 1 WHERE name = ?').run(name);
  }
  deleteImageRow(name: string): void {
    this.db.prepare('DELETE FROM images WHERE name = ?').run(name);
  }
  imageReferences(name: string): number {
    const a = this.db.prepare('SELECT COUNT(*) AS n FROM sandboxes WHERE image = ?').get(name) as { n: number };
    const b = this.db.prepare('SELECT COUNT(*) AS n FROM checkpoints WHERE image = ?').get(name) as { n: number };
    return a.n + b.n;
  }

  // ---- sandboxes
  sandbox(id: string): SandboxRow | undefined {
    return this.db.prepare('SELECT * FROM sandboxes WHERE id = ?').get(id) as SandboxRow | undefined;
  }
  requireSandbox(id: string, tenant?: string | null): SandboxRow {
    const row = this.sandbox(id);
    // Another tenant's sandbox is reported exactly like a missing one.
    if (!row || row.state === 'removing' || (tenant !== undefined && tenant !== null && row.tenant !== tenant)) {
      throw new NotFoundError('sandbox', id);
    }
    return row;
  }
  sandboxes(tenant?: string | null): SandboxRow[] {
    if (tenant !== undefined && tenant !== null) return this.db.prepare("SELECT * FROM sandboxes WHERE tenant = ? AND state != 'removing' ORDER BY created_at").all(tenant) as SandboxRow[];
    return this.db.prepare("SELECT * FROM sandboxes WHERE state != 'removing' ORDER BY created_at").all() as SandboxRow[];
  }
  allSandboxes(): SandboxRow[] {
    return this.db.prepare('SELECT * FROM sandboxes ORDER BY created_at').all() as SandboxRow[];
  }
  insertSandbox(row: SandboxRow): void {
    this.db
      .prepare(
        `INSERT INTO sandboxes (id, tenant, image, runtime_layer, state, init_pid, init_start, memory_bytes, pids_max, hostname,
          lineage_id, branch_id, head_checkpoint_id, forked_from, env, metadata, created_at, expires_at, instance, id_base)
         VALUES (@id, @tenant, @image, @runtime_layer, @state, @init_pid, @init_start, @memory_bytes, @pids_max, @hostname,
          @lineage_id, @branch_id, @head_checkpoint_id, @forked_from, @env, @metadata, @created_at, @expires_at, @instance, @id_base)`,
      )
      .run(row);
  }
  updateSandbox(id: string, fields: Partial<SandboxRow>): void {
    const keys = Object.keys(fields);
    if (!keys.length) return;
    this.db.prepare(`UPDATE sandboxes SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE id = @id`).run({ ...fields, id });
  }
  /** Host id bases in use, ascending. */
  idBases(): number[] {
    return (this.db.prepare('SELECT id_base FROM sandboxes WHERE id_base IS NOT NULL ORDER BY id_base').all() as { id_base: number }[]).map((r) => r.id_base);
  }
  deleteSandboxRow(id: string): void {
    this.db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id);
  }

  // ---- layers
  insertLayer(id: string, kind: 'upper' | 'checkpoint', sandboxId: string): void {
    this.db.prepare('INSERT INTO layers (id, kind, sandbox_id, created_at) VALUES (?, ?, ?, ?)').run(id, kind, sandboxId, Date.now());
  }
  deleteLayerRow(id: string): void {
    this.db.prepare('DELETE FROM layers WHERE id = ?').run(id);
  }
  layerIds(kind: 'upper' | 'checkpoint'): string[] {
    return (this.db.prepare('SELECT id FROM layers WHERE kind = ?').all(kind) as { id: string }[]).map((r) => r.id);
  }

  // ---- checkpoints
  checkpoint(id: string): CheckpointRow | undefined {
    return this.db.prepare('SELECT * FROM checkpoints WHERE id = ?').get(id) as CheckpointRow | undefined;
  }
  checkpointsOf(sandboxId: string): CheckpointRow[] {
    return this.db.prepare('SELECT * FROM checkpoints WHERE sandbox_id = ? ORDER BY created_at, rowid').all(sandboxId) as CheckpointRow[];
  }
  allCheckpoints(): CheckpointRow[] {
    return this.db.prepare('SELECT * FROM checkpoints').all() as CheckpointRow[];
  }
  insertCheckpoint(row: CheckpointRow): void {
    this.db
      .prepare(
        `INSERT INTO checkpoints (id, sandbox_id, parent_id, layer_id, image, runtime_layer, branch_id, label, ledger_cursor, context_id, sizes, timings, created_at)
         VALUES (@id, @sandbox_id, @parent_id, @layer_id, @image, @runtime_layer, @branch_id, @label, @ledger_cursor, @context_id, @sizes, @timings, @created_at)`,
      )
      .run(row);
  }
  deleteCheckpointRow(id: string): void {
    this.db.prepare('DELETE FROM checkpoints WHERE id = ?').run(id);
  }
  reparentCheckpoints(fromParent: string, toParent: string | null): void {
    this.db.prepare('UPDATE checkpoints SET parent_id = ? WHERE parent_id = ?').run(toParent, fromParent);
  }
  /** Ids from a checkpoint up to the root of its tree, the checkpoint first. */
  ancestry(id: string): string[] {
    const rows = this.db
      .prepare(
        `WITH RECURSIVE up(id, parent_id) AS (
           SELECT id, parent_id FROM checkpoints WHERE id = ?
           UNION ALL SELECT c.id, c.parent_id FROM checkpoints c JOIN up ON c.id = up.parent_id)
         SELECT id FROM up`,
      )
      .all(id) as { id: string }[];
    return rows.map((r) => r.id);
  }

  // ---- operation journal
  beginOperation(op: Omit<OperationRow, 'started_at'>): void {
    this.db.prepare('INSERT INTO operations (id, kind, sandbox_id, phase, payload, started_at) VALUES (?, ?, ?, ?, ?, ?)').run(op.id, op.kind, op.sandbox_id, op.phase, op.payload, Date.now());
  }
  setOperationPhase(id: string, phase: string, payload?: unknown): void {
    if (payload === undefined) this.db.prepare('UPDATE operations SET phase = ? WHERE id = ?').run(phase, id);
    else this.db.prepare('UPDATE operations SET phase = ?, payload = ? WHERE id = ?').run(phase, JSON.stringify(payload), id);
  }
  endOperation(id: string): void {
    this.db.prepare('DELETE FROM operations WHERE id = ?').run(id);
  }
  operations(): OperationRow[] {
    return this.db.prepare('SELECT * FROM operations ORDER BY started_at').all() as OperationRow[];
  }
}
