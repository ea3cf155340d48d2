/**
 * What a checkpoint or a rollback queues behind the sandbox's lock once it
 * has committed: first the checkpoint's durability step (durability.ts),
 * then a warm standby of the checkpoint the sandbox is now at, when the
 * standby policy wants one (standby-policy.ts). The verbs call these while
 * they still hold the lock, so the work runs right after them and every
 * caller (the SDK, each front end, the reaper's roll-forward) gets the same.
 */
import type { CheckpointRow } from '../catalog/catalog.js';
import { queueDurability } from './durability.js';
import { prepareStandby } from './standby.js';
import { recordStandbyChance, standbyWanted } from './standby-policy.js';
import type { DurabilityDeps } from './durability.js';
import type { StandbyDeps } from './standby.js';

/** What after-commit.ts uses of the manager's services (api/engine.ts builds them). */
export interface AfterCommitDeps extends DurabilityDeps, StandbyDeps {}

/** After a checkpoint commits: durability if it is pending, then a standby of it if the policy wants one. */
export function afterCheckpoint(engine: AfterCommitDeps, ckpt: CheckpointRow): void {
  if (ckpt.durable_at === null || ckpt.durable_at === undefined) void queueDurability(engine, ckpt.sandbox_id, ckpt.id);
  // A later rollback to this checkpoint becomes a swap (unless the policy keeps standbys for rollbacks).
  const history = recordStandbyChance(engine, ckpt.sandbox_id, 'checkpoint', ckpt.id);
  if (standbyWanted(engine.config.standbyAfterCheckpoint, 'checkpoint', history))
    void queueStandby(engine, ckpt.sandbox_id, ckpt.id);
}

/**
 * After a rollback commits: a standby of its checkpoint if the policy wants
 * one. Resolves when that work is done (it never rejects): a verb, holding
 * the lock, must not wait for it; the reaper, holding none, does.
 */
export function afterRollback(engine: AfterCommitDeps, sandboxId: string, checkpointId: string): Promise<void> {
  const history = recordStandbyChance(engine, sandboxId, 'rollback', checkpointId);
  // Agents often fail the same step again (the 'auto' policy asks this sandbox's recent history).
  if (standbyWanted(engine.config.standbyAfterCheckpoint, 'rollback', history))
    return queueStandby(engine, sandboxId, checkpointId);
  return Promise.resolve();
}

/** Prepares a warm standby of a checkpoint in the background, behind the sandbox's lock. */
function queueStandby(engine: AfterCommitDeps, sandboxId: string, checkpointId: string): Promise<void> {
  // LOCKSTEP_STANDBY=off (memory-tight hosts): rollback always restores with CRIU.
  if (!engine.config.standby) return Promise.resolve();
  const ckpt = engine.catalog.checkpoint(checkpointId);
  if (!ckpt) return Promise.resolve();
  return engine.withSandboxLock(sandboxId, () => prepareStandby(engine, sandboxId, ckpt)).catch(() => undefined);
}
