/**
 * The layer store: where writable sandbox layers (overlay "upper" dirs) and
 * read-only checkpoint layers live, as btrfs subvolumes. A snapshot of a
 * subvolume is O(1) in its size (btrfs shares extents copy-on-write), which
 * is what keeps a checkpoint of a 1 GiB workspace as cheap as that of an
 * empty one. When the state directory is not on btrfs, the store is a btrfs
 * filesystem in a sparse image file, loop-mounted at <home>/store.
 * (Decision and measurements: docs/decisions/layer-store-btrfs.md, "Layer store".)
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { FS_MAGIC, native } from '../native/binding.js';
import { HostError, SETUP_HINT, StoreFullError, SystemCallError, isNativeError } from '../errors.js';
import type { StatePaths } from '../paths.js';
import { resolveConfig, type LockstepConfig } from '../config.js';

/** The settings the store reads (LOCKSTEP_STORE_GIB, LOCKSTEP_DISK_QUOTA). */
type StoreConfig = Pick<LockstepConfig, 'storeGib' | 'diskQuota'>;

function isBtrfs(p: string): boolean {
  try {
    return native().filesystemType(p) === FS_MAGIC.btrfs;
  } catch {
    return false;
  }
}

// The ioctls and syncfs run on libuv's pool (the addon returns promises):
// a btrfs commit under load must not stall every other request.
async function wrap<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (isNativeError(e) && e.code === 'ENOSPC') throw new StoreFullError(what, e);
    if (isNativeError(e)) throw new SystemCallError('LAYER_STORE_FAILED', `${what}: ${e.message}`, e);
    throw e;
  }
}

// The qgroup ioctls are still synchronous: they only set or read a few
// numbers of one subvolume (enabling quotas once per store is the slow one).
function wrapSync<T>(what: string, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (isNativeError(e)) throw new SystemCallError('LAYER_STORE_FAILED', `${what}: ${e.message}`, e);
    throw e;
  }
}

/** btrfs-backed store of writable and checkpoint layers. */
export class LayerStore {
  private quotasOn: boolean | undefined;
  private constructor(
    private readonly paths: StatePaths,
    private readonly config: StoreConfig,
  ) {}

  /** Mounts (creating if needed) the store and its folders. Idempotent and quick when already mounted. */
  static open(paths: StatePaths, config: StoreConfig = resolveConfig()): LayerStore {
    const store = new LayerStore(paths, config);
    store.ensureMounted();
    for (const dir of [paths.uppers, paths.layers, paths.processImages, paths.scratch]) {
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    }
    // Quotas on from the start (unless turned off): every writable layer then
    // gets a disk limit (the default one if its create names none), and every
    // checkpoint's size includes the layer bytes it pins. Without them one
    // sandbox could fill the store every tenant shares (issue 23, finding 9),
    // and checkpoints could pin bytes no quota counts (finding 10).
    if (config.diskQuota !== 'off' && store.ownsFilesystem() && !store.quotasEnabled()) store.enableQuotas();
    return store;
  }

  private ensureMounted(): void {
    const { home, store, storeImage } = this.paths;
    fs.mkdirSync(store, { recursive: true, mode: 0o700 });
    if (isBtrfs(store)) return;
    if (isBtrfs(home)) return; // the state directory itself is on btrfs: subvolumes go straight in
    if (!fs.existsSync(storeImage)) {
      const gib = this.config.storeGib;
      const fd = fs.openSync(storeImage + '.tmp', 'w', 0o600);
      try {
        fs.ftruncateSync(fd, gib * 1024 ** 3); // sparse: blocks are used only as layers grow
      } finally {
        fs.closeSync(fd);
      }
      try {
        execFileSync('mkfs.btrfs', ['-q', '-f', storeImage + '.tmp'], { stdio: ['ignore', 'ignore', 'pipe'] });
      } catch (e) {
        fs.rmSync(storeImage + '.tmp', { force: true });
        throw new HostError('BTRFS_UNAVAILABLE', `mkfs.btrfs failed (btrfs-progs is not installed?): ${SETUP_HINT}`, {
          cause: e,
        });
      }
      fs.renameSync(storeImage + '.tmp', storeImage);
    }
    try {
      execFileSync('mount', ['-o', 'loop,noatime', storeImage, store], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      const stderr = String((e as { stderr?: Buffer }).stderr ?? '');
      throw new HostError(
        'LAYER_STORE_MOUNT_FAILED',
        `Cannot loop-mount the layer store ${storeImage} at ${store}: ${stderr.trim()}`,
        { cause: e },
      );
    }
    fs.chmodSync(store, 0o700);
  }

  /** Unmounts a loop-mounted store (tests and `lockstep` teardown); nothing else may be using it. */
  static unmount(paths: StatePaths): void {
    if (!isBtrfs(paths.store) || isBtrfs(paths.home)) return;
    try {
      native().unmount(paths.store, false);
    } catch (e) {
      // Still busy (a process of another tool looking at it): detach it; the
      // kernel frees the loop device when the last user goes.
      if ((e as NodeJS.ErrnoException).code !== 'EBUSY') throw e;
      native().unmount(paths.store, true);
    }
  }

  upperDir(sandboxId: string): { upper: string; work: string } {
    const base = this.paths.upper(sandboxId);
    return { upper: path.join(base, 'upper'), work: path.join(base, 'work') };
  }

  /**
   * The sandbox's /dev/shm: a folder of the writable layer's subvolume beside
   * the overlay's upper directory (so not part of the root file system), and
   * so bounded by the layer's disk quota and held by its snapshots.
   */
  shmDir(sandboxId: string): string {
    return path.join(this.paths.upper(sandboxId), 'shm');
  }

  /**
   * Makes the /dev/shm folder ready for the sandbox's root (`owner`: its host
   * id with a user namespace), also in a layer made before it existed. The
   * subvolume is open only to that root's group: CRIU resolves the folder
   * from inside the restored user namespace, and no other host user may
   * reach the world-writable folder in it.
   */
  async prepareShm(sandboxId: string, owner: number | null): Promise<void> {
    // On libuv's pool: a btrfs metadata call waits while another fork's
    // snapshot commits, and the event loop drives every fork at once.
    const base = this.paths.upper(sandboxId);
    const shm = this.shmDir(sandboxId);
    await fs.promises.chown(base, 0, owner ?? 0);
    await fs.promises.chmod(base, owner === null ? 0o700 : 0o750);
    try {
      await fs.promises.mkdir(shm, { mode: 0o1777 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    const st = await fs.promises.lstat(shm);
    if (!st.isDirectory()) throw new Error(`${shm} is not a directory`);
    await fs.promises.chown(shm, owner ?? 0, owner ?? 0);
    await fs.promises.chmod(shm, 0o1777);
  }

  /** A new, empty writable layer for a sandbox; `owner`: host id of the sandbox's root (user namespaces). */
  async createUpper(sandboxId: string, owner: number | null = null): Promise<void> {
    const base = this.paths.upper(sandboxId);
    await wrap('creating the writable layer', () => native().subvolumeCreate(base));
    await fs.promises.mkdir(path.join(base, 'upper'), { mode: 0o755 });
    if (owner !== null) await fs.promises.chown(path.join(base, 'upper'), owner, owner);
    await fs.promises.mkdir(path.join(base, 'work'), { mode: 0o700 });
  }

  /**
   * Why a disk quota cannot be had here, or undefined when it can. Quotas
   * are btrfs qgroups, which cost every snapshot of the filesystem a
   * transaction commit (docs/decisions/disk-quota.md, "Disk quota"): they are turned
   * on, when the store is opened, only on Lockstep's own loop-mounted store;
   * on a state directory that is itself on btrfs, only if an administrator
   * has enabled them.
   */
  quotaUnavailable(): string | undefined {
    if (this.config.diskQuota === 'off') return 'disk quotas are turned off (LOCKSTEP_DISK_QUOTA=off)';
    if (this.quotasEnabled() || this.ownsFilesystem()) return undefined;
    return (
      `btrfs quotas are off on ${this.paths.home}, a host btrfs Lockstep does not ` +
      `own: enable them there (btrfs quota enable) to allow disk quotas`
    );
  }

  /** True when the layers live in Lockstep's own loop-mounted btrfs image (not a host btrfs). */
  private ownsFilesystem(): boolean {
    return !isBtrfs(this.paths.home);
  }

  private enableQuotas(): void {
    wrapSync('enabling btrfs quotas on the layer store', () => native().quotaEnable(this.paths.store));
    this.quotasOn = true;
  }

  private quotasEnabled(): boolean {
    if (this.quotasOn) return true;
    this.quotasOn = wrapSync('reading the quota state', () => native().qgroupUsage(this.paths.layers) !== null);
    return this.quotasOn;
  }

  /**
   * Sets the writable layer's quota (a btrfs qgroup "max referenced" limit),
   * enabling quotas on the store first if needed (a store opened before
   * they came on at open). A snapshot's qgroup starts
   * with no limit, so every new copy of a layer needs this again. Call it
   * after the overlay is mounted: overlayfs makes its work directory at mount
   * time and, if a full layer refused that, would mount read-only.
   */
  setQuota(sandboxId: string, quotaBytes: number | null): void {
    if (quotaBytes === null) return;
    const why = this.quotaUnavailable();
    if (why) throw new HostError('DISK_QUOTA_UNAVAILABLE', why);
    if (!this.quotasEnabled()) this.enableQuotas();
    wrapSync('setting the writable layer quota', () => native().qgroupLimit(this.paths.upper(sandboxId), quotaBytes));
  }

  /**
   * Bytes a layer references (shared extents included) as of the last
   * commit, or null when quotas are off. Used as a checkpoint's disk size:
   * an upper bound on what deleting it alone could free.
   */
  layerBytes(layerId: string): number | null {
    if (!this.quotasEnabled()) return null;
    return wrapSync('reading a layer size', () => native().qgroupUsage(this.paths.layer(layerId))?.referenced ?? null);
  }

  /** A writable layer's quota and usage (bytes; usage as of the last commit), or null when quotas are off. */
  upperUsage(sandboxId: string): { usedBytes: number; quotaBytes: number | null } | null {
    if (!this.quotasEnabled()) return null;
    const u = wrapSync('reading the writable layer usage', () => native().qgroupUsage(this.paths.upper(sandboxId)));
    return u ? { usedBytes: u.referenced, quotaBytes: u.maxReferenced } : null;
  }

  /** Freezes the current writable layer of a sandbox into a read-only layer (O(1)). */
  async snapshotUpper(sandboxId: string, layerId: string): Promise<void> {
    await wrap('snapshotting the writable layer', () =>
      native().subvolumeSnapshot(this.paths.upper(sandboxId), this.paths.layer(layerId), true),
    );
  }

  /**
   * Replaces a sandbox's writable layer with a writable copy of a layer
   * (O(1)). A snapshot inherits its source's qgroup limit; it is lifted here
   * so that overlayfs can make its work directory in a full layer, and set
   * again by setQuota once the overlay is mounted.
   */
  async resetUpperTo(sandboxId: string, layerId: string, opts: { fresh?: boolean } = {}): Promise<void> {
    const upper = this.paths.upper(sandboxId);
    // A new instance (fork, standby: `fresh`) has none, and is not looked
    // for: a lookup on the store waits while another fork's snapshot commits.
    if (!opts.fresh && fs.existsSync(upper)) await this.deleteUpper(sandboxId);
    await wrap('restoring the writable layer', () =>
      native().subvolumeSnapshot(this.paths.layer(layerId), upper, false),
    );
    if (this.quotasEnabled()) wrapSync('lifting the inherited quota', () => native().qgroupLimit(upper, 0));
  }

  deleteUpper(sandboxId: string): Promise<boolean> {
    return wrap('deleting the writable layer', () => native().subvolumeDelete(this.paths.upper(sandboxId)));
  }

  deleteLayer(layerId: string): Promise<boolean> {
    return wrap('deleting a layer', () => native().subvolumeDelete(this.paths.layer(layerId)));
  }

  hasLayer(layerId: string): boolean {
    return fs.existsSync(this.paths.layer(layerId));
  }

  listUppers(): string[] {
    return fs.readdirSync(this.paths.uppers);
  }

  listLayers(): string[] {
    return fs.readdirSync(this.paths.layers);
  }

  /** Bytes still free for data in the store (statfs: what a writer could still allocate). */
  freeBytes(): number {
    const s = fs.statfsSync(this.paths.store);
    return s.bavail * s.bsize;
  }

  /** Commits the btrfs transaction: snapshots and written files become durable. */
  async sync(): Promise<void> {
    await wrap('syncing the layer store', () => native().syncFilesystem(this.paths.store));
  }
}
