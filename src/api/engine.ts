/**
 * The internals every verb shares: paths, catalog, runtime, CRIU, locks and
 * the fault hook. Lockstep (the public manager) builds one; the verbs in
 * checkpoints/ and sandboxes/ take it as their first argument, so each verb
 * lives in a file of its own (youki's container_checkpoint.rs pattern).
 */
import fs from 'node:fs';
import type { Catalog } from '../catalog/catalog.js';
import type { CgroupDriver } from '../host/cgroups.js';
import type { ImageStore } from '../images/image-store.js';
import type { StatePaths } from '../paths.js';
import type { SandboxRuntime } from '../instances/runtime.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { ProcessExits } from '../instances/process-exits.js';
import type { FaultHook } from '../faults.js';
import type { Logger } from '../log.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { LockstepConfig } from '../config.js';
import type { Clock, CriuClient, HelperClient, LayerPort, NativeBinding, ProcessTable } from '../ports.js';
import { InvalidStateError } from '../errors.js';
import type { Admission } from '../admission.js';
import type { HostNetwork } from '../host/network/host-network.js';
import type { SandboxResolver } from '../network/dns.js';
import type { ExposedPorts } from '../network/exposed-ports.js';

export interface Engine {
  config: LockstepConfig;
  paths: StatePaths;
  catalog: Catalog;
  /** The ports (src/ports.ts): production ones unless open() was given others. */
  native: NativeBinding;
  proc: ProcessTable;
  clock: Clock;
  cgroups: CgroupDriver;
  layers: LayerPort;
  supervisor: HelperClient;
  criu: CriuClient;
  images: ImageStore;
  runtime: SandboxRuntime;
  log: Logger;
  fault: FaultHook;
  agent: AgentState;
  /** Watches every running sandbox's init; marks the sandbox stopped when it exits. */
  inits: InitWatcher;
  /** Waits for host processes (background commands) to exit, on one pidfd watcher thread. */
  exits: ProcessExits;
  /** Egress sandboxes' veths, nftables table and bandwidth caps (src/network/). */
  network: HostNetwork;
  /** Egress sandboxes' resolvers, one socket per sandbox on its gateway. */
  dns: SandboxResolver;
  /** Exposed ports: their rows, and connections into sandboxes' namespaces (src/network/exposed-ports.ts). */
  exposures: ExposedPorts;
  /** Directory listings in flight, per tenant and in total (each reads a whole directory; see dir-page.ts). */
  listings: Admission;
  /** New sandboxes get a user namespace (OpenOptions.userNamespaces / LOCKSTEP_USERNS, on by default). */
  userNamespaces: boolean;
  /** Serialises operations on one sandbox, within this process and across processes. */
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
  /** Waits for queued per-sandbox work (warm standbys, cleanups) to finish. */
  drainLocks(): Promise<void>;
}

/**
 * The processes with the file open, other than through `ownFd`: who holds a
 * lock that timed out (another manager, or a child that inherited the
 * descriptor). Only read on that path: it walks every process's fds.
 */
function processesHolding(file: string, ownFd: number): string[] {
  const found: string[] = [];
  let pids: string[] = [];
  try {
    file = fs.realpathSync(file);
    pids = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p));
  } catch {
    return found;
  }
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = fs.readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      if (Number(pid) === process.pid && Number(fd) === ownFd) continue;
      try {
        if (fs.readlinkSync(`/proc/${pid}/fd/${fd}`) !== file) continue;
        const comm = fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
        found.push(`pid ${pid} (${comm}${Number(pid) === process.pid ? ', this manager' : ''}) fd ${fd}`);
      } catch {
        /* gone meanwhile */
      }
    }
  }
  return found;
}

/** In-process queue + cross-process flock on <run>/locks/<id> (StatePaths.sandboxLock). */
export class SandboxLocks {
  private readonly chains = new Map<string, Promise<unknown>>();
  constructor(
    private readonly lockFile: (id: string) => string,
    private readonly flock: NativeBinding['flock'],
    private readonly clock: Clock,
  ) {}

  async with<T>(id: string, fn: () => Promise<T>, timeoutMs = 60_000): Promise<T> {
    const prev = this.chains.get(id) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const chain = prev.then(() => mine);
    this.chains.set(id, chain);
    await prev.catch(() => undefined);
    let fd: number | undefined;
    try {
      fd = fs.openSync(this.lockFile(id), fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
      const deadline = this.clock.now() + timeoutMs;
      while (!this.flock(fd, true)) {
        if (this.clock.now() > deadline) {
          const holders = processesHolding(this.lockFile(id), fd);
          throw new InvalidStateError(
            'SANDBOX_BUSY',
            `Sandbox ${id} is busy with another operation` +
              (holders.length ? ` (its lock is open in ${holders.join(', ')})` : ''),
            { sandboxId: id, holders },
          );
        }
        await this.clock.sleep(5);
      }
      return await fn();
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
      release();
      if (this.chains.get(id) === chain) this.chains.delete(id);
    }
  }

  /** Resolves when every queued operation (background work included) has finished. */
  async drain(): Promise<void> {
    while (this.chains.size) await Promise.allSettled([...this.chains.values()]);
  }
}
