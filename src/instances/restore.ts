/**
 * One instance-restore, used alike by a rollback through CRIU (in place: the
 * sandbox's own instance, whose cgroup and limits stay), a fork, a start from
 * a snapshot and a warm standby (a new instance): run folder and cgroup (new
 * instances), the checkpoint's layer as the writable layer, the overlay root
 * (which sets the layer's disk quota), the network link, then CRIU.
 *
 * A fork into another id range also needs its writable layer re-owned and a
 * copy of the process image for that range (id-shift.ts); the copy is made
 * while the layer and root are prepared, since neither waits for the other.
 * Returns the restored root's host pid; on failure the caller removes what
 * the instance had (a new one whole; in place, the reaper's roll-forward).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { CgroupLimits } from '../host/cgroups.js';
import type { VethConfig } from '../native/binding.js';
import { tracksWrites } from './criu-options.js';
import type { CriuClient } from '../ports.js';
import { restoreOptions, type CriuOptionsDeps } from './criu-options.js';
import { processImageForRange, shiftLayerOwners } from './id-shift.js';
import type { SandboxHost } from './runtime.js';

export interface RestoreDeps extends CriuOptionsDeps {
  criu: CriuClient;
}

/** What to restore, and into which instance. */
export interface InstanceToRestore {
  /** The sandbox's own instance (in place) or a new one's key. */
  host: SandboxHost;
  /** The cgroup limits of a new instance (an instance restored in place keeps its cgroup). */
  limits: CgroupLimits;
  /** The checkpoint's layer, which becomes the instance's writable layer. */
  layerId: string;
  /** The checkpoint's process image folder. */
  processImage: string;
  /** Host id range the layer's and image's files are in, when it is not the instance's own (a fork into its own range). */
  fromIdBase: number | null;
}

/** Where the restore stops for its caller: crash points and timings. */
export type RestorePoint = 'prepared' | 'layer' | 'mounted';

export interface RestoreSteps {
  /** Restore into the instance that is there (a rollback), not a new one. */
  inPlace: boolean;
  /**
   * Arm written-page tracking in the restored processes (a rollback, a warm
   * standby): their next checkpoint then stores only what they wrote since
   * this checkpoint, instead of everything. Forks are not armed: their
   * images never link to another sandbox's.
   */
  armTracking: boolean;
  /** The instance's network link, made once its root is mounted (none without egress). */
  network(): Promise<VethConfig | undefined>;
  /** Called at each point, in order: 'prepared' (new instances only), 'layer', 'mounted'. */
  at?: (point: RestorePoint) => void;
}

export async function restoreInstance(
  deps: RestoreDeps,
  inst: InstanceToRestore,
  steps: RestoreSteps,
): Promise<number> {
  const key = inst.host.id;
  const idBase = inst.host.idBase ?? null;
  const arm = steps.armTracking && tracksWrites(deps);
  const from = inst.fromIdBase;
  const rebase = from !== null && idBase !== null && from !== idBase;
  if (!rebase) {
    const veth = await prepareInstance(deps, inst, steps, null);
    return deps.criu.restore({ ...restoreOptions(deps, key, inst.processImage, idBase, veth), armTracking: arm });
  }
  // The key was just made: nothing can be there yet.
  const images = path.join(deps.paths.scratch, `images-${key}`);
  try {
    // Both run to their end before either's failure is thrown: the caller's
    // clean-up must not race a preparation still making the layer or mounts.
    const [prepared, copied] = await Promise.allSettled([
      prepareInstance(deps, inst, steps, from),
      processImageForRange(deps.native, inst.processImage, images, from, idBase),
    ]);
    if (prepared.status === 'rejected') throw prepared.reason;
    if (copied.status === 'rejected') throw copied.reason;
    return await deps.criu.restore({
      ...restoreOptions(deps, key, copied.value, idBase, prepared.value),
      armTracking: arm,
    });
  } finally {
    // On libuv's pool: a few dozen unlinks on the store, each able to wait
    // for another fork's snapshot to commit, would stall every fork's event loop.
    await fs.promises.rm(images, { recursive: true, force: true });
  }
}

/**
 * Everything of a restored instance but its processes: run folder, /dev and
 * cgroup (new instances), writable layer (its owners moved from range `from`
 * when that is not the instance's), root, and an egress network's link.
 */
async function prepareInstance(
  deps: RestoreDeps,
  inst: InstanceToRestore,
  steps: RestoreSteps,
  from: number | null,
): Promise<VethConfig | undefined> {
  const { runtime, layers } = deps;
  const key = inst.host.id;
  const at = steps.at ?? (() => undefined);
  if (steps.inPlace) {
    runtime.unmountRoot(key);
    // The cgroup, and so its limits, stay; mountRoot sets the disk quota.
    await layers.resetUpperTo(key, inst.layerId);
  } else {
    runtime.prepare(key, inst.limits, inst.host.idBase ?? null);
    await runtime.prepareForRestore(key);
    at('prepared');
    // Every new instance's key was just made: nothing to look for first.
    await layers.resetUpperTo(key, inst.layerId, { fresh: true });
    if (from !== null)
      await Promise.all(
        // A layer made before /dev/shm existed has no shm folder.
        [layers.upperDir(key).upper, layers.shmDir(key)].map(async (dir) => {
          if (await exists(dir)) await shiftLayerOwners(deps.native, dir, from, inst.host.idBase!);
        }),
      );
  }
  at('layer');
  if (steps.inPlace) await runtime.mountRoot(inst.host);
  else await runtime.mountRoot(inst.host, { fresh: true });
  at('mounted');
  return steps.network();
}

/** Whether file exists, asked on libuv's pool (a lookup on the store can wait for a snapshot's commit). */
function exists(file: string): Promise<boolean> {
  return fs.promises.access(file).then(
    () => true,
    () => false,
  );
}
