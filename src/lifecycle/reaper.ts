/**
 * The reaper: on open, it finds what a crashed manager left behind and puts
 * the state directory back into a consistent state.
 * - Journalled operations are finished or undone: an unfinished checkpoint
 *   is discarded (and its sandbox thawed); a rollback that had killed the old
 *   tree is rolled forward to its checkpoint; an unfinished fork is removed.
 * - Sandboxes still "creating" or "removing" are removed.
 * - Anything labelled with a sandbox, layer or checkpoint id that the catalog
 *   does not know (mounts, cgroups, subvolumes, process images, half-built
 *   images) is removed.
 * It runs only when no other manager has the state directory open.
 */
import fs from 'node:fs';
import path from 'node:path';
import { discardCheckpointFiles } from '../checkpoints/checkpoint.js';
import { commitRollback, restoreSandboxTo, stopAtCheckpoint, swapInStandby } from '../checkpoints/rollback.js';
import { hasStandbyFor } from '../checkpoints/standby.js';
import { afterRollback } from '../checkpoints/after-commit.js';
import { verifyCheckpoint } from '../checkpoints/integrity.js';
import { removeSandbox } from './remove.js';
import { ensureDurable, makeDurable } from '../checkpoints/durability.js';
import type { CheckpointRow } from '../catalog/catalog.js';
import { processImagesHeld } from '../snapshots/holders.js';
import type { CheckpointDeps } from '../checkpoints/checkpoint.js';
import type { RollbackDeps } from '../checkpoints/rollback.js';
import type { StandbyDeps } from '../checkpoints/standby.js';
import type { IntegrityDeps } from '../checkpoints/integrity.js';
import type { RemoveDeps } from './remove.js';
import type { DurabilityDeps } from '../checkpoints/durability.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { CriuClient, NativeBinding, ProcessTable } from '../ports.js';
import type { HostNetwork } from '../host/network/host-network.js';
import type { ImageStore } from '../images/image-store.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';
import type { StatePaths } from '../paths.js';

/** What reaper.ts uses of the manager's services (api/engine.ts builds them). */
export interface ReaperDeps
  extends CheckpointDeps, RollbackDeps, StandbyDeps, IntegrityDeps, RemoveDeps, DurabilityDeps {
  agent: AgentState;
  criu: CriuClient;
  images: ImageStore;
  log: Logger;
  native: NativeBinding;
  network: HostNetwork;
  paths: StatePaths;
  proc: ProcessTable;
  runtime: SandboxRuntime;
}

export interface ReapReport {
  operations: string[];
  /** Checkpoints left pending durability: `durable:<id>` (made durable now) or `dropped:<id>` (taken before a host restart). */
  checkpoints: string[];
  sandboxes: string[];
  orphans: string[];
}

export async function reap(engine: ReaperDeps): Promise<ReapReport> {
  const report: ReapReport = { operations: [], checkpoints: [], sandboxes: [], orphans: [] };
  const { catalog, runtime, layers, paths, cgroups, proc } = engine;

  // A dead manager's CRIU call may still be running in the service: stop it
  // before its checkpoint is discarded or its sandbox thawed.
  const workers = await engine.criu.stopOrphanedWorkers();
  if (workers > 0) engine.log.warn({ workers }, 'killed CRIU workers left by a manager that died');

  // Checkpoints whose background durability step never finished: verified
  // (synced and checksummed) or dropped, never left half-present.
  await settlePendingCheckpoints(engine, report);

  for (const op of catalog.operations()) {
    const payload = JSON.parse(op.payload) as { checkpointId?: string; layerId?: string; branchId?: string };
    report.operations.push(`${op.kind}:${op.phase}:${op.sandbox_id}`);
    if (op.kind === 'checkpoint') {
      if (!catalog.checkpoint(payload.checkpointId!))
        await discardCheckpointFiles(engine, payload.checkpointId!, payload.layerId!);
      try {
        cgroups.thaw(runtime.cgroupName(catalog.sandbox(op.sandbox_id)?.instance ?? op.sandbox_id));
      } catch {
        /* sandbox gone */
      }
      catalog.endOperation(op.id);
    } else if (op.kind === 'snapshot-import') {
      // An import that did not commit: its layer and image are orphans (removed below), its scratch too.
      catalog.endOperation(op.id);
    } else if (op.kind === 'rollback') {
      const row = catalog.sandbox(op.sandbox_id);
      const ckpt = payload.checkpointId ? catalog.checkpoint(payload.checkpointId) : undefined;
      if (op.phase === 'prepared' || !row || !ckpt) {
        catalog.endOperation(op.id);
        continue;
      }
      // The old tree was being killed: the only consistent state left is the checkpoint.
      try {
        const standby = (payload as { standby?: string | null }).standby;
        if (
          standby &&
          row.instance !== standby &&
          catalog.standby(row.id)?.instance === standby &&
          hasStandbyFor(engine, row, ckpt.id)
        ) {
          const { oldInstance } = await swapInStandby(engine, row, ckpt, op.id, payload.branchId ?? row.branch_id, {});
          await runtime.destroy(oldInstance).catch(() => undefined);
          await afterRollback(engine, row.id, ckpt.id);
          continue;
        }
        if (standby && row.instance === standby) {
          // The swap had committed; only the journal entry was left.
          catalog.endOperation(op.id);
          continue;
        }
        // Past the point of no return: a corrupt checkpoint leaves the sandbox stopped at it.
        await verifyCheckpoint(engine, await ensureDurable(engine, ckpt));
        const pid = await restoreSandboxTo(engine, row, ckpt, op.id, {});
        commitRollback(engine, row, ckpt, op.id, pid, payload.branchId ?? row.branch_id);
        // What a rollback queues after its commit (a warm standby), as the verb
        // does; waited for, so that the host and the catalog agree once open returns.
        await afterRollback(engine, row.id, ckpt.id);
      } catch (e) {
        engine.log.error({ err: e, sandboxId: row.id }, 'roll-forward of an interrupted rollback failed');
        await stopAtCheckpoint(engine, row, ckpt, op.id, payload.branchId ?? row.branch_id);
      }
    } else {
      // fork (and anything else): the new sandbox never became visible; remove it.
      await runtime.destroy(op.sandbox_id).catch(() => undefined);
      catalog.tx(() => {
        const row = catalog.sandbox(op.sandbox_id);
        if (row && row.state === 'creating') catalog.deleteSandboxRow(op.sandbox_id);
        catalog.endOperation(op.id);
      });
    }
  }

  for (const row of catalog.allSandboxes()) {
    if (row.state === 'creating' || row.state === 'removing') {
      // The same teardown as `rm`, so context snapshots are released too. If
      // it fails, the row stays "removing" and the next reaper tries again.
      try {
        await removeSandbox(engine, row.id);
        report.sandboxes.push(row.id);
      } catch (err) {
        engine.log.warn({ err, sandboxId: row.id }, 'could not finish removing a sandbox');
      }
    } else if (row.state === 'running') {
      try {
        cgroups.thaw(runtime.cgroupName(row.instance));
      } catch {
        /* no cgroup */
      }
      const alive =
        row.init_pid !== null && proc.isAlive(row.init_pid) && proc.startTime(row.init_pid) === row.init_start;
      // A warm standby whose processes are gone is of no use: drop it.
      const standby = catalog.standby(row.id);
      if (
        standby &&
        !(standby.pid !== null && proc.isAlive(standby.pid) && proc.startTime(standby.pid) === standby.start)
      ) {
        await runtime.destroy(standby.instance).catch(() => undefined);
        catalog.clearStandby(row.id);
      }
      if (!alive) {
        await runtime.killProcesses(row.instance).catch(() => undefined);
        catalog.updateSandbox(row.id, { state: 'stopped', init_pid: null, init_start: null });
      }
    }
  }

  const known = catalog.instanceKeys();
  // Run folders and their mounts.
  for (const id of safeReaddir(paths.sandboxesRun)) {
    if (!known.has(id)) {
      await runtime.destroy(id).catch(() => undefined);
      report.orphans.push(`run:${id}`);
    }
  }
  // Veth pairs and allow-set elements a dead manager left (only where egress was ever used).
  if (fs.existsSync(engine.network.markerFile)) {
    const addresses = new Set(
      catalog
        .allSandboxes()
        .filter((r) => r.net_slot != null)
        .map((r) => engine.network.addresses(r.net_slot!).address),
    );
    try {
      for (const o of await engine.network.reap(known, addresses)) report.orphans.push(o);
    } catch (err) {
      engine.log.warn({ err }, 'could not clean up network leftovers');
    }
  }
  // Cgroups of this state directory.
  for (const id of cgroups.children(runtime.cgroupGroup)) {
    if (!known.has(id)) {
      await cgroups.kill(runtime.cgroupName(id)).catch(() => undefined);
      cgroups.remove(runtime.cgroupName(id));
      report.orphans.push(`cgroup:${id}`);
    }
  }
  // Writable layers.
  for (const id of layers.listUppers()) {
    if (!known.has(id)) {
      for (const m of proc.mountsUnder(paths.sandboxRoot(id))) engine.native.unmount(m, true);
      await layers.deleteUpper(id);
      report.orphans.push(`upper:${id}`);
    }
  }
  // Checkpoint layers and process images without a committed checkpoint.
  // Snapshots hold layers and images beyond their checkpoints' lives (snapshots/snapshot-rows.ts).
  const liveLayers = catalog.heldIds('layer');
  const liveCkpts = processImagesHeld(engine);
  for (const id of layers.listLayers()) {
    if (!liveLayers.has(id)) {
      await layers.deleteLayer(id);
      report.orphans.push(`layer:${id}`);
    }
  }
  for (const id of safeReaddir(paths.processImages)) {
    if (!liveCkpts.has(id)) {
      fs.rmSync(paths.processImage(id), { recursive: true, force: true });
      report.orphans.push(`process-image:${id}`);
    }
  }
  for (const name of safeReaddir(paths.scratch)) {
    // An import's scratch may hold a received (read-only) subvolume: delete it as one first.
    if (name.startsWith('import-'))
      for (const sub of safeReaddir(path.join(paths.scratch, name)))
        await engine.native.subvolumeDelete(path.join(paths.scratch, name, sub)).catch(() => false);
    fs.rmSync(path.join(paths.scratch, name), { recursive: true, force: true });
  }
  const sandboxIds = new Set(catalog.allSandboxes().map((r) => r.id));
  for (const name of safeReaddir(paths.locks))
    if (!sandboxIds.has(name)) fs.rmSync(path.join(paths.locks, name), { force: true });
  for (const name of engine.images.onDisk()) {
    if (name.startsWith('.tmp-')) {
      fs.rmSync(path.join(paths.images, name), { recursive: true, force: true });
      report.orphans.push(`image-tmp:${name}`);
    }
  }
  engine.images.collectGarbage();
  return report;
}

/**
 * A pending checkpoint of this boot has whole files in the page cache: sync
 * and checksum them now. One of an earlier boot may have lost any part of
 * its files, with nothing recorded to check them against: drop it, and its
 * descendants with it (they are pending too: making a checkpoint durable
 * makes every pending one of its sandbox durable, so a durable checkpoint
 * never has a pending ancestor, in the tree or in its image's parent links).
 */
async function settlePendingCheckpoints(engine: ReaperDeps, report: ReapReport): Promise<void> {
  const { catalog } = engine;
  const pending = catalog.pendingCheckpoints();
  if (!pending.length) return;
  const boot = engine.proc.bootId();
  const bySandbox = new Map<string, CheckpointRow[]>();
  for (const c of pending) bySandbox.set(c.sandbox_id, [...(bySandbox.get(c.sandbox_id) ?? []), c]);
  for (const rows of bySandbox.values()) {
    const thisBoot = rows.filter((c) => c.boot_id === boot);
    const lost = rows.filter((c) => c.boot_id !== boot);
    try {
      for (const id of await makeDurable(engine, thisBoot)) report.checkpoints.push(`durable:${id}`);
    } catch (err) {
      // A checkpoint whose process image is gone is as good as lost; one whose
      // files are there stays pending (a restore from it, or the next reaper,
      // tries again): a failed syncfs is no reason to throw a checkpoint away.
      const missing = thisBoot.filter(
        (c) => catalog.checkpoint(c.id)?.durable_at === null && !fs.existsSync(engine.paths.processImage(c.id)),
      );
      engine.log.warn({ err, dropped: missing.map((c) => c.id) }, 'pending checkpoints could not be made durable');
      lost.push(...missing);
    }
    // Newest first: each one's children have gone (or moved up) before it.
    for (const ckpt of lost.sort((a, b) => b.created_at - a.created_at)) {
      await dropCheckpoint(engine, ckpt);
      report.checkpoints.push(`dropped:${ckpt.id}`);
    }
  }
}

/** Removes a checkpoint that never became durable: its row first (head and standby move off it), then its files. */
async function dropCheckpoint(engine: ReaperDeps, ckpt: CheckpointRow): Promise<void> {
  const { catalog } = engine;
  const standby = catalog.standby(ckpt.sandbox_id);
  if (standby?.checkpoint === ckpt.id) await engine.runtime.destroy(standby.instance).catch(() => undefined);
  catalog.tx(() => {
    catalog.reparentCheckpoints(ckpt.id, ckpt.parent_id);
    const fresh = catalog.sandbox(ckpt.sandbox_id);
    if (fresh?.head_checkpoint_id === ckpt.id) catalog.updateSandbox(fresh.id, { head_checkpoint_id: ckpt.parent_id });
    if (catalog.standby(ckpt.sandbox_id)?.checkpoint === ckpt.id) catalog.clearStandby(ckpt.sandbox_id);
    catalog.deleteCheckpointRow(ckpt.id);
    catalog.deleteLayerRow(ckpt.layer_id);
    engine.agent.onCheckpointDeleted(ckpt);
  });
  await discardCheckpointFiles(engine, ckpt.id, ckpt.layer_id);
}

function safeReaddir(dir: string): string[] {
  try {
    return fs.readdirSync(dir);
  } catch {
    return [];
  }
}
