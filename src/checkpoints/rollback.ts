/**
 * Verb: rollback. With a warm standby of the checkpoint, swap it in (see
 * standby.ts). Otherwise kill the sandbox's process tree, replace its
 * writable layer with a writable copy of the checkpoint's layer (btrfs,
 * O(1)), mount the root again and have CRIU restore the processes into
 * fresh pid, mount, uts, ipc and (loopback-only) net namespaces. The sandbox
 * keeps its id and gets a new branch id.
 *
 * Crash safety: the journal's phase says how far it got. Before "killing"
 * nothing has changed (a crash leaves the old state); from "killing" on the
 * old tree is stopped for good, so the reaper rolls forward to the checkpoint.
 */
import fs from 'node:fs';
import { newId, type CheckpointRow, type SandboxRow } from '../catalog/catalog.js';
import { InvalidStateError, NotFoundError } from '../errors.js';
import { hostOf } from '../lifecycle/instance-host.js';
import { restoreInstance } from '../instances/restore.js';
import { limitsOf } from '../lifecycle/create.js';
import { prepareRestoredNetwork, swapLinks } from '../network/sandbox-network.js';
import { outsideConnections, type ConnectionInfo } from '../network/connections.js';
import {
  validateRollbackOptions,
  type AgentRollbackReport,
  type RollbackAgentOptions,
} from '../agent-state/agent-state.js';
import { SandboxFiles } from '../instances/files.js';
import { hasStandbyFor } from './standby.js';
import { verifyCheckpoint } from './integrity.js';
import { ensureDurable } from './durability.js';
import { afterRollback } from './after-commit.js';
import type { AfterCommitDeps } from './after-commit.js';
import type { RollbackWarning } from '../effects/effect-ledger.js';
import type { ProcessImageDeps } from './process-image.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { StandbyDeps } from './standby.js';
import type { IntegrityDeps } from './integrity.js';
import type { DurabilityDeps } from './durability.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { Catalog } from '../catalog/catalog.js';
import type { CriuClient, LayerPort, ProcessTable } from '../ports.js';
import type { FaultHook } from '../faults.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';
import type { StatePaths } from '../paths.js';

/** What rollback.ts uses of the manager's services (api/engine.ts builds them). */
export interface RollbackDeps
  extends ProcessImageDeps, SandboxNetworkDeps, StandbyDeps, IntegrityDeps, DurabilityDeps, AfterCommitDeps {
  agent: AgentState;
  catalog: Catalog;
  criu: CriuClient;
  fault: FaultHook;
  inits: InitWatcher;
  layers: LayerPort;
  log: Logger;
  paths: StatePaths;
  proc: ProcessTable;
  runtime: SandboxRuntime;
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
}

export interface RollbackTimings {
  killMs: number;
  layerMs: number;
  mountMs: number;
  restoreMs: number;
  commitMs: number;
  totalMs: number;
}

export interface RollbackCore {
  sandboxId: string;
  checkpointId: string;
  branchId: string;
  previousBranchId: string;
  pid: number;
  /** "standby": a warm standby of the checkpoint was swapped in; "restore": CRIU restored the tree. */
  path: 'standby' | 'restore';
  /**
   * Egress sandboxes: the TCP connections to the outside the replaced tree
   * held, which the rollback reset (the restored tree's own come back
   * closed). Always [] for a sandbox without a network.
   */
  connectionsReset: ConnectionInfo[];
  timings: RollbackTimings;
}

/** The checkpoint, if it belongs to this sandbox; another sandbox's checkpoint is reported as missing. */
export function ownCheckpoint(engine: RollbackDeps, row: SandboxRow, checkpointId: string): CheckpointRow {
  const ckpt = typeof checkpointId === 'string' ? engine.catalog.checkpoint(checkpointId) : undefined;
  if (!ckpt || ckpt.sandbox_id !== row.id) throw new NotFoundError('checkpoint', String(checkpointId));
  if (!engine.layers.hasLayer(ckpt.layer_id) || !fs.existsSync(engine.paths.processImage(ckpt.id))) {
    throw new InvalidStateError('CHECKPOINT_DAMAGED', `Checkpoint ${ckpt.id} has lost its files on disk`, {
      checkpointId: ckpt.id,
    });
  }
  return ckpt;
}

/** The point of no return: the journal says so first, so a crash from here on rolls forward. */
async function killCurrentTree(
  engine: RollbackDeps,
  row: SandboxRow,
  opId: string,
  t: Partial<RollbackTimings>,
): Promise<void> {
  const m = performance.now();
  engine.catalog.setOperationPhase(opId, 'killing');
  await engine.runtime.killProcesses(row.instance);
  t.killMs = performance.now() - m;
  engine.fault('rollback:killed');
}

/** The destructive part, shared by rollback and the reaper's roll-forward. */
export async function restoreSandboxTo(
  engine: RollbackDeps,
  row: SandboxRow,
  ckpt: CheckpointRow,
  opId: string,
  t: Partial<RollbackTimings>,
): Promise<number> {
  await killCurrentTree(engine, row, opId, t);

  let m = performance.now();
  const pid = await restoreInstance(
    engine,
    {
      host: { ...hostOf(engine, row), runtimeLayer: ckpt.runtime_layer },
      limits: limitsOf(row),
      layerId: ckpt.layer_id,
      processImage: engine.paths.processImage(ckpt.id),
      fromIdBase: null,
    },
    {
      inPlace: true,
      armTracking: true,
      // The old tree's namespace (and with it its eth0) is going away: a fresh pair for the restored one.
      network: () => prepareRestoredNetwork(engine, row.instance, row, { standby: false }),
      at: (point) => {
        const now = performance.now();
        if (point === 'layer') {
          t.layerMs = now - m;
          engine.fault('rollback:layer-reset');
        } else if (point === 'mounted') {
          t.mountMs = now - m;
          engine.fault('rollback:mounted');
        }
        m = performance.now();
      },
    },
  );
  t.restoreMs = performance.now() - m;
  engine.fault('rollback:restored');
  return pid;
}

/**
 * The swap path: the current tree is frozen and the frozen standby of the
 * checkpoint becomes the sandbox's instance in the commit transaction; it
 * is thawed right after. Returns the new init pid and the old instance key,
 * whose processes and resources the caller removes afterwards.
 */
export async function swapInStandby(
  engine: RollbackDeps,
  row: SandboxRow,
  ckpt: CheckpointRow,
  opId: string,
  branchId: string,
  t: Partial<RollbackTimings>,
  ancestry?: (id: string) => boolean,
) {
  const { runtime, cgroups } = engine;
  const standby = engine.catalog.standby(row.id)!;
  const key = standby.instance;
  // Freezing is enough here: the old tree can do nothing more, and killing a
  // big tree (waiting for its memory to be freed) happens after the answer,
  // with the rest of the old instance.
  let m = performance.now();
  // Not fsynced: a swap changes no file, and a host crash ends every tree
  // anyway, so a lost "killing" leaves a consistent sandbox; the commit
  // below is fsynced and makes this step durable with it.
  engine.catalog.unsynced(() => engine.catalog.setOperationPhase(opId, 'killing'));
  let parts: ReturnType<typeof commitRollback>;
  try {
    await cgroups.freeze(runtime.cgroupName(row.instance));
    // Egress: the standby's eth0 takes the sandbox's address over (two ioctls).
    swapLinks(engine, row, row.instance, key);
    t.killMs = performance.now() - m;
    engine.fault('rollback:killed');
    m = performance.now();
    parts = commitRollback(engine, row, ckpt, opId, standby.pid!, branchId, { instance: key }, ancestry);
  } catch (e) {
    try {
      swapLinks(engine, row, key, row.instance);
    } catch (err) {
      engine.log.error({ err, sandboxId: row.id }, 'cannot give the address back to the old instance');
    }
    await abandonSwap(engine, row, opId);
    throw e;
  }
  try {
    cgroups.thaw(runtime.cgroupName(key));
  } catch (e) {
    // Committed, but the swapped-in tree cannot run: the sandbox is at the
    // checkpoint's files with no processes, and its row says so.
    await runtime.killProcesses(key).catch(() => undefined);
    engine.catalog.updateSandbox(row.id, { state: 'stopped', init_pid: null, init_start: null });
    throw e;
  }
  t.layerMs = 0;
  t.mountMs = 0;
  t.restoreMs = performance.now() - m;
  return { parts, pid: standby.pid!, oldInstance: row.instance };
}

/**
 * The swap did not commit: the old tree is still the sandbox. Thaw it and
 * close the journal entry, so that the row ("running", the old instance)
 * is true again at once, not after the next exclusive open; the standby
 * stays for another try. If the old tree cannot be thawed, it is killed and
 * the row says "stopped". A crash in here leaves the journal at "killing",
 * and the reaper swaps the standby in: the checkpoint, also consistent.
 */
async function abandonSwap(engine: RollbackDeps, row: SandboxRow, opId: string): Promise<void> {
  const { runtime, cgroups, catalog } = engine;
  try {
    cgroups.thaw(runtime.cgroupName(row.instance));
  } catch (err) {
    engine.log.error({ err, sandboxId: row.id }, 'cannot thaw the tree a failed rollback froze; stopping it');
    await runtime.killProcesses(row.instance).catch(() => undefined);
    catalog.updateSandbox(row.id, { state: 'stopped', init_pid: null, init_start: null });
  }
  catalog.endOperation(opId);
}

/** The rollback's commit: the sandbox row and the agent's timeline, in one transaction. */
export function commitRollback(
  engine: RollbackDeps,
  row: SandboxRow,
  ckpt: CheckpointRow,
  opId: string,
  pid: number,
  branchId: string,
  extra: Partial<SandboxRow> = {},
  ancestry?: (id: string) => boolean,
) {
  const { catalog } = engine;
  const parts = catalog.tx(() => {
    // A standby swapped in is the live instance from now on: no longer the standby.
    if (extra.instance !== undefined) catalog.clearStandby(row.id);
    catalog.updateSandbox(row.id, {
      state: 'running',
      init_pid: pid,
      init_start: engine.proc.startTime(pid) ?? null,
      head_checkpoint_id: ckpt.id,
      branch_id: branchId,
      runtime_layer: ckpt.runtime_layer,
      ...extra,
    });
    const parts = engine.agent.onRollback(row, ckpt, opId, ancestry);
    engine.fault('rollback:commit');
    catalog.endOperation(opId);
    return parts;
  });
  // The new init is watched once the caller has its answer (a pidfd and a
  // read of its start time: a tenth of a standby rollback). An exit before
  // that is not missed: track() finds the process gone and marks the row
  // stopped, and the old init's exit finds the row naming this one and
  // changes nothing.
  engine.inits.trackSoon(row.id);
  return parts;
}

/** What rollback returns: the restored process and timings, plus the agent's report. */
export type RollbackReport = RollbackCore & AgentRollbackReport;

export async function rollbackSandbox(
  engine: RollbackDeps,
  row: SandboxRow,
  checkpointId: string,
  options: RollbackAgentOptions = {},
): Promise<RollbackReport> {
  const opts = validateRollbackOptions(options);
  const ckpt = ownCheckpoint(engine, row, checkpointId);
  // Policy first: a refused rollback changes nothing.
  const { warnings, ancestry } = engine.agent.checkRollback(row, ckpt, opts.policy ?? 'warn');
  const { catalog } = engine;
  await engine.criu.ensureRunning();
  opts.signal?.throwIfAborted();
  const opId = newId('op');
  const branchId = newId('br');
  const t: Partial<RollbackTimings> = {};
  const t0 = performance.now();
  const standby = hasStandbyFor(engine, row, ckpt.id) ? catalog.standby(row.id)!.instance : null;
  // Read before the tree is replaced (a bounded file read on libuv's pool; egress sandboxes only).
  const table = row.network ? await outsideConnections(row.init_pid) : { connections: [], truncated: false };
  const connectionsReset = table.connections;
  if (table.truncated)
    engine.log.warn(
      { sandboxId: row.id, listed: connectionsReset.length },
      'the sandbox holds more TCP sockets than a rollback lists: the connections reset are listed in part',
    );
  // The restore path reads the checkpoint's files: verify them while the
  // sandbox is untouched. A standby was restored from verified files when it
  // was made, and a swap reads none.
  // A checkpoint still pending durability is made durable first, so that
  // there are checksums to verify against (durability.ts).
  if (!standby) await verifyCheckpoint(engine, await ensureDurable(engine, ckpt));
  opts.signal?.throwIfAborted();
  // Not fsynced: until "killing" nothing has changed, and the fsynced commit
  // of "killing" (restore path) or of the swap (standby path) carries it.
  catalog.unsynced(() =>
    catalog.beginOperation({
      id: opId,
      kind: 'rollback',
      sandbox_id: row.id,
      phase: 'prepared',
      payload: JSON.stringify({ checkpointId: ckpt.id, branchId, standby }),
    }),
  );
  engine.fault('rollback:begin');
  const log = engine.log.child({ sandboxId: row.id, checkpointId: ckpt.id });
  if (standby) {
    const { parts, pid, oldInstance } = await swapInStandby(engine, row, ckpt, opId, branchId, t, ancestry);
    t.commitMs = 0;
    t.totalMs = performance.now() - t0;
    engine.fault('rollback:committed');
    log.info({ timings: t }, 'rollback committed (warm standby)');
    const report = await agentReport(engine, row, standby, ckpt, parts, warnings, opts);
    // The old instance goes after the caller has its answer (queued behind this call's lock).
    removeAfterAnswer(engine, row.id, oldInstance, 'removing the replaced instance');
    void afterRollback(engine, row.id, ckpt.id);
    return {
      sandboxId: row.id,
      checkpointId: ckpt.id,
      branchId,
      previousBranchId: row.branch_id,
      pid,
      path: 'standby',
      connectionsReset,
      timings: t as RollbackTimings,
      ...report,
    };
  }
  // A standby of another checkpoint is stale once the tree is replaced: forget
  // it now (the reaper removes it after a crash) and remove it after answering.
  const staleStandby = catalog.standby(row.id)?.instance;
  if (staleStandby) catalog.clearStandby(row.id);
  let parts: ReturnType<typeof commitRollback>;
  let pid: number | undefined;
  try {
    pid = await restoreSandboxTo(engine, row, ckpt, opId, t);
    const tc = performance.now();
    parts = commitRollback(engine, row, ckpt, opId, pid, branchId, {}, ancestry);
    t.commitMs = performance.now() - tc;
  } catch (e) {
    // The old processes are gone; what is left is the checkpoint's files with
    // no processes (a restored tree that could not be recorded is stopped
    // too). Record that honestly rather than pretend to be running.
    log.error({ err: e }, 'rollback failed after the old tree was killed');
    // Also when CRIU itself died half-way (no pid came back): tasks it had
    // already restored into the cgroup must not outlive a "stopped" row.
    await stopAtCheckpoint(engine, row, ckpt, opId, branchId, ancestry);
    throw e;
  }
  t.totalMs = performance.now() - t0;
  engine.fault('rollback:committed');
  log.info({ timings: t }, 'rollback committed');

  const report = await agentReport(engine, row, row.instance, ckpt, parts, warnings, opts);
  if (staleStandby) removeAfterAnswer(engine, row.id, staleStandby, 'removing a stale standby');
  void afterRollback(engine, row.id, ckpt.id);
  return {
    sandboxId: row.id,
    checkpointId: ckpt.id,
    branchId,
    previousBranchId: row.branch_id,
    pid,
    path: 'restore',
    connectionsReset,
    timings: t as RollbackTimings,
    ...report,
  };
}

/** Verdicts are bound to file content: hash the files they were about, as restored in `instance`, then build the agent's report. */
async function agentReport(
  engine: RollbackDeps,
  row: SandboxRow,
  instance: string,
  ckpt: CheckpointRow,
  parts: ReturnType<typeof commitRollback>,
  warnings: RollbackWarning[],
  opts: RollbackAgentOptions,
): Promise<AgentRollbackReport> {
  const files = new SandboxFiles(engine.native, () => engine.paths.sandboxRoot(instance));
  const hashes = new Map<string, string | null>();
  for (const p of engine.agent.verdictPaths(row.id)) hashes.set(p, await files.verdictHash(p).catch(() => null));
  return engine.agent.report(row, ckpt, { ...parts, warnings }, hashes, opts);
}

/** Removes an instance once the caller has its answer: queued behind this call's lock on the sandbox. */
function removeAfterAnswer(engine: RollbackDeps, sandboxId: string, instance: string, what: string): void {
  void engine
    .withSandboxLock(sandboxId, () => engine.runtime.destroy(instance))
    .catch((err) => engine.log.warn({ err, sandboxId, instance }, what));
}

/**
 * A rollback that failed past its point of no return (here, or found by the
 * reaper): the sandbox is stopped at the checkpoint's files, with nothing of
 * the tree left running; a new rollback starts it.
 */
export async function stopAtCheckpoint(
  engine: RollbackDeps,
  row: SandboxRow,
  ckpt: CheckpointRow,
  opId: string,
  branchId: string,
  ancestry?: (id: string) => boolean,
): Promise<void> {
  await engine.runtime.killProcesses(row.instance).catch(() => undefined);
  engine.catalog.tx(() => {
    engine.catalog.updateSandbox(row.id, {
      state: 'stopped',
      init_pid: null,
      init_start: null,
      head_checkpoint_id: ckpt.id,
      branch_id: branchId,
    });
    engine.agent.onRollback(row, ckpt, opId, ancestry);
    engine.catalog.endOperation(opId);
  });
}
