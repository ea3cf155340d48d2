/**
 * The layer store: where writable sandbox layers (overlay "upper" dirs) and
 * read-only checkpoint layers live, as btrfs subvolumes. A snapshot of a
 * subvolume is O(1) in its size (btrfs shares extents copy-on-write), which
 * is what keeps a checkpoint of a 1 GiB workspace as cheap as that of an
 * empty one. When the state directory is not on btrfs, the store is a btrfs
 * filesystem in a sparse image file, loop-mounted at <home>/store.
 * (Decision and measurements: docs/ARCHITECTURE.md, "Layer store".)
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { FS_MAGIC, native } from '../native/binding.js';
import { HostError, SystemCallError, isNativeError } from '../errors.js';
import type { StatePaths } from '../paths.js';

const DEFAULT_STORE_GIB = 64;

function isBtrfs(p: string): boolean {
  try {
    return native().filesystemType(p) === FS_MAGIC.btrfs;
  } catch {
    return false;
  }
}

function wrap<T>(what: string, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (isNativeError(e)) throw new SystemCallError('LAYER_STORE_FAILED', `${what}: ${e.message}`, e);
    throw e;
  }
}

/** btrfs-backed store of writable and checkpoint layers. */
export class LayerStore {
  private constructor(private readonly paths: StatePaths) {}

  /** Mounts (creating if needed) the store and its folders. Idempotent and quick when already mounted. */
  static open(paths: StatePaths): LayerStore {
    const store = new LayerStore(paths);
    store.ensureMounted();
    for (const dir of [paths.uppers, paths.layers, paths.processImages, paths.scratch]) {
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    }
    return store;
  }

  private ensureMounted(): void {
    const { home, store, storeImage } = this.paths;
    fs.mkdirSync(store, { recursive: true, mode: 0o700 });
    if (isBtrfs(store)) return;
    if (isBtrfs(home)) return; // the state directory itself is on btrfs: subvolumes go straight in
    if (!fs.existsSync(storeImage)) {
      const gib = Number(process.env.LOCKSTEP_STORE_GIB ?? DEFAULT_STORE_GIB);
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
        throw new HostError('BTRFS_UNAVAILABLE', 'mkfs.btrfs failed: install btrfs-progs (scripts/provision-host.sh does)', { cause: e });
      }
      fs.renameSync(storeImage + '.tmp', storeImage);
    }
    try {
      execFileSync('mount', ['-o', 'loop,noatime', storeImage, store], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      const stderr = String((e as { stderr?: Buffer }).stderr ?? '');
      throw new HostError('LAYER_STORE_MOUNT_FAILED', `Cannot loop-mount the layer store ${storeImage} at ${store}: ${stderr.trim()}`, { cause: e });
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

  /** A new, empty writable layer for a sandbox; `owner`: host id of the sandbox's root (user namespaces). */
  createUpper(sandboxId: string, owner: number | null = null): void {
    const base = this.paths.upper(sandboxId);
    wrap('creating the writable layer', () => native().subvolumeCreate(base));
    fs.mkdirSync(path.join(base, 'upper'), { mode: 0o755 });
    if (owner !== null) fs.chownSync(path.join(base, 'upper'), owner, owner);
    fs.mkdirSync(path.join(base, 'work'), { mode: 0o700 });
  }

  /** Freezes the current writable layer of a sandbox into a read-only layer (O(1)). */
  snapshotUpper(sandboxId: string, layerId: string): void {
    wrap('snapshotting the writable layer', () => native().subvolumeSnapshot(this.paths.upper(sandboxId), this.paths.layer(layerId), true));
  }

  /** Replaces a sandbox's writable layer with a writable copy of a layer (O(1)). */
  resetUpperTo(sandboxId: string, layerId: string): void {
    this.deleteUpper(sandboxId);
    wrap('restoring the writable layer', () => native().subvolumeSnapshot(this.paths.layer(layerId), this.paths.upper(sandboxId), false));
  }

  deleteUpper(sandboxId: string): boolean {
    return wrap('deleting the writable layer', () => native().subvolumeDelete(this.paths.upper(sandboxId)));
  }

  deleteLayer(layerId: string): boolean {
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

  /** Commits the btrfs transaction: snapshots and written files become durable. */
  sync(): void {
    wrap('syncing the layer store', () => native().syncFilesystem(this.paths.store));
  }
}
