/**
 * The CRIU options that make a sandbox's process tree dumpable and
 * restorable cheaply, in one place so dump and restore agree:
 * - /dev is a bind mount of a host folder, declared external ("dev"), so
 *   CRIU does not archive it on every dump;
 * - the network namespace holds only loopback, so CRIU records it "empty"
 *   (no ip/iptables-save runs) and restore makes a new one, whose loopback
 *   the addon brings up before sockets are restored; network locking is
 *   skipped (nothing outside can reach the namespace);
 * - cgroups are not dumped: restored tasks are put into the sandbox's cgroup
 *   by the addon when CRIU reports the new root task ("setup-namespaces").
 */
import fs from 'node:fs';
import path from 'node:path';
import { native, type CriuRequest } from '../native/binding.js';
import type { Engine } from '../engine.js';
import type { CheckpointRow, SandboxRow } from '../catalog/catalog.js';
import { limitsOf } from '../sandboxes/create.js';

export function dumpOptions(engine: Engine, row: SandboxRow, imagesDir: string): CriuRequest & { imagesDir: string; pid: number } {
  const b = native();
  return {
    op: 'dump',
    imagesDir,
    pid: row.init_pid!,
    leaveRunning: true,
    freezeCgroup: engine.cgroups.freezerPath(engine.runtime.cgroupName(row.instance)),
    extMounts: [['/dev', 'dev']],
    emptyNetns: true,
    networkLock: b.criuNetworkLocks.skip,
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: Number(process.env.LOCKSTEP_CRIU_LOG_LEVEL ?? 2),
  };
}

export function restoreOptions(engine: Engine, instance: string, imagesDir: string): Omit<CriuRequest, 'op'> & { imagesDir: string } {
  const b = native();
  return {
    imagesDir,
    root: engine.paths.sandboxRoot(instance),
    extMounts: [['dev', engine.paths.sandboxDev(instance)]],
    emptyNetns: true,
    cgroupProcs: engine.cgroups.procsFiles(engine.runtime.cgroupName(instance)),
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: Number(process.env.LOCKSTEP_CRIU_LOG_LEVEL ?? 2),
  };
}

/** Total bytes of a process image folder (CRIU writes a few dozen files); the parent link counts as itself, not as the parent. */
export function processImageBytes(dir: string): number {
  let total = 0;
  for (const f of fs.readdirSync(dir)) total += fs.lstatSync(path.join(dir, f)).size;
  return total;
}

/**
 * A new instance of a sandbox restored from a checkpoint: run folder, /dev,
 * cgroup with the sandbox's limits (CPU, memory, pids, I/O), a writable
 * copy of the checkpoint's layer, the overlay root (which sets the layer's
 * disk quota), then CRIU. Forks and warm standbys are made this way; `step` marks the points the crash tests stop at. Returns the restored
 * root's host pid; on failure the caller removes the instance.
 */
export async function restoreNewInstance(
  engine: Engine,
  key: string,
  like: SandboxRow,
  ckpt: CheckpointRow,
  step: (point: 'prepared' | 'layer-ready') => void = () => undefined,
): Promise<number> {
  const { runtime, layers } = engine;
  runtime.prepare(key, limitsOf(like));
  await runtime.prepareForRestore(key);
  step('prepared');
  await layers.resetUpperTo(key, ckpt.layer_id);
  runtime.mountRoot({ id: key, imageRootfs: engine.catalog.liveImageOrHidden(ckpt.image).rootfs, runtimeLayer: ckpt.runtime_layer, hostname: like.hostname, diskBytes: like.disk_bytes });
  step('layer-ready');
  return engine.criu.restore(restoreOptions(engine, key, engine.paths.processImage(ckpt.id)));
}
