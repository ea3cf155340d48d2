/**
 * Which sandboxes get a warm standby. A standby is a frozen second copy of
 * a sandbox's processes, so each one costs about the sandbox's memory again.
 * All standbys of a state directory share one budget
 * (LockstepConfig.standbyBudgetBytes): before a standby is made, the least
 * recently made standbys of other sandboxes (LRU: the sandbox whose last
 * checkpoint or rollback is the oldest) are evicted until the new one fits;
 * one that cannot fit even then is not made. Memory is what each standby's
 * cgroup is charged (anonymous + shared, memory.stat), read at decision
 * time, so the bound holds for what the standbys hold now, not a forecast.
 * A sandbox without a standby still rolls back, through a CRIU restore.
 * (Decision and measurements: docs/decisions/standby-policy.md, "Standby policy".)
 */
import type { SandboxRow, Catalog } from '../catalog/catalog.js';
import type { CgroupDriver } from '../host/cgroups.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';

/** What standby-policy.ts uses of the manager's services (api/engine.ts builds them). */
export interface StandbyPolicyDeps {
  catalog: Catalog;
  cgroups: CgroupDriver;
  config: LockstepConfig;
  log: Logger;
  runtime: SandboxRuntime;
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
}

/** One live standby and what it holds. */
export interface StandbyUse {
  sandboxId: string;
  instance: string;
  bytes: number;
  madeAt: number;
}

/** Every standby of the state directory with its memory, least recently made first. */
export function standbysInUse(engine: StandbyPolicyDeps): StandbyUse[] {
  return engine.catalog.standbys().map((s) => ({
    sandboxId: s.sandboxId,
    instance: s.instance,
    bytes: engine.cgroups.memoryBytes(engine.runtime.cgroupName(s.instance)),
    madeAt: s.at,
  }));
}

/**
 * Makes room for `bytes` more of standby memory for this sandbox by evicting
 * other sandboxes' standbys, oldest first; false (nothing evicted) when even
 * evicting all of them would not be enough. Runs in one tick with the
 * catalog update that follows it, so two sandboxes cannot both take the last
 * room. Eviction clears the victim's standby from its row at once (a
 * rollback of it from now on restores with CRIU) and removes the instance
 * later, behind the victim's own lock (never waiting for it here: two
 * sandboxes evicting each other would deadlock).
 */
export function makeRoomForStandby(engine: StandbyPolicyDeps, row: SandboxRow, bytes: number): boolean {
  const budget = engine.config.standbyBudgetBytes;
  if (bytes > budget) return false;
  const others = standbysInUse(engine).filter((s) => s.sandboxId !== row.id);
  let used = others.reduce((n, s) => n + s.bytes, 0);
  const victims: StandbyUse[] = [];
  for (const s of others) {
    if (used + bytes <= budget) break;
    victims.push(s);
    used -= s.bytes;
  }
  if (used + bytes > budget) return false;
  for (const v of victims) evictStandby(engine, v, `to make room for the standby of ${row.id}`);
  return true;
}

/** Takes a standby out of use now; its processes are removed behind its sandbox's lock. */
export function evictStandby(engine: StandbyPolicyDeps, victim: StandbyUse, why: string): void {
  engine.catalog.clearStandby(victim.sandboxId);
  engine.log.info({ sandboxId: victim.sandboxId, bytes: victim.bytes }, `warm standby evicted ${why}`);
  void engine
    .withSandboxLock(victim.sandboxId, async () => {
      // A rollback that had already chosen this standby may have swapped it in meanwhile.
      const fresh = engine.catalog.sandbox(victim.sandboxId);
      if (
        fresh &&
        (fresh.instance === victim.instance || engine.catalog.standby(victim.sandboxId)?.instance === victim.instance)
      )
        return;
      await engine.runtime.destroy(victim.instance);
    })
    .catch((err: unknown) =>
      engine.log.warn({ err, sandboxId: victim.sandboxId }, 'removing an evicted standby failed'),
    );
}

/** How many of a sandbox's recent chances for a standby the 'auto' policy looks back on. */
export const STANDBY_HISTORY = 8;

/**
 * Whether to prepare a standby of the checkpoint a sandbox is now at, just
 * after a checkpoint or a rollback. A standby is used only by the next
 * rollback, and only if it goes to that same checkpoint; it costs a CRIU
 * restore of CPU in the background either way. `history` says, for each of
 * the sandbox's recent checkpoints and rollbacks (oldest first), whether
 * the operation that followed was a rollback to where it had left the
 * sandbox (a standby then would have been used).
 * - true: after every checkpoint and every rollback;
 * - false: after rollbacks only (agents often fail the same step again);
 * - 'auto': when at least half of the recent chances would have been used;
 *   with none recorded yet, after a rollback and not after a checkpoint.
 */
export function standbyWanted(
  mode: boolean | 'auto',
  after: 'checkpoint' | 'rollback',
  history: readonly boolean[],
): boolean {
  if (mode !== 'auto') return after === 'rollback' || mode;
  const recent = history.slice(-STANDBY_HISTORY);
  if (!recent.length) return after === 'rollback';
  return recent.filter(Boolean).length * 2 >= recent.length;
}

interface Chances {
  /** Where the last checkpoint or rollback left the sandbox (the checkpoint a standby would be of). */
  at: string | null;
  history: boolean[];
}

/** Per manager (this process): what each sandbox's recent operations were. A policy input only, so not persisted. */
const chancesByEngine = new WeakMap<StandbyPolicyDeps, Map<string, Chances>>();

/**
 * Records a checkpoint (at = the new checkpoint) or a rollback (at = its
 * target) of a sandbox, scoring the previous chance, and returns the
 * history standbyWanted reads.
 */
export function recordStandbyChance(
  engine: StandbyPolicyDeps,
  sandboxId: string,
  op: 'checkpoint' | 'rollback',
  at: string,
): readonly boolean[] {
  let bySandbox = chancesByEngine.get(engine);
  if (!bySandbox) chancesByEngine.set(engine, (bySandbox = new Map()));
  const c = bySandbox.get(sandboxId) ?? { at: null, history: [] };
  if (c.at !== null) c.history.push(op === 'rollback' && at === c.at);
  if (c.history.length > STANDBY_HISTORY) c.history.splice(0, c.history.length - STANDBY_HISTORY);
  c.at = at;
  bySandbox.set(sandboxId, c);
  return c.history;
}

/** Forgets a removed sandbox. */
export function forgetStandbyChances(engine: StandbyPolicyDeps, sandboxId: string): void {
  chancesByEngine.get(engine)?.delete(sandboxId);
}
