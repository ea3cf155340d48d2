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
import type { Engine } from './engine.js';
import { discardCheckpointFiles } from './checkpoints/checkpoint.js';
import { commitRollback, restoreSandboxTo, swapInStandby } from './checkpoints/rollback.js';
import { hasStandbyFor } from './checkpoints/standby.js';
import { verifyCheckpoint } from './checkpoints/integrity.js';
import { removeSandbox } from './sandboxes/remove.js';

export interface ReapReport {
  operations: string[];
  sandboxes: string[];
  orphans: string[];
}

export async function reap(engine: Engine): Promise<ReapReport> {
  const report: ReapReport = { operations: [], sandboxes: [], orphans: [] };
  const { catalog, runtime, layers, paths, cgroups, proc } = engine;

  // A dead manager's CRIU call may still be running in the service: stop it
  // before its checkpoint is discarded or its sandbox thawed.
  const workers = await engine.criu.stopOrphanedWorkers();
  if (workers > 0) engine.log.warn({ workers }, 'killed CRIU workers left by a manager that died');

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
          row.standby_instance === standby &&
          hasStandbyFor(engine, row, ckpt.id)
        ) {
          const { oldInstance } = await swapInStandby(engine, row, ckpt, op.id, payload.branchId ?? row.branch_id, {});
          await runtime.destroy(oldInstance).catch(() => undefined);
          continue;
        }
        if (standby && row.instance === standby) {
          // The swap had committed; only the journal entry was left.
          catalog.endOperation(op.id);
          continue;
        }
        // Past the point of no return: a corrupt checkpoint leaves the sandbox stopped at it.
        await verifyCheckpoint(engine, ckpt);
        const pid = await restoreSandboxTo(engine, row, ckpt, op.id, {});
        commitRollback(engine, row, ckpt, op.id, pid, payload.branchId ?? row.branch_id);
      } catch (e) {
        engine.log.error({ err: e, sandboxId: row.id }, 'roll-forward of an interrupted rollback failed');
        await runtime.killProcesses(row.instance).catch(() => undefined);
        catalog.tx(() => {
          catalog.updateSandbox(row.id, {
            state: 'stopped',
            init_pid: null,
            init_start: null,
            head_checkpoint_id: ckpt.id,
            branch_id: payload.branchId ?? row.branch_id,
          });
          engine.agent.onRollback(row, ckpt, op.id);
          catalog.endOperation(op.id);
        });
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
      if (
        row.standby_instance &&
        !(
          row.standby_pid !== null &&
          proc.isAlive(row.standby_pid) &&
          proc.startTime(row.standby_pid) === row.standby_start
        )
      ) {
        await runtime.destroy(row.standby_instance).catch(() => undefined);
        catalog.updateSandbox(row.id, {
          standby_instance: null,
          standby_checkpoint: null,
          standby_pid: null,
          standby_start: null,
        });
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
  const checkpoints = catalog.allCheckpoints();
  const liveLayers = new Set(checkpoints.map((c) => c.layer_id));
  const liveCkpts = new Set(checkpoints.map((c) => c.id));
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
  for (const name of safeReaddir(paths.scratch))
    fs.rmSync(path.join(paths.scratch, name), { recursive: true, force: true });
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

function safeReaddir(dir: string): string[] {
  try {
    return fs.readdirSync(dir);
  } catch {
    return [];
  }
}
