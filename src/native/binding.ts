/**
 * The one loader of the native addon. Everything else imports the typed
 * surface from here; nothing else touches the .node file (node-pty's
 * native.d.ts pattern).
 */
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { HostError } from '../errors.js';

export interface CriuRequest {
  op: 'dump' | 'restore' | 'check' | 'version';
  serviceAddress?: string;
  serviceBinary?: string;
  imagesDir?: string;
  workDir?: string;
  logFile?: string;
  logLevel?: number;
  pid?: number;
  leaveRunning?: boolean;
  tcpEstablished?: boolean;
  extUnixSk?: boolean;
  fileLocks?: boolean;
  linkRemap?: boolean;
  shellJob?: boolean;
  manageCgroupsMode?: number;
  networkLock?: number;
  root?: string;
  freezeCgroup?: string;
  cgRoots?: [string, string][];
  extMounts?: [string, string][];
  externals?: string[];
  skipMounts?: string[];
  cgroupProcs?: string[];
  emptyNetns?: boolean;
}

/** The addon's surface. Errors thrown carry code, errno, syscall and path. */
export interface NativeBinding {
  mountOverlay(target: string, lowers: string[], upper: string, work: string): void;
  unmount(target: string, detach?: boolean): boolean;
  /** Attaches at target a copy of source's mount where on-disk id N reads as host id base+N (N < count). */
  idmappedMount(source: string, target: string, base: number, count: number, readOnly?: boolean): void;
  makeSharedMount(path: string, bind?: boolean): void;
  filesystemType(path: string): number;
  subvolumeCreate(path: string): void;
  subvolumeSnapshot(source: string, dest: string, readonly: boolean): void;
  subvolumeDelete(path: string): boolean;
  syncFilesystem(path: string): void;
  openBeneath(root: string, relativePath: string, flags: number, mode?: number): number;
  openFlags: { O_PATH: number; O_DIRECTORY: number; O_NOFOLLOW: number };
  flock(fd: number, exclusive: boolean): boolean;
  criu(request: CriuRequest): Promise<number>;
  criuCgroupModes: Record<'ignore' | 'none' | 'props' | 'soft' | 'full' | 'strict', number>;
  criuNetworkLocks: Record<'iptables' | 'nftables' | 'skip', number>;
}

/** Magic numbers from statfs(2) that the layer store cares about. */
export const FS_MAGIC = {
  btrfs: 0x9123683e,
  overlay: 0x794c7630,
  tmpfs: 0x01021994,
  ext4: 0xef53,
} as const;

const here = path.dirname(fileURLToPath(import.meta.url));
/** Project root: dist/src/native -> ../../..; src/native -> ../.. */
export const projectRoot = (() => {
  let dir = here;
  for (let i = 0; i < 5; i++) {
    if (existsSync(path.join(dir, 'binding.gyp'))) return dir;
    dir = path.dirname(dir);
  }
  throw new HostError('NATIVE_NOT_BUILT', `Cannot locate the lockstep project root from ${here}`);
})();

const buildDir = path.join(projectRoot, 'build', 'Release');

/** Path of the helper executable that enters namespaces. */
export const helperPath = path.join(buildDir, 'lockstep-helper');
/** Path of the static init that becomes pid 1 of every sandbox. */
export const initPath = path.join(buildDir, 'lockstep-init');

let cached: NativeBinding | undefined;

/** Loads the addon once; a clear error tells how to build it when missing. */
export function native(): NativeBinding {
  if (cached) return cached;
  const file = path.join(buildDir, 'lockstep.node');
  if (!existsSync(file)) {
    throw new HostError('NATIVE_NOT_BUILT', `The native addon is not built (${file} is missing): run \`npm run setup\` as root`);
  }
  const require = createRequire(import.meta.url);
  cached = require(file) as NativeBinding;
  return cached;
}
