/**
 * Verbs: named snapshots. A snapshot promotes a checkpoint into something
 * that outlives its sandbox: it holds the checkpoint's read-only layer and
 * process image (shared, never copied: see snapshot-rows.ts), its own copy
 * of the context, and its own view of the lineage's records (observations,
 * verdicts, effects sealed up to the checkpoint), so sandboxes started from
 * it later resume the processes, files and context and keep the lineage: a
 * lineage-scoped effect replays there instead of running again.
 *
 * Crash safety: making a snapshot from a checkpoint writes no file, so it is
 * one catalog transaction. Deleting one removes the row first and the files
 * after, only those no other checkpoint or snapshot holds; a crash in
 * between leaves orphans the reaper removes. Importing a bundle (import.ts)
 * is journalled.
 */
import fs from 'node:fs';
import path from 'node:path';
import { newId, type SandboxRow } from '../catalog/catalog.js';
import {
  AlreadyExistsError,
  InvalidArgumentError,
  InvalidStateError,
  LockstepError,
  NotFoundError,
} from '../errors.js';
import { recordedChecksums, verifyCheckpoint } from '../checkpoints/integrity.js';
import { restoreNewInstance } from '../checkpoints/process-image.js';
import {
  abandonChild,
  releaseChild,
  reserveChildren,
  type ForkResult,
  type ReservedChild,
} from '../checkpoints/fork.js';
import type { AgentContext } from '../context/formats.js';
import { releaseFiles } from './holders.js';
import { checkSandboxQuota, checkStoredQuota, tenantOf } from '../tenants/quotas.js';
import { diskBytesFor } from '../lifecycle/create.js';
import {
  SnapshotRows,
  asCheckpoint,
  imageChain,
  templateOf,
  type SnapshotRow,
  type SnapshotTemplate,
} from './snapshot-rows.js';
import type { IntegrityDeps } from '../checkpoints/integrity.js';
import type { ProcessImageDeps } from '../checkpoints/process-image.js';
import type { ForkDeps } from '../checkpoints/fork.js';
import type { HoldersDeps } from './holders.js';
import type { CreateDeps } from '../lifecycle/create.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { Catalog } from '../catalog/catalog.js';
import type { CriuClient, ProcessTable } from '../ports.js';
import type { FaultHook } from '../faults.js';
import type { ImageStore } from '../images/image-store.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { Logger } from '../log.js';
import type { StatePaths } from '../paths.js';

/** What snapshots.ts uses of the manager's services (api/engine.ts builds them). */
export interface SnapshotsDeps extends IntegrityDeps, ProcessImageDeps, ForkDeps, HoldersDeps, CreateDeps {
  agent: AgentState;
  catalog: Catalog;
  criu: CriuClient;
  fault: FaultHook;
  images: ImageStore;
  inits: InitWatcher;
  log: Logger;
  paths: StatePaths;
  proc: ProcessTable;
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
}

export const MAX_SNAPSHOT_STARTS = 64;

/** What `snapshots.create` takes besides the checkpoint. */
export interface SnapshotOptions {
  /** Unique among the tenant's snapshots: lowercase letters, digits, '.', '_' and '-', at most 64. */
  name?: string | undefined;
  metadata?: Record<string, string> | undefined;
  /** The caller's tenant (tn_…): the checkpoint must be one of its sandboxes'. */
  tenant?: string | null | undefined;
}

const NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

export function validateSnapshotName(name: unknown): string | null {
  if (name === undefined || name === null) return null;
  if (typeof name !== 'string' || !NAME.test(name))
    throw new InvalidArgumentError(
      'name',
      'a name of at most 64 lowercase letters, digits, ".", "_" or "-", starting with a letter or digit',
      name,
    );
  return name;
}

export function validateMetadata(metadata: unknown): Record<string, string> {
  if (metadata === undefined || metadata === null) return {};
  if (typeof metadata !== 'object' || Array.isArray(metadata))
    throw new InvalidArgumentError('metadata', 'an object of string values', metadata);
  const entries = Object.entries(metadata as Record<string, unknown>);
  if (entries.length > 64) throw new InvalidArgumentError('metadata', 'at most 64 entries', entries.length);
  for (const [k, v] of entries) {
    if (k.length < 1 || k.length > 200) throw new InvalidArgumentError('metadata', 'keys of 1 to 200 characters', k);
    if (typeof v !== 'string' || v.length > 1024)
      throw new InvalidArgumentError(`metadata.${k}`, 'a string of at most 1024 characters', v);
  }
  return Object.fromEntries(entries) as Record<string, string>;
}

export function validateStartCount(count: unknown): number {
  if (count === undefined) return 1;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_SNAPSHOT_STARTS)
    throw new InvalidArgumentError('count', `an integer from 1 to ${MAX_SNAPSHOT_STARTS}`, count);
  return count;
}

/** The per-object lock of a snapshot (the sandbox-lock machinery, keyed by the snapshot id). */
export async function withSnapshotLock<T>(engine: SnapshotsDeps, id: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await engine.withSandboxLock(id, fn);
  } catch (e) {
    if (e instanceof LockstepError && e.code === 'SANDBOX_BUSY')
      throw new InvalidStateError('SNAPSHOT_BUSY', `Snapshot ${id} is busy (an export or a start is running)`, {
        snapshotId: id,
      });
    throw e;
  }
}

/** The sizes of every file under dir (not following links), walked without blocking the event loop. */
async function apparentBytes(dir: string): Promise<number> {
  let total = 0;
  const walk = async (p: string): Promise<void> => {
    const st = await fs.promises.lstat(p);
    if (st.isDirectory()) for (const name of await fs.promises.readdir(p)) await walk(path.join(p, name));
    else total += st.size;
  };
  await walk(dir).catch(() => undefined);
  return total;
}

/** Refuses a name the tenant already uses, as SNAPSHOT_EXISTS. */
export function assertNameFree(rows: SnapshotRows, name: string | null, tenant: string | null): void {
  if (name !== null && rows.byName(name, tenant)) throw new AlreadyExistsError('snapshot', name);
}

/** Promotes a checkpoint to a named snapshot. */
export async function createSnapshot(
  engine: SnapshotsDeps,
  checkpointId: string,
  opts: SnapshotOptions,
): Promise<SnapshotRow> {
  if (typeof checkpointId !== 'string' || !checkpointId)
    throw new InvalidArgumentError('checkpointId', 'a checkpoint id', checkpointId);
  const name = validateSnapshotName(opts.name);
  const metadata = validateMetadata(opts.metadata);
  const { catalog } = engine;
  const ckpt0 = catalog.checkpoint(checkpointId);
  const owner = ckpt0 ? catalog.sandbox(ckpt0.sandbox_id) : undefined;
  // Another tenant's checkpoint is reported exactly like a missing one.
  if (!ckpt0 || !owner || owner.state === 'removing' || (opts.tenant != null && owner.tenant !== opts.tenant))
    throw new NotFoundError('checkpoint', checkpointId);
  const rows = new SnapshotRows(catalog.db);
  return engine.withSandboxLock(owner.id, async () => {
    // Under the sandbox's lock no checkpoint of it can go away meanwhile.
    const ckpt = catalog.checkpoint(checkpointId);
    const sandbox = catalog.sandbox(owner.id);
    if (!ckpt || !sandbox) throw new NotFoundError('checkpoint', checkpointId);
    if (!recordedChecksums(ckpt))
      throw new InvalidStateError(
        'CHECKPOINT_DAMAGED',
        `Checkpoint ${ckpt.id} was taken before checksums were recorded; take a new checkpoint to snapshot`,
        { checkpointId: ckpt.id },
      );
    await verifyCheckpoint(engine, ckpt);
    const image = catalog.liveImageOrHidden(ckpt.image);
    const sizes = JSON.parse(ckpt.sizes) as { processImageBytes?: number; layerBytes?: number; contextBytes?: number };
    // Without store quotas the checkpoint did not record its layer's bytes: count them (files' sizes).
    const layerBytes = sizes.layerBytes ?? (await apparentBytes(engine.paths.layer(ckpt.layer_id)));
    const id = newId('snap');
    const row: SnapshotRow = {
      id,
      tenant: sandbox.tenant,
      name,
      metadata: JSON.stringify(metadata),
      size_bytes: (sizes.processImageBytes ?? 0) + layerBytes + (sizes.contextBytes ?? 0),
      layer_id: ckpt.layer_id,
      process_image: ckpt.id,
      image: ckpt.image,
      image_source: image.source,
      runtime_layer: ckpt.runtime_layer,
      checksums: ckpt.checksums!,
      context_id: null,
      lineage_id: sandbox.lineage_id,
      ledger_cursor: ckpt.ledger_cursor,
      source_sandbox: sandbox.id,
      source_checkpoint: ckpt.id,
      template: JSON.stringify(templateOf(sandbox)),
      digest: null,
      created_at: Date.now(),
    };
    engine.fault('snapshot:begin');
    const tenant = tenantOf(catalog.db, sandbox.tenant);
    catalog.tx(() => {
      assertNameFree(rows, name, sandbox.tenant);
      // It shares the checkpoint's files, so it adds nothing while the checkpoint lives; a tenant
      // already past its quota (lowered since) gets no snapshot that would outlive the checkpoint.
      if (tenant) checkStoredQuota(catalog.db, tenant, 0);
      // Its own copy of the context (items are content-addressed and shared, so this stores only a list).
      if (ckpt.context_id) {
        const context = engine.agent.contexts.get(ckpt.context_id);
        row.context_id = engine.agent.contexts.put(context).contextId;
      }
      rows.insert(row);
      // The lineage's records up to the checkpoint, viewed from the snapshot (its id stands for a sandbox there).
      const isAnc = engine.agent.ancestry(ckpt.id);
      const branch = newId('br');
      engine.agent.observations.inheritForFork(sandbox.id, ckpt.id, id, branch, isAnc);
      engine.agent.verdicts.inheritForFork(sandbox.id, id, branch, isAnc);
      engine.agent.effects.inheritForFork(sandbox.id, ckpt.id, id, isAnc);
    });
    engine.fault('snapshot:committed');
    engine.log.info({ snapshotId: id, checkpointId: ckpt.id, sandboxId: sandbox.id }, 'snapshot created');
    return rows.get(id)!;
  });
}

/** Removes the records a snapshot holds (its rows of the lineage's records and its context); inside a transaction. */
export function dropSnapshotRecords(engine: SnapshotsDeps, row: SnapshotRow): void {
  const db = engine.catalog.db;
  db.prepare('DELETE FROM agent_observations WHERE sandbox_id = ?').run(row.id);
  db.prepare('DELETE FROM agent_verdicts WHERE sandbox_id = ?').run(row.id);
  db.prepare('DELETE FROM agent_effect_views WHERE sandbox_id = ?').run(row.id);
  if (row.context_id) engine.agent.contexts.delete(row.context_id);
}

/** Deletes a snapshot; its files go once nothing else holds them. */
export async function deleteSnapshot(engine: SnapshotsDeps, ref: string, tenant?: string | null): Promise<void> {
  const rows = new SnapshotRows(engine.catalog.db);
  const first = rows.require(ref, tenant);
  await withSnapshotLock(engine, first.id, async () => {
    const row = rows.get(first.id);
    if (!row) throw new NotFoundError('snapshot', ref);
    const chain = imageChain(engine.paths, row.process_image);
    engine.catalog.tx(() => {
      dropSnapshotRecords(engine, row);
      rows.delete(row.id);
    });
    engine.fault('deleteSnapshot:committed');
    // Files after the commit: a crash in between leaves only orphans, which the reaper removes.
    await releaseFiles(engine, row.layer_id, chain);
    engine.images.collectGarbage();
    engine.log.info({ snapshotId: row.id }, 'snapshot deleted');
  });
  fs.rmSync(engine.paths.sandboxLock(first.id), { force: true });
}

/** The context stored with a snapshot (null if its checkpoint had none). */
export function snapshotContext(engine: SnapshotsDeps, ref: string, tenant?: string | null): AgentContext | null {
  const row = new SnapshotRows(engine.catalog.db).require(ref, tenant);
  return row.context_id ? engine.agent.contexts.get(row.context_id) : null;
}

/** The row of a sandbox started from a snapshot, before it is reserved: the snapshot's source's limits. */
function startRow(engine: SnapshotsDeps, snap: SnapshotRow, tmpl: SnapshotTemplate, tenant: string | null): SandboxRow {
  const id = newId('sbx');
  return {
    id,
    tenant,
    image: snap.image,
    runtime_layer: snap.runtime_layer,
    state: 'creating',
    init_pid: null,
    init_start: null,
    memory_bytes: tmpl.memory_bytes,
    pids_max: tmpl.pids_max,
    cpu_weight: tmpl.cpu_weight,
    cpu_quota_us: tmpl.cpu_quota_us,
    io_weight: tmpl.io_weight,
    disk_bytes: diskBytesFor(engine, tmpl.disk_bytes),
    hostname: tmpl.hostname,
    lineage_id: snap.lineage_id,
    branch_id: newId('br'),
    head_checkpoint_id: null,
    forked_from: snap.source_checkpoint,
    env: tmpl.env,
    metadata: JSON.stringify({ snapshot: snap.id }),
    created_at: Date.now(),
    expires_at: null,
    instance: id,
    id_base: null,
  };
}

async function startOne(
  engine: SnapshotsDeps,
  snap: SnapshotRow,
  tmpl: SnapshotTemplate,
  { child, opId }: ReservedChild,
): Promise<ForkResult> {
  const started = performance.now();
  const { catalog } = engine;
  const id = child.id;
  const ckpt = asCheckpoint(snap);
  try {
    const pid = await restoreNewInstance(engine, id, child, ckpt, () => undefined, tmpl.id_base);
    catalog.tx(() => {
      catalog.insertLayer(`upper_${id}`, 'upper', id);
      catalog.updateSandbox(id, { state: 'running', init_pid: pid, init_start: engine.proc.startTime(pid) ?? null });
      const all = () => true;
      engine.agent.observations.inheritForFork(snap.id, snap.process_image, id, child.branch_id, all);
      engine.agent.verdicts.inheritForFork(snap.id, id, child.branch_id, all);
      engine.agent.effects.inheritForFork(snap.id, snap.process_image, id, all);
      catalog.endOperation(opId);
    });
    engine.inits.track(catalog.sandbox(id)!);
    return { ok: true, id, pid, ms: performance.now() - started };
  } catch (e) {
    engine.log.warn({ err: e, sandboxId: id, snapshotId: snap.id }, 'start from a snapshot failed; removing it');
    return abandonChild(engine, child, opId, e);
  }
}

/** Starts `count` sandboxes from a snapshot (the fork path); one result each. They belong to the snapshot's tenant. */
export async function startFromSnapshot(
  engine: SnapshotsDeps,
  ref: string,
  opts: { count?: number | undefined; tenant?: string | null | undefined; signal?: AbortSignal | undefined } = {},
): Promise<ForkResult[]> {
  const count = validateStartCount(opts.count);
  const rows = new SnapshotRows(engine.catalog.db);
  const first = rows.require(ref, opts.tenant);
  // Refused before anything is made; checked again, for good, when the rows go in.
  const limits = JSON.parse(first.template) as SnapshotTemplate;
  checkSandboxQuota(engine.catalog.db, tenantOf(engine.catalog.db, first.tenant), limits, count);
  await engine.criu.ensureRunning();
  return withSnapshotLock(engine, first.id, async () => {
    const snap = rows.get(first.id);
    if (!snap) throw new NotFoundError('snapshot', ref);
    // Once, before any is made: a damaged snapshot starts none.
    await verifyCheckpoint(engine, asCheckpoint(snap));
    const tmpl = JSON.parse(snap.template) as SnapshotTemplate;
    const children = Array.from({ length: count }, () => startRow(engine, snap, tmpl, snap.tenant));
    // All the rows in one transaction: a start past the tenant's quota makes none (QUOTA_EXCEEDED).
    const reserved = reserveChildren(engine, snap.tenant, children, {
      // The image's user-namespace maps name the source's range: a new sandbox gets one of its own.
      idRange: tmpl.id_base !== null,
      netSlot: false,
      payload: JSON.stringify({ snapshotId: snap.id }),
    });
    const results: ForkResult[] = [];
    // One at a time: each start reads the same image, and the lock is held throughout.
    for (const r of reserved) {
      if (!('child' in r)) {
        results.push(r);
        continue;
      }
      if (opts.signal?.aborted) {
        releaseChild(engine, r);
        results.push({ ok: false, error: { code: 'FORK_ABORTED', message: 'The start was aborted before it began' } });
        continue;
      }
      results.push(await startOne(engine, snap, tmpl, r));
    }
    return results;
  });
}
