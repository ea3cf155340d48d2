/**
 * Verb: checkpoint. Freeze the sandbox's cgroup, snapshot its writable layer
 * (btrfs, O(1)), dump the process tree with CRIU (the tree keeps running),
 * thaw, then commit one catalog transaction: from then on it can be rolled
 * back to. Its files are made durable and checksummed afterwards, in the
 * background (durability.ts), unless durableLater is off; a warm standby of
 * it may follow (after-commit.ts). The checkpoint
 * exists only once that transaction commits; a failure (or a crash: see the
 * reaper) at any step before leaves no trace and the sandbox running.
 */
import fs from 'node:fs';
import { newId, type CheckpointRow, type SandboxRow } from '../catalog/catalog.js';
import { CriuError, InvalidArgumentError, InvalidStateError, LockstepError, StoreFullError } from '../errors.js';
import { processVitals } from '../host/proc.js';
import { dumpOptions, tracksWrites } from '../instances/criu-options.js';
import { shareProcessImageWith } from '../instances/id-shift.js';
import { hashProcessImage, layerFingerprint, type CheckpointChecksums } from './integrity.js';
import { AgentState } from '../agent-state/agent-state.js';
import { assertInit } from '../instances/identity.js';
import { checkStoredQuota, tenantOf } from '../tenants/quotas.js';
import { keepChangedPagesOnly } from './page-store.js';
import { MAX_CHAIN_DEPTH, chainDepth, dropUnusedParentLink } from './page-delta.js';
import { afterCheckpoint } from './after-commit.js';
import type { AfterCommitDeps } from './after-commit.js';
import type { ProcessImageDeps } from './process-image.js';
import type { IntegrityDeps } from './integrity.js';
import type { PageStoreDeps } from './page-store.js';
import type { CriuClient, LayerPort, NativeBinding, ProcessTable } from '../ports.js';
import type { FaultHook } from '../faults.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';
import type { StatePaths } from '../paths.js';

/** What checkpoint.ts uses of the manager's services (api/engine.ts builds them). */
export interface CheckpointDeps extends ProcessImageDeps, IntegrityDeps, PageStoreDeps, AfterCommitDeps {
  agent: AgentState;
  config: LockstepConfig;
  criu: CriuClient;
  fault: FaultHook;
  layers: LayerPort;
  log: Logger;
  native: NativeBinding;
  paths: StatePaths;
  proc: ProcessTable;
}

export interface CheckpointOptions {
  label?: string | undefined;
  /**
   * The agent's context at this point, in one of the supported formats (stored with
   * msgpackr, shared prefixes once).
   */
  context?: unknown;
  signal?: AbortSignal | undefined;
}

export interface CheckpointTimings {
  freezeMs: number;
  snapshotMs: number;
  dumpMs: number;
  frozenMs: number;
  /** Comparing the dump with the parent's image and keeping only the pages that changed. */
  deltaMs: number;
  /** syncfs and checksums before the commit (only with durableLater off). */
  persistMs: number;
  commitMs: number;
  /** Background durability (durability.ts): the store's syncfs, the checksums, and start of checkpoint → durable record. */
  syncMs: number;
  hashMs: number;
  toDurableMs: number;
  totalMs: number;
}

export interface CheckpointInfo {
  id: string;
  parentId: string | null;
  sandboxId: string;
  layerId: string;
  branchId: string;
  label: string | null;
  createdAt: string;
  contextId: string | null;
  ledgerCursor: number;
  /** layerBytes: what the checkpoint's layer referenced when taken (absent when the store has no quotas on). */
  sizes: { processImageBytes: number; layerBytes?: number; contextBytes?: number };
  timings: Partial<CheckpointTimings>;
  /** When the files were made durable and checksummed; null while that runs in the background (a rollback to it still works). */
  durableAt: string | null;
}

export function checkpointInfo(row: CheckpointRow): CheckpointInfo {
  return {
    id: row.id,
    parentId: row.parent_id,
    sandboxId: row.sandbox_id,
    layerId: row.layer_id,
    branchId: row.branch_id,
    label: row.label,
    createdAt: new Date(row.created_at).toISOString(),
    contextId: row.context_id,
    ledgerCursor: row.ledger_cursor,
    sizes: JSON.parse(row.sizes),
    timings: JSON.parse(row.timings),
    durableAt: row.durable_at === null || row.durable_at === undefined ? null : new Date(row.durable_at).toISOString(),
  };
}

/** Bytes of a process image folder (its files' sizes; the `parent` link counts as its target's length). */
function processImageBytes(dir: string): number {
  let n = 0;
  for (const name of fs.readdirSync(dir)) n += fs.lstatSync(`${dir}/${name}`).size;
  return n;
}

export function validateLabel(label: unknown): string | null {
  if (label === undefined || label === null) return null;
  if (typeof label !== 'string' || label.length > 200 || /[\0\n]/.test(label))
    throw new InvalidArgumentError('label', 'a single-line string of at most 200 characters', label);
  return label;
}

/**
 * The image a tracked dump may store only the written pages against
 * ("../ID"): the sandbox's head checkpoint, when it is this sandbox's own
 * (images link only within a sandbox: page-store.ts), its folder is here,
 * and its chain is not at the depth bound yet. CRIU itself decides whether
 * the processes' tracking really dates from that dump, and dumps them whole
 * otherwise (after a rollback, a fork, a restart of the keeper).
 */
function incrementalParent(engine: CheckpointDeps, row: SandboxRow): string | undefined {
  const head = row.head_checkpoint_id;
  if (!head) return undefined;
  if (engine.catalog.checkpoint(head)?.sandbox_id !== row.id) return undefined;
  const dir = engine.paths.processImage(head);
  try {
    if (!fs.existsSync(dir) || chainDepth(dir) >= MAX_CHAIN_DEPTH) return undefined;
  } catch {
    return undefined; // a damaged chain: this checkpoint starts a new one
  }
  return `../${head}`;
}

export async function checkpointSandbox(
  engine: CheckpointDeps,
  row: SandboxRow,
  opts: CheckpointOptions = {},
): Promise<CheckpointInfo> {
  const label = validateLabel(opts.label);
  const context = opts.context === undefined ? undefined : AgentState.validateContext(opts.context);
  if (row.state !== 'running' || !row.init_pid)
    throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${row.id} is not running`, { sandboxId: row.id });
  opts.signal?.throwIfAborted();
  const { catalog, layers, cgroups, runtime, paths } = engine;
  const cg = runtime.cgroupName(row.instance);
  const checkpointId = newId('ckpt');
  const layerId = newId('lyr');
  const opId = newId('op');
  const imagesDir = paths.processImage(checkpointId);
  const log = engine.log.child({ sandboxId: row.id, checkpointId });
  await engine.criu.ensureRunning();
  opts.signal?.throwIfAborted();
  catalog.beginOperation({
    id: opId,
    kind: 'checkpoint',
    sandbox_id: row.id,
    phase: 'started',
    payload: JSON.stringify({ checkpointId, layerId }),
  });
  engine.fault('checkpoint:begin');

  const t: Partial<CheckpointTimings> = {};
  const t0 = performance.now();
  let frozenAt = 0;
  let committed!: CheckpointRow;
  try {
    fs.mkdirSync(imagesDir, { mode: 0o700 });
    await cgroups.freeze(cg);
    frozenAt = performance.now();
    t.freezeMs = frozenAt - t0;
    engine.fault('checkpoint:frozen');
    try {
      // CRIU takes a bare pid: with the tree frozen, make sure it still names this sandbox's init.
      assertInit(engine, row);
      const vitals = processVitals(row.init_pid);
      await layers.snapshotUpper(row.instance, layerId);
      const ts = performance.now();
      t.snapshotMs = ts - frozenAt;
      engine.fault('checkpoint:snapshotted');
      const trackMem = tracksWrites(engine);
      const parentImg = trackMem ? incrementalParent(engine, row) : undefined;
      const dumped = await engine.criu
        .dump({
          ...dumpOptions(engine, { initPid: row.init_pid!, instance: row.instance }, imagesDir),
          trackMem,
          ...(parentImg === undefined ? {} : { parentImg }),
        })
        .catch((e: unknown) => {
          // What the init was when frozen, and after: says whether something had killed it (pending SIGKILL, bit 9).
          if (e instanceof LockstepError)
            Object.assign(e.details, { initVitals: { frozen: vitals, afterDump: processVitals(row.init_pid!) } });
          throw e;
        });
      t.dumpMs = performance.now() - ts;
      if (dumped.tracked && parentImg !== undefined) dropUnusedParentLink(imagesDir);
      engine.fault('checkpoint:dumped');
    } finally {
      cgroups.thaw(cg);
      t.frozenMs = performance.now() - frozenAt;
    }
    const td = performance.now();
    await keepChangedPagesOnly(engine, row, imagesDir, log);
    t.deltaMs = performance.now() - td;
    engine.fault('checkpoint:delta');
    // After the delta: the pages files it wrote must belong to the sandbox's root too.
    shareProcessImageWith(imagesDir, row.id_base);
    // Runnable first (the default): the record commits now, with the files in
    // the page cache, and durability (syncfs, checksums) follows behind the
    // sandbox's lock (durability.ts). With durableLater off, both happen here,
    // before the record: one btrfs commit covers the snapshot and every file
    // of the process image, hashed meanwhile from the page cache.
    let checksums: CheckpointChecksums | null = null;
    let imageBytes: number;
    if (engine.config.durableLater) {
      imageBytes = processImageBytes(imagesDir);
    } else {
      const tp = performance.now();
      const [, images] = await Promise.all([layers.sync(), hashProcessImage(imagesDir)]);
      checksums = { images, layer: layerFingerprint(engine.native, paths.layer(layerId)) };
      imageBytes = Object.values(images).reduce((n, f) => n + f.size, 0);
      t.persistMs = performance.now() - tp;
      engine.fault('checkpoint:persisted');
    }

    const tc = performance.now();
    const sizes: CheckpointInfo['sizes'] = { processImageBytes: imageBytes };
    // The snapshot's own commit set its qgroup numbers (durability.ts records them again after the sync).
    const layerBytes = layers.layerBytes(layerId);
    if (layerBytes !== null) sizes.layerBytes = layerBytes;
    catalog.tx(() => {
      // In the commit transaction, so that two checkpoints cannot both fit the last room.
      const tenant = tenantOf(catalog.db, row.tenant);
      if (tenant) checkStoredQuota(catalog.db, tenant, sizes.processImageBytes + (sizes.layerBytes ?? 0));
      const fresh = catalog.sandbox(row.id)!;
      const extra = engine.agent.onCheckpoint(fresh, checkpointId, context);
      if (extra.contextBytes !== undefined) sizes.contextBytes = extra.contextBytes;
      catalog.insertLayer(layerId, 'checkpoint', row.id);
      t.commitMs = performance.now() - tc;
      t.totalMs = performance.now() - t0;
      committed = {
        id: checkpointId,
        sandbox_id: row.id,
        parent_id: fresh.head_checkpoint_id,
        layer_id: layerId,
        image: fresh.image,
        runtime_layer: fresh.runtime_layer,
        branch_id: fresh.branch_id,
        label,
        ledger_cursor: extra.ledgerCursor,
        context_id: extra.contextId,
        sizes: JSON.stringify(sizes),
        timings: JSON.stringify(t),
        created_at: Date.now(),
        checksums: checksums ? JSON.stringify(checksums) : null,
        durable_at: checksums ? Date.now() : null,
        boot_id: engine.proc.bootId(),
      };
      catalog.insertCheckpoint(committed);
      catalog.updateSandbox(row.id, { head_checkpoint_id: checkpointId });
      catalog.endOperation(opId);
    });
  } catch (e) {
    const err = storeFullOr(engine, e);
    log.warn({ err }, 'checkpoint failed; removing partial state');
    await discardCheckpointFiles(engine, checkpointId, layerId);
    catalog.endOperation(opId);
    throw err;
  }
  // Past the commit the checkpoint exists: nothing after this point may discard its files.
  engine.fault('checkpoint:committed');
  log.info({ timings: t }, 'checkpoint committed');
  // Queued behind the lock the caller holds: durability first, then the standby (which verifies against it).
  afterCheckpoint(engine, committed);
  return checkpointInfo(committed);
}

/** Less than this free in the store right after CRIU failed means its writes hit ENOSPC. */
const STORE_FULL_SLACK = 4 << 20;

/**
 * CRIU reports a dump that ran out of room only as a failed dump (and its log
 * could not be written either): if the store is full at that moment, before
 * the partial image is removed, say so, with CRIU's error as the cause.
 */
function storeFullOr(engine: CheckpointDeps, e: unknown): unknown {
  if (!(e instanceof CriuError)) return e;
  try {
    if (engine.layers.freeBytes() < STORE_FULL_SLACK)
      return new StoreFullError('CRIU could not write the process image', e);
  } catch {
    // statfs failing is no reason to hide CRIU's own error.
  }
  return e;
}

/** Removes a checkpoint's layer and process image (idempotent). */
export async function discardCheckpointFiles(
  engine: CheckpointDeps,
  checkpointId: string,
  layerId: string,
): Promise<void> {
  await engine.layers.deleteLayer(layerId);
  // A CRIU worker of a manager that died mid-dump may still be writing its last file here:
  // rm retries ENOTEMPTY a few times (seen in the random-kill test) instead of failing the reaper.
  // On libuv's pool: the folder holds files per process of the sandbox, a count the sandbox sets.
  await fs.promises.rm(engine.paths.processImage(checkpointId), {
    recursive: true,
    force: true,
    maxRetries: 10,
    retryDelay: 100,
  });
}
