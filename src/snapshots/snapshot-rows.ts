/**
 * Named snapshots in the catalog (table `snapshots`, catalog step 6), and
 * the chain of process image folders a snapshot's image links to.
 *
 * A snapshot never copies what it keeps: its read-only layer
 * (store/layers/<lyr>) and its process image (store/process-images/<dir>,
 * with the images its `parent` link names) are the very files of the
 * checkpoint it came from. Holding is counted by query, not by a counter:
 * a layer or image folder stays on disk while any row holds it (the
 * catalog's `holds` table, src/snapshots/holders.ts), so a crash between a row's deletion and a file's
 * can leave an orphan (the reaper removes it) but never a count that drifts.
 */
import fs from 'node:fs';
import type Database from 'better-sqlite3';
import type { CheckpointRow, SandboxRow } from '../catalog/catalog.js';
import type { StatePaths } from '../paths.js';
import { NotFoundError } from '../errors.js';
import { parentOf } from '../checkpoints/page-delta.js';

/** A snapshot's catalog row. */
export interface SnapshotRow {
  id: string;
  /** Id (tn_…) of the owning tenant, or null outside any tenant. */
  tenant: string | null;
  name: string | null;
  metadata: string;
  size_bytes: number;
  layer_id: string;
  /** Folder under store/process-images holding the CRIU image (the source checkpoint's id, or a new one on import). */
  process_image: string;
  image: string;
  /** The image's identity (ImageRow.source: a recipe's content hash, a Docker image's id). */
  image_source: string;
  runtime_layer: string;
  /** JSON of CheckpointChecksums: what the layer and the image were when the snapshot was made. */
  checksums: string;
  context_id: string | null;
  lineage_id: string;
  ledger_cursor: number;
  source_sandbox: string | null;
  source_checkpoint: string | null;
  /** JSON of SnapshotTemplate: what sandboxes started from it get. */
  template: string;
  /** SHA-256 of its bundle, once exported or imported. */
  digest: string | null;
  /** Length of that bundle in bytes, once known. */
  bundle_bytes?: number | null;
  created_at: number;
}

/** What a sandbox started from a snapshot inherits from the sandbox the snapshot came from. */
export interface SnapshotTemplate {
  memory_bytes: number | null;
  pids_max: number | null;
  cpu_weight: number | null;
  cpu_quota_us: number | null;
  io_weight: number | null;
  disk_bytes: number | null;
  hostname: string;
  env: string;
  /** Host id range the layer's files and the image's user-namespace maps are in (null: no user namespace). */
  id_base: number | null;
}

export function templateOf(row: SandboxRow): SnapshotTemplate {
  return {
    memory_bytes: row.memory_bytes,
    pids_max: row.pids_max,
    cpu_weight: row.cpu_weight,
    cpu_quota_us: row.cpu_quota_us,
    io_weight: row.io_weight,
    disk_bytes: row.disk_bytes,
    hostname: row.hostname,
    env: row.env,
    id_base: row.id_base,
  };
}

/** A snapshot as the SDK, the API and the CLI show it. */
export interface SnapshotInfo {
  id: string;
  name: string | null;
  tenant: string | null;
  metadata: Record<string, string>;
  /** What it holds: process image, layer (file bytes; shared with the checkpoint, not copied) and context. */
  sizeBytes: number;
  image: string;
  lineageId: string;
  sourceSandboxId: string | null;
  sourceCheckpointId: string | null;
  /** The bundle's SHA-256 (hex) once it has been exported or imported, else null. */
  digest: string | null;
  /** Memory limit of the sandboxes it starts (its source's), in MiB. */
  memoryMb: number | null;
  createdAt: string;
}

export function snapshotInfo(row: SnapshotRow): SnapshotInfo {
  return {
    id: row.id,
    name: row.name,
    tenant: row.tenant,
    metadata: JSON.parse(row.metadata) as Record<string, string>,
    sizeBytes: row.size_bytes,
    image: row.image,
    lineageId: row.lineage_id,
    sourceSandboxId: row.source_sandbox,
    sourceCheckpointId: row.source_checkpoint,
    digest: row.digest,
    memoryMb: (() => {
      const m = (JSON.parse(row.template) as SnapshotTemplate).memory_bytes;
      return m === null ? null : m / (1024 * 1024);
    })(),
    createdAt: new Date(row.created_at).toISOString(),
  };
}

/** Typed SQL over the snapshots table. */
export class SnapshotRows {
  constructor(private readonly db: Database.Database) {}

  get(id: string): SnapshotRow | undefined {
    return this.db.prepare('SELECT * FROM snapshots WHERE id = ?').get(id) as SnapshotRow | undefined;
  }

  /** By id or name, if the tenant owns it: another tenant's is SNAPSHOT_NOT_FOUND, like a missing one. */
  require(ref: string, tenant?: string | null): SnapshotRow {
    const row = ref.startsWith('snap_') ? this.get(ref) : this.byName(ref, tenant ?? null);
    if (!row || (tenant !== undefined && tenant !== null && row.tenant !== tenant))
      throw new NotFoundError('snapshot', ref);
    return row;
  }

  byName(name: string, tenant: string | null): SnapshotRow | undefined {
    return this.db
      .prepare("SELECT * FROM snapshots WHERE name = ? AND coalesce(tenant, '') = coalesce(?, '')")
      .get(name, tenant) as SnapshotRow | undefined;
  }

  list(tenant?: string | null): SnapshotRow[] {
    if (tenant !== undefined && tenant !== null)
      return this.db
        .prepare('SELECT * FROM snapshots WHERE tenant = ? ORDER BY created_at, rowid')
        .all(tenant) as SnapshotRow[];
    return this.db.prepare('SELECT * FROM snapshots ORDER BY created_at, rowid').all() as SnapshotRow[];
  }

  insert(row: SnapshotRow): void {
    this.db
      .prepare(
        `INSERT INTO snapshots (id, tenant, name, metadata, size_bytes, layer_id, process_image, image, image_source,
          runtime_layer, checksums, context_id, lineage_id, ledger_cursor, source_sandbox, source_checkpoint, template,
          digest, created_at)
         VALUES (@id, @tenant, @name, @metadata, @size_bytes, @layer_id, @process_image, @image, @image_source,
          @runtime_layer, @checksums, @context_id, @lineage_id, @ledger_cursor, @source_sandbox, @source_checkpoint,
          @template, @digest, @created_at)`,
      )
      .run(row);
  }

  delete(id: string): void {
    this.db.prepare('DELETE FROM snapshots WHERE id = ?').run(id);
  }

  setDigest(id: string, digest: string, bytes: number): void {
    this.db.prepare('UPDATE snapshots SET digest = ?, bundle_bytes = ? WHERE id = ?').run(digest, bytes, id);
  }

  setChecksums(processImage: string, checksums: (old: string) => string): void {
    for (const r of this.db
      .prepare('SELECT id, checksums FROM snapshots WHERE process_image = ?')
      .all(processImage) as {
      id: string;
      checksums: string;
    }[])
      this.db.prepare('UPDATE snapshots SET checksums = ? WHERE id = ?').run(checksums(r.checksums), r.id);
  }
}

/** An image folder and the folders its `parent` links name, nearest first (a cycle or a missing folder ends it). */
export function imageChain(paths: StatePaths, first: string): string[] {
  const chain: string[] = [];
  for (let at: string | null = first; at !== null && !chain.includes(at);) {
    chain.push(at);
    const dir = paths.processImage(at);
    try {
      at = fs.existsSync(dir) ? parentOf(dir) : null;
    } catch {
      at = null; // a damaged link: the restore's verification reports it
    }
  }
  return chain;
}

/** The checkpoint-shaped view of a snapshot that the restore and verify paths take. */
export function asCheckpoint(row: SnapshotRow): CheckpointRow {
  return {
    id: row.process_image,
    sandbox_id: row.source_sandbox ?? row.id,
    parent_id: null,
    layer_id: row.layer_id,
    image: row.image,
    runtime_layer: row.runtime_layer,
    branch_id: '',
    label: row.name,
    ledger_cursor: row.ledger_cursor,
    context_id: row.context_id,
    sizes: '{}',
    timings: '{}',
    created_at: row.created_at,
    checksums: row.checksums,
  };
}
