/**
 * The one loader of the native addon. Everything else imports the typed
 * surface from here; nothing else touches the .node file (node-pty's
 * native.d.ts pattern).
 */
import { createRequire } from 'node:module';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { HostError, SETUP_HINT } from '../errors.js';

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
  /** Established TCP sockets are dumped without repair and restored closed (their peers see the old ones die). */
  tcpClose?: boolean;
  /** Dump: leave written-page tracking armed for the next dump (Lockstep's CRIU build, native/criu/). */
  trackMem?: boolean;
  /** Dump: the previous dump's images, relative to imagesDir ("../ID"); only the pages written since are stored. */
  parentImg?: string;
  /** A CRIU configuration file, for options the RPC has no field for (`wp-keeper SOCKET`). */
  configFile?: string;
  /** Restore of an egress sandbox: the veth side moved in and configured at setup-namespaces (netns.cc). */
  veth?: VethConfig;
}

/** The sandbox side of an egress sandbox's veth, as named in the root namespace, and its /31 inside. */
export interface VethConfig {
  peer: string;
  address: string;
  gateway: string;
  prefixLength: number;
}

/**
 * Watches processes through pidfds on a thread of its own; `onExit(id)` runs
 * on the event loop when a watched process exits. It never keeps the event
 * loop alive.
 */
export interface PidWatcher {
  /**
   * Watches pid if it runs (and, given `expectedStart`, is the process that
   * started then: /proc start time in clock ticks). Null when it is gone, a
   * zombie, or another process now holds the pid.
   */
  watch(pid: number, expectedStart?: number): { id: number; start: number } | null;
  /** No onExit for this id after this returns. */
  unwatch(id: number): void;
  /** Stops the thread and closes every pidfd; idempotent. */
  close(): void;
}

/** What openChecked found at a path. */
export interface OpenedFile {
  /** -1 unless the leaf is of the kind asked for. */
  fd: number;
  type: 'file' | 'directory' | 'symlink' | 'fifo' | 'socket' | 'character-device' | 'block-device' | 'unknown';
  size: number;
  mode: number;
  uid: number;
  gid: number;
}

/** The addon's surface. Errors thrown carry code, errno, syscall and path. */
export interface NativeBinding {
  mountOverlay(target: string, lowers: string[], upper: string, work: string): void;
  unmount(target: string, detach?: boolean): boolean;
  /**
   * Attaches at each target a copy of its source's mount where on-disk id N
   * reads as host id base+N (N < count); one user namespace describes them
   * all, and the work runs on libuv's pool. On failure none stays mounted.
   */
  idmappedMounts(
    mounts: [source: string, target: string][],
    base: number,
    count: number,
    readOnly?: boolean,
  ): Promise<void>;
  /**
   * The device nodes, links and mount points of a sandbox's /dev in `dir`
   * (the same ones the helper's create verb makes); existing entries are
   * kept. On a thread of its own (neither libuv's pool, where it would wait
   * behind btrfs snapshots, nor the event loop).
   */
  makeDevFolder(dir: string): Promise<void>;
  /**
   * Re-owns every entry under dir (dir included, links never followed)
   * whose uid or gid is in [from, from+count) to the same offset from `to`,
   * keeping set-user/group-id bits; one job on a thread of its own.
   */
  shiftOwners(dir: string, from: number, to: number, count: number): Promise<void>;
  /**
   * A new folder dest (0750, root:gid) with a copy (bytes for small files,
   * a reflink for large ones where possible) of every file of src, each root:gid with `mode`; one job on a thread of its own.
   */
  cloneFolder(src: string, dest: string, gid: number, mode: number): Promise<void>;
  makeSharedMount(path: string, bind?: boolean): void;
  /** A tmpfs on path (nosuid), with mount options such as "mode=0700,size=64m". */
  mountTmpfs(path: string, options: string): void;
  filesystemType(path: string): number;
  /** The btrfs verbs and syncfs run on libuv's pool (they can take a while under load). */
  subvolumeCreate(path: string): Promise<void>;
  subvolumeSnapshot(source: string, dest: string, readonly: boolean): Promise<void>;
  /** False when there was nothing to delete. */
  subvolumeDelete(path: string): Promise<boolean>;
  syncFilesystem(path: string): Promise<void>;
  /** BTRFS_IOC_GET_SUBVOL_INFO of the subvolume rooted at path (synchronous: O(1)); uuid in hex. */
  subvolumeInfo(path: string): {
    uuid: string;
    generation: number;
    ctransid: number;
    otransid: number;
    readonly: boolean;
  };
  /** openat2 below root (RESOLVE_BENEATH | NO_MAGICLINKS | NO_XDEV), on libuv's pool. */
  openBeneath(root: string, relativePath: string, flags: number, mode?: number): Promise<number>;
  /** The same, synchronous: only for the image importer (no sandbox exists yet). */
  openBeneathSync(root: string, relativePath: string, flags: number, mode?: number): number;
  /**
   * Opens the leaf O_PATH|O_NOFOLLOW, fstats it, and reopens it for I/O
   * (O_NONBLOCK) only if it is a regular file (a directory with O_DIRECTORY);
   * otherwise fd is -1 and nothing was opened. A symlink leaf leading outside
   * the root fails with EXDEV.
   */
  openChecked(root: string, relativePath: string, flags: number): Promise<OpenedFile>;
  /**
   * The write end (O_NONBLOCK) of a FIFO below root, resolved as openChecked
   * does: ENOTSUP if the leaf is not a FIFO, ENXIO if no process reads it.
   */
  openFifoWriter(root: string, relativePath: string): Promise<number>;
  /** Turns on btrfs qgroup accounting for the filesystem holding path (idempotent). */
  quotaEnable(path: string): void;
  /** Sets the max-referenced limit of a subvolume's qgroup (0 clears it). */
  qgroupLimit(subvolume: string, maxReferencedBytes: number): void;
  /** A subvolume's qgroup numbers as of the last commit; null when quotas are off. */
  qgroupUsage(subvolume: string): { referenced: number; exclusive: number; maxReferenced: number | null } | null;
  openFlags: { O_PATH: number; O_DIRECTORY: number; O_NOFOLLOW: number; O_NONBLOCK: number };
  flock(fd: number, exclusive: boolean): boolean;
  criu(request: CriuRequest): Promise<number>;
  /** Whether a server listens on a unix SOCK_SEQPACKET socket (the written-page keeper's). */
  seqpacketListening(path: string): boolean;
  criuCgroupModes: Record<'ignore' | 'none' | 'props' | 'soft' | 'full' | 'strict', number>;
  criuNetworkLocks: Record<'iptables' | 'nftables' | 'skip', number>;
  PidWatcher: new (onExit: (id: number) => void) => PidWatcher;
  /** A pidfd for pid (close with fs.closeSync); throws ESRCH when it is gone. */
  pidfdOpen(pid: number): number;
  /**
   * For each of nsPids, the host pid of the live process that has it in the
   * pid namespace of the init (pid, start time in clock ticks), or null (none,
   * a zombie, a thread's id); null instead of the array when that init is
   * gone. A few system calls per pid, whatever the sandbox runs. Throws
   * ENOTTY or EINVAL on kernels before 6.11 (no nsfs pid translation).
   */
  hostPidsIn(initPid: number, initStart: number, nsPids: number[]): (number | null)[] | null;
  /** Signals the pidfd's process (`group`: the process group it leads, Linux >= 6.9); false once it has exited. */
  pidfdSendSignal(fd: number, signal: number, group?: boolean): boolean;
  /** Moves the veth side into pid's network namespace as eth0 with its address, route and loopback (a thread of its own). */
  attachVeth(pid: number, config: VethConfig): Promise<void>;
  /** Brings a root-namespace interface up or down (one ioctl). */
  setLinkUp(name: string, up: boolean): void;
  /**
   * A TCP connection to 127.0.0.1:port inside the network namespace of the
   * pidfd's process, made on a thread of its own (never the event loop or
   * libuv's pool); resolves with the connected socket's fd, rejects with
   * ECONNREFUSED, ETIMEDOUT (past timeoutMs) or ESRCH (the process is gone).
   */
  connectInNetns(pidfd: number, port: number, timeoutMs: number): Promise<number>;
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
/** Path of the static relay that holds an interactive process's terminal and stdin inside the sandbox. */
export const relayPath = path.join(buildDir, 'lockstep-relay');

/**
 * Where scripts/install.js says why `npm install` did not build the native
 * parts (no compiler, CRIU not installed yet, ...); a build removes it.
 */
export const installNotePath = path.join(projectRoot, 'build', 'install-skipped.txt');

/** Linux on x86_64 is the one platform Lockstep runs on (CRIU, overlayfs, btrfs, its helpers). */
export function assertSupportedPlatform(platform: string = process.platform, arch: string = process.arch): void {
  if (platform !== 'linux' || arch !== 'x64') {
    throw new HostError(
      'UNSUPPORTED_PLATFORM',
      `Lockstep runs on Linux x86_64 only (this is ${platform}-${arch}): ` +
        `it needs CRIU, overlayfs, btrfs and Linux namespaces`,
      {
        details: { platform, arch },
      },
    );
  }
}

let cached: NativeBinding | undefined;

/** Loads the addon once; a clear error tells how to build it when missing. */
export function native(): NativeBinding {
  if (cached) return cached;
  assertSupportedPlatform();
  const file = path.join(buildDir, 'lockstep.node');
  if (!existsSync(file)) {
    let why = '';
    try {
      why = ` (npm install did not build it: ${readFileSync(installNotePath, 'utf8').trim()})`;
    } catch {
      /* no note: never installed through npm, or built and removed since */
    }
    throw new HostError('NATIVE_NOT_BUILT', `The native addon is not built${why}; ${file} is missing: ${SETUP_HINT}`, {
      details: { path: file },
    });
  }
  const require = createRequire(import.meta.url);
  try {
    cached = require(file) as NativeBinding;
  } catch (e) {
    // Typically libcriu.so.2 missing (the private CRIU prefix was removed) or a build from another host.
    throw new HostError(
      'NATIVE_LOAD_FAILED',
      `The native addon ${file} does not load: ${(e as Error).message.split('\n')[0]}; ${SETUP_HINT}`,
      { cause: e, details: { path: file } },
    );
  }
  return cached;
}
