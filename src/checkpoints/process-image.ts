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
import fs from 'node:fs';
import path from 'node:path';
import type { CriuRequest, VethConfig } from '../native/binding.js';
import { prepareRestoredNetwork } from '../network/sandbox-network.js';
import type { CheckpointRow, SandboxRow, Catalog } from '../catalog/catalog.js';
import { limitsOf } from '../lifecycle/create.js';
import { processImageForRange, shiftLayerOwners } from '../instances/id-shift.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { CreateDeps } from '../lifecycle/create.js';
import type { CgroupDriver } from '../host/cgroups.js';
import type { CriuClient, LayerPort, NativeBinding } from '../ports.js';
import type { LockstepConfig } from '../config.js';
import type { SandboxRuntime } from '../instances/runtime.js';
import type { StatePaths } from '../paths.js';

/** What process-image.ts uses of the manager's services (api/engine.ts builds them). */
export interface ProcessImageDeps extends SandboxNetworkDeps, CreateDeps {
  catalog: Catalog;
  cgroups: CgroupDriver;
  config: LockstepConfig;
  criu: CriuClient;
  layers: LayerPort;
  native: NativeBinding;
  paths: StatePaths;
  runtime: SandboxRuntime;
}

export function dumpOptions(
  engine: ProcessImageDeps,
  row: SandboxRow,
  imagesDir: string,
): CriuRequest & { imagesDir: string; pid: number } {
  const b = engine.native;
  return {
    op: 'dump',
    imagesDir,
    pid: row.init_pid!,
    leaveRunning: true,
    freezeCgroup: engine.cgroups.freezerPath(engine.runtime.cgroupName(row.instance)),
    extMounts: [
      ['/dev', 'dev'],
      ['/dev/shm', 'shm'],
    ],
    emptyNetns: true,
    // An egress sandbox may hold connections to the outside: they are dumped
    // as they are (no TCP repair, no network lock) and restored closed.
    ...(row.network ? { tcpClose: true } : {}),
    networkLock: b.criuNetworkLocks.skip,
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: engine.config.criuLogLevel,
  };
}

export function restoreOptions(
  engine: ProcessImageDeps,
  instance: string,
  imagesDir: string,
  idBase: number | null,
  veth?: VethConfig,
): Omit<CriuRequest, 'op'> & { imagesDir: string; workDirOwner?: number } {
  const b = engine.native;
  return {
    imagesDir,
    root: engine.paths.sandboxRoot(instance),
    extMounts: [
      ['dev', engine.paths.sandboxDev(instance)],
      ['shm', engine.layers.shmDir(instance)],
    ],
    emptyNetns: true,
    cgroupProcs: engine.cgroups.procsFiles(engine.runtime.cgroupName(instance)),
    manageCgroupsMode: b.criuCgroupModes.ignore,
    fileLocks: true,
    logLevel: engine.config.criuLogLevel,
    ...(idBase === null ? {} : { workDirOwner: idBase }),
    // Egress: eth0 moved in at setup-namespaces; connections come back closed.
    ...(veth ? { veth, tcpClose: true } : {}),
  };
}

/**
 * Total bytes of a process image folder (CRIU writes a few dozen files); the
 * parent link counts as itself, not as the parent.
 */
export function processImageBytes(dir: string): number {
  let total = 0;
  for (const f of fs.readdirSync(dir)) total += fs.lstatSync(path.join(dir, f)).size;
  return total;
}

/**
 * A new instance of a sandbox restored from a checkpoint: run folder, /dev,
 * cgroup with the sandbox's limits (CPU, memory, pids, I/O), a writable
 * copy of the checkpoint's layer, the overlay root (which sets the layer's
 * disk quota), then CRIU. Forks and warm standbys are made this way; `step`
 * marks the points the crash tests stop at. A fork into another id range
 * also needs a copy of the process image for that range (id-shift.ts): it
 * is made while the layer and root are prepared, since neither waits for
 * the other. Returns the restored root's host pid; on failure the caller
 * removes the instance.
 */
export async function restoreNewInstance(
  engine: ProcessImageDeps,
  key: string,
  like: SandboxRow,
  ckpt: CheckpointRow,
  step: (point: 'prepared' | 'layer-ready') => void = () => undefined,
  /** Host id range the checkpoint's files are in, when its sandbox's row does not say (a snapshot outlives it). */
  sourceIdBase?: number | null,
  opts: { standby?: boolean } = {},
): Promise<number> {
  const { paths } = engine;
  // A fork has a user namespace (id range) of its own: see id-shift.ts.
  const from = sourceIdBase !== undefined ? sourceIdBase : (engine.catalog.sandbox(ckpt.sandbox_id)?.id_base ?? null);
  const rebase = from !== null && like.id_base !== null && from !== like.id_base;
  if (!rebase) {
    const veth = await prepareInstance(engine, key, like, ckpt, step, null, opts);
    return engine.criu.restore(restoreOptions(engine, key, paths.processImage(ckpt.id), like.id_base, veth));
  }
  // The key was just made: nothing can be there yet.
  const images = path.join(paths.scratch, `images-${key}`);
  try {
    // Both run to their end before either's failure is thrown: the caller's
    // clean-up must not race a preparation still making the layer or mounts.
    const [prepared, copied] = await Promise.allSettled([
      prepareInstance(engine, key, like, ckpt, step, from, opts),
      processImageForRange(engine.native, paths.processImage(ckpt.id), images, from, like.id_base!),
    ]);
    if (prepared.status === 'rejected') throw prepared.reason;
    if (copied.status === 'rejected') throw copied.reason;
    return await engine.criu.restore(restoreOptions(engine, key, copied.value, like.id_base, prepared.value));
  } finally {
    // On libuv's pool: a few dozen unlinks on the store, each able to wait
    // for another fork's snapshot to commit, would stall every fork's event loop.
    await fs.promises.rm(images, { recursive: true, force: true });
  }
}

/**
 * Everything of a restored instance but its processes: run folder, /dev,
 * cgroup, writable layer (its owners moved from range `from` when that is
 * not the instance's), root, and an egress network's link.
 */
async function prepareInstance(
  engine: ProcessImageDeps,
  key: string,
  like: SandboxRow,
  ckpt: CheckpointRow,
  step: (point: 'prepared' | 'layer-ready') => void,
  from: number | null,
  opts: { standby?: boolean },
): Promise<VethConfig | undefined> {
  const { runtime, layers } = engine;
  runtime.prepare(key, limitsOf(like), like.id_base);
  await runtime.prepareForRestore(key);
  step('prepared');
  // Every instance made here is new (its key was just made): nothing to look for first.
  await layers.resetUpperTo(key, ckpt.layer_id, { fresh: true });
  if (from !== null)
    await Promise.all(
      // A layer made before /dev/shm existed has no shm folder.
      [layers.upperDir(key).upper, layers.shmDir(key)].map(async (dir) => {
        if (await exists(dir)) await shiftLayerOwners(engine.native, dir, from, like.id_base!);
      }),
    );
  await runtime.mountRoot(
    {
      id: key,
      imageRootfs: engine.catalog.liveImageOrHidden(ckpt.image).rootfs,
      runtimeLayer: ckpt.runtime_layer,
      hostname: like.hostname,
      diskBytes: like.disk_bytes,
      idBase: like.id_base,
    },
    { fresh: true },
  );
  step('layer-ready');
  return prepareRestoredNetwork(engine, key, like, { standby: opts.standby ?? false });
}

/** Whether file exists, asked on libuv's pool (a lookup on the store can wait for a snapshot's commit). */
function exists(file: string): Promise<boolean> {
  return fs.promises.access(file).then(
    () => true,
    () => false,
  );
}
