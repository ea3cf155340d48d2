/**
 * A handle on one sandbox, shaped like the sandbox SDKs platforms already
 * use: sub-APIs as members (`sandbox.commands`, `sandbox.files`) and the
 * Lockstep verbs (checkpoint, rollback, fork) as methods.
 */
import { networkInfo, type NetworkInfo } from '../host/network/policy.js';
import { slotAddresses } from '../host/network/addresses.js';
import type BetterSqlite3 from 'better-sqlite3';
import type { SandboxRow } from '../catalog/catalog.js';
import { migrateExtension } from '../catalog/extensions.js';
import type { Logger } from '../log.js';
import type { Engine } from './engine.js';
import { CPU_PERIOD_US } from '../host/cgroups.js';
import type { AgentContext } from '../context/formats.js';
import type { Observation } from '../provenance/observations.js';
import type { RollbackAgentOptions } from '../agent-state/agent-state.js';
import type { RollbackReport } from '../checkpoints/rollback.js';
import {
  checkpointSandbox,
  checkpointInfo,
  type CheckpointInfo,
  type CheckpointOptions,
} from '../checkpoints/checkpoint.js';
import { ownCheckpoint, rollbackSandbox } from '../checkpoints/rollback.js';
import { forkSandbox, validateForkCount, type ForkResult } from '../checkpoints/fork.js';
import { deleteCheckpoint, drawTree } from '../checkpoints/tree.js';
import { removeSandbox } from '../lifecycle/remove.js';
import { ensureDurable } from '../checkpoints/durability.js';
import { SandboxCore } from './sandbox-core.js';
import { SandboxCommands } from './sandbox-commands.js';
import { ObservedFiles } from './observed-files.js';
import { SandboxPty } from './sandbox-pty.js';
import { SandboxEffects } from './sandbox-effects.js';
import { SandboxVerdicts } from './sandbox-verdicts.js';
import { SandboxPorts } from './sandbox-ports.js';

export interface SandboxInfo {
  id: string;
  image: string;
  state: SandboxRow['state'];
  pid: number | null;
  memoryMb: number | null;
  pids: number | null;
  /** Relative CPU weight (cgroup v2 scale, default 100). */
  cpuWeight: number | null;
  /** Hard CPU cap in CPUs, or null for none. */
  cpus: number | null;
  ioWeight: number | null;
  /** Disk quota of the writable layer in MiB, or null for none. */
  diskMb: number | null;
  lineageId: string;
  branchId: string;
  headCheckpointId: string | null;
  forkedFrom: string | null;
  /** Id (tn_…) of the owning tenant (HTTP answers show its name here and the id as tenantId). */
  tenant: string | null;
  metadata: Record<string, string>;
  createdAt: string;
  expiresAt: string | null;
  /** Its network mode, addresses and allow list (docs/network.md, "Network"). */
  network: NetworkInfo;
}

/** Resources a sandbox uses (null where the host cannot tell). */
export interface SandboxUsage {
  cpuSeconds: number | null;
  /** Bytes the writable layer references, as of the last btrfs commit; null when the store has no quotas on. */
  diskUsedMb: number | null;
}

export function sandboxInfo(row: SandboxRow, range?: string): SandboxInfo {
  return {
    id: row.id,
    image: row.image,
    state: row.state,
    pid: row.init_pid,
    memoryMb: row.memory_bytes === null ? null : row.memory_bytes / (1024 * 1024),
    pids: row.pids_max,
    cpuWeight: row.cpu_weight,
    cpus: row.cpu_quota_us === null ? null : row.cpu_quota_us / CPU_PERIOD_US,
    ioWeight: row.io_weight,
    diskMb: row.disk_bytes === null ? null : row.disk_bytes / (1024 * 1024),
    lineageId: row.lineage_id,
    branchId: row.branch_id,
    headCheckpointId: row.head_checkpoint_id,
    forkedFrom: row.forked_from,
    tenant: row.tenant,
    metadata: JSON.parse(row.metadata),
    createdAt: new Date(row.created_at).toISOString(),
    expiresAt: row.expires_at === null ? null : new Date(row.expires_at).toISOString(),
    network: networkInfo(row.network, row.net_slot != null && range ? slotAddresses(range, row.net_slot) : null),
  };
}

export interface ForkOptions {
  count?: number | undefined;
  signal?: AbortSignal | undefined;
  onProgress?: ((done: number, total: number) => void) | undefined;
}

/** A running (or stopped) sandbox. Get one from `Lockstep.create` or `Lockstep.get`. */
export class Sandbox {
  readonly id: string;
  readonly commands: SandboxCommands;
  /** Interactive processes on terminals of the sandbox's own. */
  readonly pty: SandboxPty;
  readonly files: ObservedFiles;
  readonly effects: SandboxEffects;
  readonly verdicts: SandboxVerdicts;
  /** Ports the sandbox listens on, exposed through `lockstep serve` (E2B's getHost). */
  readonly ports: SandboxPorts;
  /** @internal */
  readonly core: SandboxCore;

  /** @internal use Lockstep.create / Lockstep.get */
  constructor(engine: Engine, id: string) {
    this.id = id;
    this.core = new SandboxCore(engine, id);
    this.commands = new SandboxCommands(this.core);
    this.pty = new SandboxPty(this.core);
    const raw = this.core.files();
    this.files = new ObservedFiles(this.core, raw);
    this.effects = new SandboxEffects(this.core);
    this.verdicts = new SandboxVerdicts(this.core, raw);
    this.ports = new SandboxPorts(this.core);
  }

  /** The logger of the sandbox's manager (Lockstep.logger). */
  get logger(): Logger {
    return this.core.engine.log;
  }

  /**
   * The catalog database of the sandbox's manager, for a catalog extension:
   * the same as Lockstep.extensionDatabase(name), which runs that
   * extension's schema steps first.
   */
  extensionDatabase(name: string): BetterSqlite3.Database {
    migrateExtension(this.core.engine.catalog.db, name);
    return this.core.engine.catalog.db;
  }

  info(): SandboxInfo {
    return sandboxInfo(this.core.row(), this.core.engine.config.networkRange);
  }

  /** What the sandbox uses now: CPU time since it (or its current instance) started, and its writable layer's bytes. */
  usage(): SandboxUsage {
    const engine = this.core.engine;
    const instance = this.core.row().instance;
    let cpuSeconds: number | null = null;
    try {
      cpuSeconds = engine.cgroups.cpuUsageUsec(engine.runtime.cgroupName(instance)) / 1e6;
    } catch {
      /* no cgroup (stopped) or no CPU accounting */
    }
    let diskUsedMb: number | null = null;
    try {
      const u = engine.layers.upperUsage(instance);
      if (u) diskUsedMb = u.usedBytes / (1024 * 1024);
    } catch {
      /* no writable layer */
    }
    return { cpuSeconds, diskUsedMb };
  }

  /** Removes the sandbox with everything it owns (E2B's kill). */
  async kill(): Promise<void> {
    const engine = this.core.engine;
    engine.catalog.requireSandbox(this.id);
    await engine.withSandboxLock(this.id, () => removeSandbox(engine, this.id));
  }

  /** Freezes every process of the sandbox (cgroup freezer). */
  async freeze(): Promise<void> {
    const row = this.core.runningRow();
    await this.core.engine.cgroups.freeze(this.core.engine.runtime.cgroupName(row.instance));
  }

  /** Observations recorded in this sandbox (stale ones included on request). */
  observations(opts: { includeStale?: boolean } = {}): Observation[] {
    return this.core.engine.agent.observations.list(this.id, opts);
  }

  /**
   * Takes an aligned checkpoint: filesystem layer, process tree, the agent's context
   * and the ledger cursor, atomically.
   */
  async checkpoint(opts: CheckpointOptions = {}): Promise<CheckpointInfo> {
    const engine = this.core.engine;
    // The verb queues durability and the warm standby behind the lock (checkpoints/after-commit.ts).
    return engine.withSandboxLock(this.id, () => checkpointSandbox(engine, this.core.runningRow(), opts));
  }

  /**
   * Resolves once a checkpoint's files are durable and checksummed (a
   * checkpoint returns before that: see LOCKSTEP_DURABLE_LATER); returns it.
   */
  async durable(checkpointId: string): Promise<CheckpointInfo> {
    const engine = this.core.engine;
    const ckpt = ownCheckpoint(engine, this.core.row(), checkpointId);
    return checkpointInfo(await ensureDurable(engine, ckpt));
  }

  /** Resolves once background work queued for this sandbox (warm standby, cleanup) is done. */
  async settled(): Promise<void> {
    await this.core.engine.withSandboxLock(this.id, async () => undefined);
  }

  /**
   * Restores files, processes and the agent's context to a checkpoint of this
   * sandbox, as one step; reports the observations that went stale and the
   * effects that cannot be taken back.
   */
  async rollback(checkpointId: string, opts: RollbackAgentOptions = {}): Promise<RollbackReport> {
    const engine = this.core.engine;
    // A stopped sandbox (its init exited or was killed) can be rolled back: that is how it comes back.
    // The verb queues the warm standby behind the lock (checkpoints/after-commit.ts).
    return engine.withSandboxLock(this.id, () => rollbackSandbox(engine, this.core.row(), checkpointId, opts));
  }

  /** The context snapshot stored with a checkpoint (null if none). */
  context(checkpointId: string): AgentContext | null {
    const ckpt = ownCheckpoint(this.core.engine, this.core.row(), checkpointId);
    return ckpt.context_id ? this.core.engine.agent.contexts.get(ckpt.context_id) : null;
  }

  /** Starts independent sandboxes from a checkpoint of this sandbox; one result per fork. */
  async fork(checkpointId: string, opts: ForkOptions = {}): Promise<ForkResult[]> {
    const engine = this.core.engine;
    const count = validateForkCount(opts.count);
    const row = this.core.row(); // forks start from the checkpoint, not from the parent's processes
    const ckpt = ownCheckpoint(engine, row, checkpointId);
    opts.signal?.throwIfAborted();
    return forkSandbox(engine, row, ckpt, count, {
      ...(opts.onProgress ? { onProgress: opts.onProgress } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
  }

  /** This sandbox's checkpoints, oldest first. */
  checkpoints(): CheckpointInfo[] {
    return this.core.checkpoints().map(checkpointInfo);
  }

  /** The checkpoint tree drawn as text (what `lockstep log` prints). */
  tree(opts: { color?: boolean } = {}): string {
    return drawTree(this.core.engine, this.core.row(), opts);
  }

  /** Deletes a checkpoint; its children are re-attached to its parent. */
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    const engine = this.core.engine;
    await engine.withSandboxLock(this.id, () => deleteCheckpoint(engine, this.core.row(), checkpointId));
  }

  async thaw(): Promise<void> {
    const row = this.core.row();
    this.core.engine.cgroups.thaw(this.core.engine.runtime.cgroupName(row.instance));
  }
}
