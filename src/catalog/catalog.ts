/**
 * The catalog: durable metadata in SQLite (WAL, synchronous=FULL). It holds
 * images, sandboxes, layers, checkpoints and the operation journal that
 * makes checkpoint, rollback and fork crash-safe; the same database holds
 * the agent state, tenants and stored replies, whose modules read and write
 * their own rows. Every table is made and upgraded by src/catalog/migrations.ts. A checkpoint exists once
 * its row is committed; everything on disk without a row is garbage the
 * reaper removes.
 */
import Database from 'better-sqlite3';
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import { NotFoundError } from '../errors.js';
import { migrateCatalog } from './migrations.js';

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
   * standby swaps in the standby's key. Its `instances` row (role 'live')
   * follows this column and init_pid/init_start through triggers.
   */
  instance: string;
  /** CPU weight (cgroup v2 scale, 1-10000); null on rows made before limits existed. */
  cpu_weight: number | null;
  /** Hard CPU cap in microseconds per 100 ms period, or null for none. */
  cpu_quota_us: number | null;
  io_weight: number | null;
  /** Disk quota of the writable layer in bytes, or null for none. */
  disk_bytes: number | null;
  /**
   * First host id of the sandbox's user namespace (root inside is this host
   * uid/gid; the range is ID_RANGE_SIZE long), or null without one. Unique:
   * no two sandboxes share a range; deleting the row frees it.
   */
  id_base: number | null;
  /** JSON of the egress policy (src/host/network/policy.ts), or null: loopback only ("none"). */
  network?: string | null;
  /** The sandbox's /31 in the network range (src/host/network/addresses.ts); unique; null without a network. */
  net_slot?: number | null;
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
  /**
   * JSON of CheckpointChecksums (src/checkpoints/integrity.ts); null for checkpoints
   * taken before checksums were recorded.
   */
  checksums?: string | null;
  /**
   * When the checkpoint's files were made durable (syncfs) and checksummed
   * (ms since the epoch); null while that still runs in the background
   * (src/checkpoints/durability.ts). Rows from before migration 5 were durable at commit.
   */
  durable_at?: number | null;
  /** The kernel boot in which the checkpoint was taken: unsynced files outlive a manager crash, not a host restart. */
  boot_id?: string | null;
  /** JSON list of the TCP connections to the outside the tree held (egress sandboxes). */
  connections?: string | null;
}

/** A sandbox's warm standby: a frozen, already-restored instance of a checkpoint (an `instances` row of role 'standby'). */
export interface Standby {
  sandboxId: string;
  /** Key of its host resources (run folder, writable layer, cgroup). */
  instance: string;
  checkpoint: string;
  /** Its init process and that process's start time (a reused pid has another). */
  pid: number | null;
  start: number | null;
  /** When it was made (ms since the epoch): the standby policy evicts the least recently made first. */
  at: number;
}

/** What a `holds` row keeps: a layer (store/layers), an image (images row) or a process image folder. */
export type HeldKind = 'layer' | 'image' | 'process-image';
/** The kind of row that holds it. */
export type HolderKind = 'sandbox' | 'checkpoint' | 'snapshot' | 'instance';

export interface OperationRow {
  id: string;
  kind: 'checkpoint' | 'rollback' | 'fork' | 'create' | 'remove' | 'snapshot-import';
  sandbox_id: string;
  phase: string;
  payload: string;
  started_at: number;
}

/** Random ids with a readable prefix: sbx_, ckpt_, lyr_, op_, br_. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(9).toString('base64url').replace(/[-_]/g, 'x').toLowerCase()}`;
}

/** Typed access to the catalog database. */
export class Catalog {
  readonly db: Database.Database;
  private readonly statements = new Map<string, Database.Statement>();

  /** Opens (or creates) the catalog file and brings its schema to SCHEMA_VERSION (src/catalog/migrations.ts). */
  constructor(file: string) {
    const existed = fs.existsSync(file);
    this.db = new Database(file);
    if (!existed) fs.chmodSync(file, 0o600);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.pragma('foreign_keys = ON');
    this.db.pragma('busy_timeout = 10000');
    try {
      migrateCatalog(this.db);
    } catch (e) {
      this.db.close();
      throw e;
    }
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /**
   * The prepared statement for one SQL text, compiled once per catalog:
   * compiling is most of a small query's cost (a fork makes a dozen of
   * them). The catalog's own statements use the default result mode only.
   */
  private statement(sql: string): Database.Statement {
    let s = this.statements.get(sql);
    if (!s) {
      s = this.db.prepare(sql);
      this.statements.set(sql, s);
    }
    return s;
  }

  /**
   * Runs fn with its commits not fsynced (synchronous=NORMAL), for journal
   * steps whose loss in a host crash leaves a consistent state. WAL frames
   * are appended in order and carry chained checksums, so the next fsynced
   * commit makes these durable too, and a host crash can only lose a suffix
   * of the log: never a later commit without these. A manager crash loses
   * nothing (the frames are in the page cache). Inside a transaction the
   * setting cannot change, and fn runs as it is.
   */
  unsynced<T>(fn: () => T): T {
    if (this.db.inTransaction) return fn();
    this.db.pragma('synchronous = NORMAL');
    try {
      return fn();
    } finally {
      this.db.pragma('synchronous = FULL');
    }
  }

  /** Runs fn in one transaction (nested calls become savepoints). */
  tx<T>(fn: () => T): T {
    return this.db.transaction(fn).immediate();
  }

  // ---- images
  image(name: string): ImageRow | undefined {
    return this.statement('SELECT * FROM images WHERE name = ?').get(name) as ImageRow | undefined;
  }
  liveImage(name: string): ImageRow {
    const row = this.image(name);
    if (!row || row.deleted) throw new NotFoundError('image', name, imageGone(name));
    return row;
  }
  /** Every instance key the catalog knows (live and standby), for the reaper. */
  instanceKeys(): Set<string> {
    return new Set((this.statement('SELECT id FROM instances').all() as { id: string }[]).map((r) => r.id));
  }

  /** The image of an existing sandbox or checkpoint, even if it was removed (hidden) since. */
  liveImageOrHidden(name: string): ImageRow {
    const row = this.image(name);
    if (!row) throw new NotFoundError('image', name, imageGone(name));
    return row;
  }
  images(): ImageRow[] {
    return this.statement('SELECT * FROM images WHERE deleted = 0 ORDER BY name').all() as ImageRow[];
  }
  allImages(): ImageRow[] {
    return this.statement('SELECT * FROM images ORDER BY name').all() as ImageRow[];
  }
  putImage(row: ImageRow): void {
    this.statement(
      'INSERT OR REPLACE INTO images (name, rootfs, source, size_bytes, created_at, deleted) ' +
        'VALUES (@name, @rootfs, @source, @size_bytes, @created_at, @deleted)',
    ).run(row);
  }
  markImageDeleted(name: string): void {
    this.statement('UPDATE images SET deleted = 1 WHERE name = ?').run(name);
  }
  deleteImageRow(name: string): void {
    this.statement('DELETE FROM images WHERE name = ?').run(name);
  }
  /** How many rows (sandboxes, their instances, checkpoints, snapshots) hold the image. */
  imageReferences(name: string): number {
    return this.holders('image', name).length;
  }

  // ---- holds (kept by triggers: src/catalog/schema/instances.ts)
  /** The rows that hold a layer, an image or a process image folder. */
  holders(what: HeldKind, id: string): { holder_kind: HolderKind; holder_id: string }[] {
    return this.statement('SELECT holder_kind, holder_id FROM holds WHERE what = ? AND id = ?').all(what, id) as {
      holder_kind: HolderKind;
      holder_id: string;
    }[];
  }
  /** True while any row holds it: its files may go only once this is false. */
  isHeld(what: HeldKind, id: string): boolean {
    return !!this.statement('SELECT 1 FROM holds WHERE what = ? AND id = ? LIMIT 1').get(what, id);
  }
  /** Everything of one kind that some row (of one kind of holder, if given) holds. */
  heldIds(what: HeldKind, holderKind?: HolderKind): Set<string> {
    const rows = (
      holderKind === undefined
        ? this.statement('SELECT DISTINCT id FROM holds WHERE what = ?').all(what)
        : this.statement('SELECT DISTINCT id FROM holds WHERE what = ? AND holder_kind = ?').all(what, holderKind)
    ) as { id: string }[];
    return new Set(rows.map((r) => r.id));
  }

  // ---- instances (the live one is kept by triggers on sandboxes)
  /** The sandbox's warm standby, or undefined. */
  standby(sandboxId: string): Standby | undefined {
    const r = this.statement(
      "SELECT sandbox_id, id, checkpoint_id, pid, start, created_at FROM instances WHERE sandbox_id = ? AND role = 'standby'",
    ).get(sandboxId) as StandbyRow | undefined;
    return r && toStandby(r);
  }
  /** Every warm standby, least recently made first. */
  standbys(): Standby[] {
    return (
      this.statement(
        'SELECT i.sandbox_id, i.id, i.checkpoint_id, i.pid, i.start, i.created_at FROM instances i ' +
          "JOIN sandboxes s ON s.id = i.sandbox_id WHERE i.role = 'standby' ORDER BY i.created_at, s.created_at, s.rowid",
      ).all() as StandbyRow[]
    ).map(toStandby);
  }
  /** Records the sandbox's warm standby, replacing the one it had. */
  setStandby(sandboxId: string, s: Omit<Standby, 'sandboxId'>): void {
    this.tx(() => {
      this.clearStandby(sandboxId);
      this.statement(
        "INSERT INTO instances (id, sandbox_id, role, checkpoint_id, pid, start, created_at) VALUES (?, ?, 'standby', ?, ?, ?, ?)",
      ).run(s.instance, sandboxId, s.checkpoint, s.pid, s.start, s.at);
    });
  }
  /** Forgets the sandbox's warm standby (its host resources are the caller's to destroy). */
  clearStandby(sandboxId: string): void {
    this.statement("DELETE FROM instances WHERE sandbox_id = ? AND role = 'standby'").run(sandboxId);
  }

  // ---- sandboxes
  sandbox(id: string): SandboxRow | undefined {
    return this.statement('SELECT * FROM sandboxes WHERE id = ?').get(id) as SandboxRow | undefined;
  }
  requireSandbox(id: string, tenant?: string | null): SandboxRow {
    const row = this.sandbox(id);
    // Another tenant's sandbox is reported exactly like a missing one.
    if (!row || row.state === 'removing' || (tenant !== undefined && tenant !== null && row.tenant !== tenant)) {
      throw new NotFoundError('sandbox', id);
    }
    return row;
  }
  /** The sandboxes (a tenant's, when given), oldest first; with metadata, those whose labels include every pair. */
  sandboxes(tenant?: string | null, metadata: Record<string, string> = {}): SandboxRow[] {
    const where = ["state != 'removing'"];
    const args: string[] = [];
    if (tenant !== undefined && tenant !== null) {
      where.push('tenant = ?');
      args.push(tenant);
    }
    // One EXISTS per label over the JSON column: keys need no quoting in a JSON path this way.
    for (const [k, v] of Object.entries(metadata)) {
      where.push("EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE key = ? AND type = 'text' AND value = ?)");
      args.push(k, v);
    }
    return this.statement(`SELECT * FROM sandboxes WHERE ${where.join(' AND ')} ORDER BY created_at`).all(
      ...args,
    ) as SandboxRow[];
  }
  allSandboxes(): SandboxRow[] {
    return this.statement('SELECT * FROM sandboxes ORDER BY created_at').all() as SandboxRow[];
  }
  insertSandbox(row: SandboxRow): void {
    this.statement(
      `INSERT INTO sandboxes (id, tenant, image, runtime_layer, state, init_pid, init_start, memory_bytes,
          pids_max, hostname, lineage_id, branch_id, head_checkpoint_id, forked_from, env, metadata, created_at,
          expires_at, instance, cpu_weight, cpu_quota_us, io_weight, disk_bytes, id_base, network, net_slot)
         VALUES (@id, @tenant, @image, @runtime_layer, @state, @init_pid, @init_start, @memory_bytes,
          @pids_max, @hostname, @lineage_id, @branch_id, @head_checkpoint_id, @forked_from, @env, @metadata,
          @created_at, @expires_at, @instance, @cpu_weight, @cpu_quota_us, @io_weight, @disk_bytes, @id_base, @network, @net_slot)`,
    ).run({ network: null, net_slot: null, ...row });
  }
  /** Sets fields of a sandbox's row; returns the row as updated (undefined: no such sandbox). */
  updateSandbox(id: string, fields: Partial<SandboxRow>): SandboxRow | undefined {
    const keys = Object.keys(fields);
    if (!keys.length) return this.sandbox(id);
    const row = this.statement(
      `UPDATE sandboxes SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE id = @id RETURNING *`,
    ).get({ ...fields, id }) as SandboxRow | undefined;
    // A sandbox that stops (its init exited, a failed rollback) or goes closes its exposed ports:
    // one place, whichever path stopped it (src/network/exposed-ports.ts).
    if (fields.state === 'stopped' || fields.state === 'removing') this.deleteExposuresOf(id);
    return row;
  }
  /** Closes every exposed port of a sandbox (its rows; the proxy looks them up per connection). */
  deleteExposuresOf(sandboxId: string): void {
    this.statement('DELETE FROM exposures WHERE sandbox_id = ?').run(sandboxId);
  }
  /** Host id bases in use, ascending. */
  /** Network slots in use, ascending (src/host/network/addresses.ts). */
  netSlots(): number[] {
    return (
      this.statement('SELECT net_slot FROM sandboxes WHERE net_slot IS NOT NULL ORDER BY net_slot').all() as {
        net_slot: number;
      }[]
    ).map((r) => r.net_slot);
  }
  idBases(): number[] {
    return (
      this.statement('SELECT id_base FROM sandboxes WHERE id_base IS NOT NULL ORDER BY id_base').all() as {
        id_base: number;
      }[]
    ).map((r) => r.id_base);
  }
  deleteSandboxRow(id: string): void {
    this.deleteExposuresOf(id);
    this.statement('DELETE FROM sandboxes WHERE id = ?').run(id);
  }

  // ---- layers
  insertLayer(id: string, kind: 'upper' | 'checkpoint', sandboxId: string): void {
    this.statement('INSERT INTO layers (id, kind, sandbox_id, created_at) VALUES (?, ?, ?, ?)').run(
      id,
      kind,
      sandboxId,
      Date.now(),
    );
  }
  deleteLayerRow(id: string): void {
    this.statement('DELETE FROM layers WHERE id = ?').run(id);
  }
  layerIds(kind: 'upper' | 'checkpoint'): string[] {
    return (this.statement('SELECT id FROM layers WHERE kind = ?').all(kind) as { id: string }[]).map((r) => r.id);
  }

  // ---- checkpoints
  checkpoint(id: string): CheckpointRow | undefined {
    return this.statement('SELECT * FROM checkpoints WHERE id = ?').get(id) as CheckpointRow | undefined;
  }
  checkpointsOf(sandboxId: string): CheckpointRow[] {
    return this.statement('SELECT * FROM checkpoints WHERE sandbox_id = ? ORDER BY created_at, rowid').all(
      sandboxId,
    ) as CheckpointRow[];
  }
  allCheckpoints(): CheckpointRow[] {
    return this.statement('SELECT * FROM checkpoints').all() as CheckpointRow[];
  }
  insertCheckpoint(row: CheckpointRow): void {
    this.statement(
      `INSERT INTO checkpoints (id, sandbox_id, parent_id, layer_id, image, runtime_layer, branch_id, label,
         ledger_cursor, context_id, sizes, timings, created_at, checksums, durable_at, boot_id, connections)
         VALUES (@id, @sandbox_id, @parent_id, @layer_id, @image, @runtime_layer, @branch_id, @label, @ledger_cursor,
           @context_id, @sizes, @timings, @created_at, @checksums, @durable_at, @boot_id, @connections)`,
    ).run({
      checksums: null,
      boot_id: null,
      connections: null,
      ...row,
      durable_at: row.durable_at === undefined ? row.created_at : row.durable_at,
    });
  }
  /** Checkpoints whose files are not durable yet (of one sandbox, or all), oldest first. */
  pendingCheckpoints(sandboxId?: string): CheckpointRow[] {
    if (sandboxId === undefined)
      return this.statement(
        'SELECT * FROM checkpoints WHERE durable_at IS NULL ORDER BY created_at, rowid',
      ).all() as CheckpointRow[];
    return this.statement(
      'SELECT * FROM checkpoints WHERE durable_at IS NULL AND sandbox_id = ? ORDER BY created_at, rowid',
    ).all(sandboxId) as CheckpointRow[];
  }
  /** Records a pending checkpoint as durable, with its checksums; false if it is gone or was already durable. */
  markCheckpointDurable(
    id: string,
    fields: { checksums: string; sizes: string; timings: string; durable_at: number },
  ): boolean {
    return (
      this.statement(
        'UPDATE checkpoints SET checksums = @checksums, sizes = @sizes, timings = @timings, durable_at = @durable_at WHERE id = @id AND durable_at IS NULL',
      ).run({ ...fields, id }).changes === 1
    );
  }
  setCheckpointChecksums(id: string, checksums: string): void {
    this.statement('UPDATE checkpoints SET checksums = ? WHERE id = ?').run(checksums, id);
  }
  deleteCheckpointRow(id: string): void {
    this.statement('DELETE FROM checkpoints WHERE id = ?').run(id);
  }
  reparentCheckpoints(fromParent: string, toParent: string | null): void {
    this.statement('UPDATE checkpoints SET parent_id = ? WHERE parent_id = ?').run(toParent, fromParent);
  }
  /** Ids from a checkpoint up to the root of its tree, the checkpoint first. */
  ancestry(id: string): string[] {
    const rows = this.statement(
      `WITH RECURSIVE up(id, parent_id) AS (
           SELECT id, parent_id FROM checkpoints WHERE id = ?
           UNION ALL SELECT c.id, c.parent_id FROM checkpoints c JOIN up ON c.id = up.parent_id)
         SELECT id FROM up`,
    ).all(id) as { id: string }[];
    return rows.map((r) => r.id);
  }

  // ---- operation journal
  beginOperation(op: Omit<OperationRow, 'started_at'>): void {
    this.statement(
      'INSERT INTO operations (id, kind, sandbox_id, phase, payload, started_at) VALUES (?, ?, ?, ?, ?, ?)',
    ).run(op.id, op.kind, op.sandbox_id, op.phase, op.payload, Date.now());
  }
  setOperationPhase(id: string, phase: string, payload?: unknown): void {
    if (payload === undefined) this.statement('UPDATE operations SET phase = ? WHERE id = ?').run(phase, id);
    else
      this.statement('UPDATE operations SET phase = ?, payload = ? WHERE id = ?').run(
        phase,
        JSON.stringify(payload),
        id,
      );
  }
  endOperation(id: string): void {
    this.statement('DELETE FROM operations WHERE id = ?').run(id);
  }
  operations(): OperationRow[] {
    return this.statement('SELECT * FROM operations ORDER BY started_at').all() as OperationRow[];
  }
}

interface StandbyRow {
  sandbox_id: string;
  id: string;
  checkpoint_id: string;
  pid: number | null;
  start: number | null;
  created_at: number;
}

function toStandby(r: StandbyRow): Standby {
  return {
    sandboxId: r.sandbox_id,
    instance: r.id,
    checkpoint: r.checkpoint_id,
    pid: r.pid,
    start: r.start,
    at: r.created_at,
  };
}

/** What IMAGE_NOT_FOUND says when a sandbox's or checkpoint's image row is gone: the commands that make it again. */
function imageGone(name: string): string {
  return (
    `its image is gone from this state directory: make it again with \`lockstep image build ${name}\` ` +
    `(a shipped recipe) or \`lockstep image import docker:REF --name ${name}\``
  );
}
