/**
 * Warm standby: after a checkpoint, a second instance of the sandbox is
 * restored from it in the background and frozen at once. A later rollback to
 * that checkpoint then needs no CRIU restore at all: it freezes the current
 * tree, swaps the standby in (one catalog transaction), thaws it, and kills
 * the old tree after answering. This is
 * what makes "undo the last step" take a few milliseconds on a stock kernel.
 *
 * The standby runs for the moment between CRIU resuming it and the freeze
 * (well under a millisecond of work for a sleeping tree); whatever it does
 * then lands in its own writable layer, which becomes the sandbox's layer
 * on swap, so files and processes stay consistent with each other.
 */
import { randomBytes } from 'node:crypto';
import type { CheckpointRow, SandboxRow, Catalog } from '../catalog/catalog.js';
import { isInitOf } from '../instances/identity.js';
import { restoreNewInstance } from './process-image.js';
import { verifyCheckpoint } from './integrity.js';
import { ensureDurable } from './durability.js';
import { checkStandbyQuota, tenantOf } from '../tenants/quotas.js';
import { makeRoomForStandby } from './standby-policy.js';
import type { ProcessImageDeps } from './process-image.js';
import type { IntegrityDeps } from './integrity.js';
import type { DurabilityDeps } from './durability.js';
import type { StandbyPolicyDeps } from './standby-policy.js';
import type { CgroupDriver } from '../host/cgroups.js';
import type { Clock, ProcessTable } from '../ports.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';

/** What standby.ts uses of the manager's services (api/engine.ts builds them). */
export interface StandbyDeps extends ProcessImageDeps, IntegrityDeps, DurabilityDeps, StandbyPolicyDeps {
  catalog: Catalog;
  cgroups: CgroupDriver;
  clock: Clock;
  log: Logger;
  proc: ProcessTable;
  runtime: SandboxRuntime;
}

/**
 * True when the sandbox has a live standby for this checkpoint: its pid is
 * still the process restored then (start time) and a member of the standby's
 * cgroup, which stays frozen until the swap, so the answer holds until then.
 */
export function hasStandbyFor(
  engine: Pick<StandbyDeps, 'catalog' | 'cgroups' | 'runtime' | 'proc'>,
  row: SandboxRow,
  checkpointId: string,
): boolean {
  const standby = engine.catalog.standby(row.id);
  return standby?.checkpoint === checkpointId && isInitOf(engine, standby.instance, standby.pid, standby.start);
}

/** Removes the sandbox's standby, if any (idempotent). */
export async function dropStandby(engine: StandbyDeps, sandboxId: string): Promise<void> {
  const standby = engine.catalog.standby(sandboxId);
  if (!standby) return;
  engine.catalog.clearStandby(sandboxId);
  await engine.runtime.destroy(standby.instance);
}

/**
 * A standby is a whole second copy of the sandbox's memory: it counts against
 * the tenant's maxMemoryMb, and is not made when it would not fit (the
 * rollback then restores with CRIU).
 */
function standbyFits(engine: StandbyDeps, row: SandboxRow): boolean {
  const tenant = tenantOf(engine.catalog.db, row.tenant);
  if (!tenant || row.memory_bytes === null) return true;
  try {
    checkStandbyQuota(engine.catalog.db, tenant, row.memory_bytes);
    return true;
  } catch (e) {
    engine.log.info({ err: e, sandboxId: row.id }, 'no warm standby: tenant memory quota');
    return false;
  }
}

/**
 * Restores a frozen standby of `ckpt` for the sandbox. Call it under the
 * sandbox's lock. A failure only costs the fast path: rollback falls back to
 * a CRIU restore.
 */
export async function prepareStandby(engine: StandbyDeps, sandboxId: string, ckpt: CheckpointRow): Promise<void> {
  const row = engine.catalog.sandbox(sandboxId);
  if (!row || row.state !== 'running' || hasStandbyFor(engine, row, ckpt.id)) return;
  await dropStandby(engine, sandboxId);
  if (!standbyFits(engine, row)) return;
  // The host-wide budget: a standby will hold about what the sandbox holds now.
  const estimate = engine.cgroups.memoryBytes(engine.runtime.cgroupName(row.instance));
  if (!makeRoomForStandby(engine, row, estimate)) {
    engine.log.info({ sandboxId, bytes: estimate }, 'no warm standby: it would not fit the standby memory budget');
    return;
  }
  const key = `${sandboxId}.${randomBytes(3).toString('hex')}`;
  const { runtime, cgroups } = engine;
  try {
    // A standby is restored from the checkpoint's files: they are verified
    // here, once, so that the swap later need not read them.
    await verifyCheckpoint(engine, await ensureDurable(engine, ckpt));
    const pid = await restoreNewInstance(engine, key, row, ckpt, undefined, undefined, { standby: true });
    await cgroups.freeze(runtime.cgroupName(key));
    // The sandbox may have been rolled back or removed meanwhile; only then is the standby useless.
    const fresh = engine.catalog.sandbox(sandboxId);
    if (!fresh || fresh.state !== 'running') throw new Error('sandbox changed while its standby was prepared');
    const start = engine.proc.startTime(pid) ?? null;
    if (!isInitOf(engine, key, pid, start)) throw new Error('the restored standby exited before it was frozen');
    // Checked again in the transaction that records it: another sandbox of
    // the tenant (in this process or another) may have taken the room while
    // this one was restoring.
    engine.catalog.tx(() => {
      if (!standbyFits(engine, fresh)) throw new Error('the tenant has no memory left for a standby');
      // And the budget again, with what the standby really holds.
      if (!makeRoomForStandby(engine, fresh, engine.cgroups.memoryBytes(runtime.cgroupName(key))))
        throw new Error('the standby does not fit the standby memory budget');
      engine.catalog.setStandby(sandboxId, {
        instance: key,
        checkpoint: ckpt.id,
        pid,
        start,
        at: engine.clock.now(),
      });
    });
    engine.log.debug({ sandboxId, checkpointId: ckpt.id, instance: key }, 'warm standby ready');
  } catch (e) {
    engine.log.info({ err: e, sandboxId }, 'warm standby not prepared; rollback will restore with CRIU');
    await runtime.destroy(key).catch(() => undefined);
  }
}
