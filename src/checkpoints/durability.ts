/**
 * Runnable first, durable later. A checkpoint's catalog row commits as soon
 * as its layer snapshot and its process image are written (the data is in
 * the page cache, so a rollback to it works at once); this step then makes
 * the files durable (one `syncfs` of the store) and records their checksums
 * (integrity.ts), behind the sandbox's lock, before anything else queued for
 * the sandbox (the warm standby) runs.
 *
 * Until then the row has `durable_at` NULL and the boot id of the kernel
 * whose page cache holds the files:
 * - a restore from it (rollback by CRIU, fork, warm standby) first makes it
 *   durable (ensureDurable), so every restore is verified against checksums;
 * - a manager crash leaves the files whole in the page cache: the reaper
 *   makes the checkpoint durable (same boot id);
 * - a host restart may have lost any part of them, and there is nothing to
 *   check them against: the reaper drops the checkpoint (another boot id).
 * (Decision and measurements: docs/decisions/durable-later.md, "Runnable first, durable later".)
 */
import type { CheckpointRow, Catalog } from '../catalog/catalog.js';
import { hashProcessImage, layerFingerprint, type CheckpointChecksums } from './integrity.js';
import { CheckpointCorruptError } from './integrity.js';
import type { IntegrityDeps } from './integrity.js';
import type { FaultHook } from '../faults.js';
import type { Logger } from '../log.js';
import type { LayerPort, NativeBinding, ProcessTable } from '../ports.js';
import type { StatePaths } from '../paths.js';

/** What durability.ts uses of the manager's services (api/engine.ts builds them). */
export interface DurabilityDeps extends IntegrityDeps {
  catalog: Catalog;
  fault: FaultHook;
  layers: LayerPort;
  log: Logger;
  native: NativeBinding;
  paths: StatePaths;
  proc: ProcessTable;
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
}

/** Background durability steps in flight in this process, by checkpoint id. */
const inFlight = new WeakMap<object, Map<string, Promise<void>>>();

function flights(engine: DurabilityDeps): Map<string, Promise<void>> {
  let m = inFlight.get(engine.catalog);
  if (!m) inFlight.set(engine.catalog, (m = new Map()));
  return m;
}

/** What one checkpoint's files are, read from the page cache (call after the store's syncfs). */
export async function checksumsOf(engine: DurabilityDeps, ckpt: Pick<CheckpointRow, 'id' | 'layer_id'>) {
  const images = await hashProcessImage(engine.paths.processImage(ckpt.id));
  const checksums: CheckpointChecksums = {
    images,
    layer: layerFingerprint(engine.native, engine.paths.layer(ckpt.layer_id)),
  };
  return checksums;
}

/**
 * Makes the given pending checkpoints durable: one syncfs covers them all
 * (and their parents' images, which live on the same filesystem), then each
 * is hashed and recorded. Idempotent: a checkpoint already durable, or
 * deleted meanwhile, is left alone.
 */
export async function makeDurable(engine: DurabilityDeps, pending: CheckpointRow[]): Promise<string[]> {
  if (!pending.length) return [];
  const { catalog, layers } = engine;
  engine.fault('durable:begin');
  const t0 = performance.now();
  await layers.sync();
  const syncMs = performance.now() - t0;
  engine.fault('durable:synced');
  const done: string[] = [];
  for (const ckpt of pending) {
    const th = performance.now();
    let checksums: CheckpointChecksums;
    try {
      checksums = await checksumsOf(engine, ckpt);
    } catch (e) {
      // Deleted while this ran (its files go after its row): nothing to record.
      if (!catalog.checkpoint(ckpt.id)) continue;
      throw e;
    }
    const fresh = catalog.checkpoint(ckpt.id);
    if (!fresh || fresh.durable_at !== null) continue;
    const sizes = JSON.parse(fresh.sizes) as Record<string, number>;
    sizes.processImageBytes = Object.values(checksums.images).reduce((n, f) => n + f.size, 0);
    const layerBytes = layers.layerBytes(ckpt.layer_id); // exact now: the sync committed the qgroup numbers
    if (layerBytes !== null) sizes.layerBytes = layerBytes;
    const now = Date.now();
    const timings = JSON.parse(fresh.timings) as Record<string, number>;
    timings.syncMs = syncMs;
    timings.hashMs = performance.now() - th;
    // From the start of the checkpoint to this record: what "time to durable" means in the bench.
    timings.toDurableMs = (timings.totalMs ?? 0) + (now - fresh.created_at);
    if (
      catalog.markCheckpointDurable(ckpt.id, {
        checksums: JSON.stringify(checksums),
        sizes: JSON.stringify(sizes),
        timings: JSON.stringify(timings),
        durable_at: now,
      })
    )
      done.push(ckpt.id);
  }
  engine.fault('durable:committed');
  return done;
}

/**
 * Queues the durability step of a just-committed checkpoint behind the
 * sandbox's lock. Call it before queueing anything else for the sandbox.
 */
export function queueDurability(engine: DurabilityDeps, sandboxId: string, checkpointId: string): Promise<void> {
  const m = flights(engine);
  const p = engine
    .withSandboxLock(sandboxId, async () => {
      await makeDurable(engine, engine.catalog.pendingCheckpoints(sandboxId));
    })
    .catch((err: unknown) => {
      // The reaper, or the next restore from it (ensureDurable), tries again.
      engine.log.warn({ err, sandboxId, checkpointId }, 'making a checkpoint durable failed; it stays pending');
    })
    .finally(() => {
      if (m.get(checkpointId) === p) m.delete(checkpointId);
    });
  m.set(checkpointId, p);
  return p;
}

/**
 * Resolves once the checkpoint is durable and checksummed, and returns its
 * row as durable (with the checksums a restore verifies against). A checkpoint
 * still pending in this process is awaited; one left pending by another
 * process is made durable here (its files are still in this kernel's page
 * cache). A checkpoint of an earlier boot that was never made durable is
 * refused: nothing says its files are whole.
 */
export async function ensureDurable(engine: DurabilityDeps, ckpt: CheckpointRow): Promise<CheckpointRow> {
  // A durable row stays durable, with its checksums: no need to read it again.
  if (ckpt.durable_at !== null && ckpt.durable_at !== undefined) return ckpt;
  let fresh = engine.catalog.checkpoint(ckpt.id) ?? ckpt;
  if (fresh.durable_at !== null && fresh.durable_at !== undefined) return fresh;
  const flight = flights(engine).get(ckpt.id);
  if (flight) {
    await flight;
    fresh = engine.catalog.checkpoint(ckpt.id) ?? fresh;
    if (fresh.durable_at !== null) return fresh;
  }
  if (fresh.boot_id && fresh.boot_id !== engine.proc.bootId())
    throw new CheckpointCorruptError(
      ckpt.id,
      'its files',
      'were never made durable before the host restarted, so they may be incomplete',
    );
  // Every pending checkpoint of the sandbox, not just this one: a durable
  // checkpoint must never have a pending ancestor (its image may link to it).
  await makeDurable(engine, engine.catalog.pendingCheckpoints(fresh.sandbox_id));
  return engine.catalog.checkpoint(ckpt.id) ?? fresh;
}

/** Resolves when the checkpoint is durable (for callers that want durability before going on, and the bench). */
export async function waitDurable(engine: DurabilityDeps, checkpointId: string): Promise<void> {
  const row = engine.catalog.checkpoint(checkpointId);
  if (!row) return;
  await ensureDurable(engine, row);
}
