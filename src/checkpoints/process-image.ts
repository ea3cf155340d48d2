/**
 * The CRIU options that make a sandbox's process tree dumpable and
 * restorable cheaply, in one place so dump and restore agree:
 * - /dev is a bind mount of a host folder, declared external ("dev"), so
 *   CRIU does not archive it on every dump;
 * - the network namespace is pinned on the host and joined on restore;
 *   network locking is skipped (the namespace is loopback-only and its
 *   sockets are frozen with the tree);
 * - cgroups are not dumped: restored tasks are put into the sandbox's cgroup
 *   by the addon when CRIU reports the new root task ("setup-namespaces").
 */
import fs from 'node:fs';
import path from 'node:path';
import { native, type CriuRequest } from '../native/binding.js';
import type { Engine } from '../engine.js';
import type { SandboxRow } from '../catalog/catalog.js';

export function dumpOptions(engine: Engine, row: SandboxRow, imagesDir: string): CriuRequest & { imagesDir: string; pid: number } {
  const b = native();
  return {
    op: 'dump',
    imagesDir,
    pid: row.init_pid!,
    leaveRunning: true,
    freezeCgroup: engine.cgroups.freezerPath(engine.runtime.cgroupName(row.id)),
    extMounts: [['/dev', 'dev']],
    networkLock: b.criuNetworkLocks.skip,
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: Number(process.env.LOCKSTEP_CRIU_LOG_LEVEL ?? 2),
  };
}

export function restoreOptions(engine: Engine, sandboxId: string, imagesDir: string, workDir: string): CriuRequest & { imagesDir: string } {
  const b = native();
  return {
    op: 'restore',
    imagesDir,
    workDir,
    root: engine.paths.sandboxRoot(sandboxId),
    extMounts: [['dev', engine.paths.sandboxDev(sandboxId)]],
    joinNs: [['net', engine.paths.sandboxNetns(sandboxId)]],
    cgroupProcs: engine.cgroups.procsFiles(engine.runtime.cgroupName(sandboxId)),
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: Number(process.env.LOCKSTEP_CRIU_LOG_LEVEL ?? 2),
  };
}

/** Total bytes of a process image folder (CRIU writes a few dozen files). */
export function processImageBytes(dir: string): number {
  let total = 0;
  for (const f of fs.readdirSync(dir)) total += fs.statSync(path.join(dir, f)).size;
  return total;
}

/** fsync every file of a folder, then the folder. */
export function fsyncTree(dir: string): void {
  for (const f of fs.readdirSync(dir)) {
    const fd = fs.openSync(path.join(dir, f), 'r');
    try {
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
  }
  const d = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(d);
  } finally {
    fs.closeSync(d);
  }
}
