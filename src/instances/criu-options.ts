/**
 * The CRIU options that make a sandbox's process tree dumpable and
 * restorable cheaply, in one place so dump and restore agree:
 * - /dev is a bind mount of a host folder, declared external ("dev"), so
 *   CRIU does not archive it on every dump; /dev/shm likewise ("shm"), a
 *   folder of the writable layer, whose snapshot is the checkpoint's copy;
 * - the network namespace holds only loopback, so CRIU records it "empty"
 *   (no ip/iptables-save runs) and restore makes a new one, whose loopback
 *   the addon brings up before sockets are restored; network locking is
 *   skipped (nothing outside can reach the namespace);
 * - cgroups are not dumped: restored tasks are put into the sandbox's cgroup
 *   by the addon when CRIU reports the new root task ("setup-namespaces").
 */
import type { CgroupDriver } from '../host/cgroups.js';
import type { CriuRequest, VethConfig } from '../native/binding.js';
import type { LockstepConfig } from '../config.js';
import type { StatePaths } from '../paths.js';
import type { CriuClient, LayerPort, NativeBinding } from '../ports.js';
import type { SandboxRuntime } from './runtime.js';

/** What the CRIU options are made from. */
export interface CriuOptionsDeps {
  cgroups: CgroupDriver;
  config: LockstepConfig;
  layers: LayerPort;
  native: NativeBinding;
  paths: StatePaths;
  runtime: SandboxRuntime;
}

/** Written-page tracking: the manager's setting (wpKeeper, read per call) and a CRIU service that can. */
export function tracksWrites(deps: {
  config: Pick<LockstepConfig, 'wpKeeper'>;
  criu: Pick<CriuClient, 'tracksWrites'>;
}): boolean {
  return deps.config.wpKeeper !== null && deps.criu.tracksWrites;
}

/** The process tree to dump: its init and its instance. */
export interface DumpTarget {
  initPid: number;
  instance: string;
}

export function dumpOptions(
  deps: CriuOptionsDeps,
  target: DumpTarget,
  imagesDir: string,
): CriuRequest & { imagesDir: string; pid: number } {
  const b = deps.native;
  return {
    op: 'dump',
    imagesDir,
    pid: target.initPid,
    leaveRunning: true,
    freezeCgroup: deps.cgroups.freezerPath(deps.runtime.cgroupName(target.instance)),
    extMounts: [
      ['/dev', 'dev'],
      ['/dev/shm', 'shm'],
    ],
    emptyNetns: true,
    // Any sandbox may hold established connections: to the outside (egress),
    // from the exposed-port proxy (made by the manager inside its namespace),
    // or between its own processes. They are dumped as they are (no TCP
    // repair, no network lock) and restored closed; listeners come back.
    tcpClose: true,
    networkLock: b.criuNetworkLocks.skip,
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: deps.config.criuLogLevel,
  };
}

export function restoreOptions(
  deps: CriuOptionsDeps,
  instance: string,
  imagesDir: string,
  idBase: number | null,
  veth?: VethConfig,
): Omit<CriuRequest, 'op'> & { imagesDir: string; workDirOwner?: number } {
  const b = deps.native;
  return {
    imagesDir,
    root: deps.paths.sandboxRoot(instance),
    extMounts: [
      ['dev', deps.paths.sandboxDev(instance)],
      ['shm', deps.layers.shmDir(instance)],
    ],
    emptyNetns: true,
    cgroupProcs: deps.cgroups.procsFiles(deps.runtime.cgroupName(instance)),
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: deps.config.criuLogLevel,
    ...(idBase === null ? {} : { workDirOwner: idBase }),
    // Connections come back closed (see dumpOptions); egress: eth0 moved in at setup-namespaces.
    tcpClose: true,
    ...(veth ? { veth } : {}),
  };
}
