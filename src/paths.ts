/**
 * The on-disk layout of a state directory (docs/ARCHITECTURE.md, "On-disk
 * layout"). One place computes every path, so the reaper and the code that
 * creates things agree on where they live.
 */
import path from 'node:path';
import { DEFAULT_HOME, envValue } from './config.js';

export { DEFAULT_HOME };

/** Resolves the state directory: explicit option, then LOCKSTEP_HOME, then the default. */
export function resolveHome(home?: string): string {
  return path.resolve(home ?? envValue('LOCKSTEP_HOME') ?? DEFAULT_HOME);
}

/** Every path inside one state directory. */
export class StatePaths {
  constructor(readonly home: string) {}

  get catalog() {
    return path.join(this.home, 'lockstep.db');
  }
  /** This state directory's bundle-signing key (Ed25519, PKCS#8 PEM, 0600). */
  get bundleSigningKey() {
    return path.join(this.home, 'keys', 'bundle-ed25519.pem');
  }
  get managerLock() {
    return path.join(this.home, 'manager.lock');
  }
  get images() {
    return path.join(this.home, 'images');
  }
  image(name: string) {
    return path.join(this.images, name);
  }
  imageRootfs(name: string) {
    return path.join(this.images, name, 'rootfs');
  }
  get runtime() {
    return path.join(this.home, 'runtime');
  }
  runtimeLayer(hash: string) {
    return path.join(this.runtime, hash);
  }

  /** btrfs-backed store: writable uppers, checkpoint layers, process images. */
  get storeImage() {
    return path.join(this.home, 'store.btrfs');
  }
  get store() {
    return path.join(this.home, 'store');
  }
  get uppers() {
    return path.join(this.store, 'uppers');
  }
  upper(id: string) {
    return path.join(this.uppers, id);
  }
  get layers() {
    return path.join(this.store, 'layers');
  }
  layer(id: string) {
    return path.join(this.layers, id);
  }
  get processImages() {
    return path.join(this.store, 'process-images');
  }
  processImage(checkpointId: string) {
    return path.join(this.processImages, checkpointId);
  }
  get scratch() {
    return path.join(this.store, 'scratch');
  }

  /** Runtime state: a shared mount so that the CRIU service sees new mounts. */
  get run() {
    return path.join(this.home, 'run');
  }
  get supervisorSocket() {
    return path.join(this.run, 'supervisor.sock');
  }
  get supervisorPidfile() {
    return path.join(this.run, 'supervisor.pid');
  }
  get supervisorLog() {
    return path.join(this.run, 'supervisor.log');
  }
  get criuSocket() {
    return path.join(this.run, 'criu.sock');
  }
  get criuLog() {
    return path.join(this.run, 'criu-service.log');
  }
  /** The written-page keeper's socket and log (native/criu/wp-keeper.c). */
  get wpKeeperSocket() {
    return path.join(this.run, 'wp-keeper.sock');
  }
  get wpKeeperLog() {
    return path.join(this.run, 'wp-keeper.log');
  }
  /** The CRIU configuration file a tracked dump reads (`wp-keeper SOCKET`: the RPC has no field for it). */
  get criuTrackingConfig() {
    return path.join(this.run, 'criu-tracking.conf');
  }
  get sandboxesRun() {
    return path.join(this.run, 'sandboxes');
  }
  sandboxRun(id: string) {
    return path.join(this.sandboxesRun, id);
  }
  sandboxRoot(id: string) {
    return path.join(this.sandboxRun(id), 'root');
  }
  sandboxDev(id: string) {
    return path.join(this.sandboxRun(id), 'dev');
  }
  /** Idmapped views of the lower layers (sandboxes with a user namespace). */
  sandboxLowers(id: string) {
    return path.join(this.sandboxRun(id), 'lowers');
  }
  /** Outside any instance folder: a rollback that swaps instances keeps the lock. */
  get locks() {
    return path.join(this.run, 'locks');
  }
  sandboxLock(id: string) {
    return path.join(this.locks, id);
  }
}
