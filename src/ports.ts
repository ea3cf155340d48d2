/**
 * The ports: everything the engine's decisions ask of the host, as
 * interfaces. `Lockstep.open` takes each through OpenOptions and builds the
 * production one when it is absent; test/fakes/host.ts implements them all
 * with a recording fake, so checkpoint, rollback, fork, the standby and the
 * reaper run without root (youki's `Syscall` trait, testcontainers' ports).
 */
import fs from 'node:fs';
import type { CriuRequest, NativeBinding } from './native/binding.js';
import type { LayerStore } from './layers/layer-store.js';
import * as proc from './host/proc.js';

/** Time, so that expiry and lock waits can be driven by a test. */
export interface Clock {
  /** Milliseconds since the epoch (Date.now). */
  now(): number;
  sleep(ms: number): Promise<void>;
}

/** What /proc says about processes and mounts. */
export interface ProcessTable {
  /** True when pid exists and is not a zombie. */
  isAlive(pid: number): boolean;
  /** Start time in clock ticks since boot; with the pid it identifies a process across pid reuse. */
  startTime(pid: number): number | undefined;
  /** Mount points under a prefix, deepest first. */
  mountsUnder(prefix: string): string[];
  /** Propagation of a mount point; undefined when it is not one. */
  mountPropagation(mountPoint: string): 'shared' | 'slave' | 'private' | undefined;
  /** This kernel's boot id: files written but not yet synced survive a manager crash only within one boot. */
  bootId(): string;
}

/** Client of the state directory's supervisor (lockstep-helper supervise): the parent of every init and of CRIU. */
export interface HelperClient {
  ensureRunning(): Promise<void>;
  /** Runs ARGV as the supervisor's child and returns its stdout. */
  run(argv: string[], timeoutMs?: number): Promise<string>;
  /** Starts a long-lived child of the supervisor; returns its pid. */
  daemon(logFile: string, argv: string[], opts?: { isolatedRun?: boolean }): Promise<number>;
  /** Stops the supervisor; running sandboxes are not touched. */
  stop(): Promise<void>;
}

/** A dump request: which tree, and where its images go. */
export type CriuDumpRequest = Omit<CriuRequest, 'op' | 'serviceAddress'> & { imagesDir: string; pid: number };
/** A restore request: from which images (CRIU works in a scratch folder of its own). */
export type CriuRestoreRequest = Omit<CriuRequest, 'op' | 'serviceAddress' | 'workDir'> & {
  imagesDir: string;
  /** Arm written-page tracking in the restored processes (when the service tracks writes and its keeper runs). */
  armTracking?: boolean;
};

/** Client of the state directory's CRIU service. */
export interface CriuClient {
  /** Starts the service when needed; returns its version (40201 for 4.2.1). */
  ensureRunning(): Promise<number>;
  /** Whether dumps can store only the pages written since a parent dump (Lockstep's CRIU build and its keeper). */
  readonly tracksWrites: boolean;
  /** `tracked`: the dump armed written-page tracking (and used parentImg if it could). */
  dump(req: CriuDumpRequest): Promise<{ tracked: boolean }>;
  /** Returns the host pid of the restored tree's root. */
  restore(req: CriuRestoreRequest): Promise<number>;
  /** Kills workers a dead manager left running (the reaper, holding the state directory alone); returns how many. */
  stopOrphanedWorkers(): Promise<number>;
}

/** The layer store's verbs (src/layers/layer-store.ts is the btrfs one). */
export type LayerPort = Pick<
  LayerStore,
  | 'upperDir'
  | 'createUpper'
  | 'quotaUnavailable'
  | 'setQuota'
  | 'layerBytes'
  | 'upperUsage'
  | 'snapshotUpper'
  | 'resetUpperTo'
  | 'deleteUpper'
  | 'deleteLayer'
  | 'hasLayer'
  | 'listUppers'
  | 'listLayers'
  | 'sync'
  | 'freeBytes'
  | 'shmDir'
  | 'prepareShm'
>;

export type { NativeBinding };

export const systemClock: Clock = { now: () => Date.now(), sleep: proc.sleep };

export const procfs: ProcessTable = {
  isAlive: proc.isAlive,
  startTime: proc.startTime,
  mountsUnder: proc.mountsUnder,
  mountPropagation: proc.mountPropagation,
  bootId: () => fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim(),
};
