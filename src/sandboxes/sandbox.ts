/**
 * A handle on one sandbox, shaped like the sandbox SDKs platforms already
 * use: sub-APIs as members (`sandbox.commands`, `sandbox.files`) and the
 * Lockstep verbs (checkpoint, rollback, fork) as methods.
 */
import type { SandboxRow, CheckpointRow } from '../catalog/catalog.js';
import { InvalidArgumentError, InvalidStateError } from '../errors.js';
import type { Engine } from '../engine.js';
import { isAlive } from '../host/proc.js';
import { runCommand, spawnDetached, validateCommand, type RunOptions, type RunResult, type SpawnOptions } from './commands.js';
import { SandboxFiles } from './files.js';
import { checkpointSandbox, checkpointInfo, type CheckpointInfo, type CheckpointOptions } from '../checkpoints/checkpoint.js';
import { ownCheckpoint, rollbackSandbox, type RollbackCore } from '../checkpoints/rollback.js';
import { forkSandbox, validateForkCount, type ForkResult } from '../checkpoints/fork.js';
import { deleteCheckpoint } from '../checkpoints/tree.js';

export interface SandboxInfo {
  id: string;
  image: string;
  state: SandboxRow['state'];
  pid: number | null;
  memoryMb: number | null;
  pids: number | null;
  lineageId: string;
  branchId: string;
  headCheckpointId: string | null;
  forkedFrom: string | null;
  tenant: string | null;
  metadata: Record<string, string>;
  createdAt: string;
}

export function sandboxInfo(row: SandboxRow): SandboxInfo {
  return {
    id: row.id,
    image: row.image,
    state: row.state,
    pid: row.init_pid,
    memoryMb: row.memory_bytes === null ? null : row.memory_bytes / (1024 * 1024),
    pids: row.pids_max,
    lineageId: row.lineage_id,
    branchId: row.branch_id,
    headCheckpointId: row.head_checkpoint_id,
    forkedFrom: row.forked_from,
    tenant: row.tenant,
    metadata: JSON.parse(row.metadata),
    createdAt: new Date(row.created_at).toISOString(),
  };
}

/** Command execution inside one sandbox. */
export class SandboxCommands {
  constructor(private readonly sandbox: SandboxCore) {}

  /** Runs a command; a string runs through /bin/sh -c. Resolves with the exit code, never rejects on a non-zero one. */
  async run(cmd: string | string[], opts: RunOptions = {}): Promise<RunResult> {
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    if (typeof cmd === 'string' && cmd.trim() === '') throw new InvalidArgumentError('command', 'a non-empty command', cmd);
    validateCommand(argv, opts);
    return runCommand(this.sandbox.enterTarget(), argv, opts);
  }

  /** Starts a background process that belongs to the sandbox (checkpoints capture it); returns its pid inside the sandbox. */
  async spawn(cmd: string | string[], opts: SpawnOptions = {}): Promise<number> {
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    if (typeof cmd === 'string' && cmd.trim() === '') throw new InvalidArgumentError('command', 'a non-empty command', cmd);
    validateCommand(argv, opts);
    return spawnDetached(this.sandbox.enterTarget(), argv, opts);
  }
}

/** The engine-facing core shared by the public Sandbox handle. */
export class SandboxCore {
  constructor(
    readonly engine: Engine,
    readonly id: string,
  ) {}

  row(): SandboxRow {
    return this.engine.catalog.requireSandbox(this.id);
  }

  /** The row, checked to be running with its init alive. */
  runningRow(): SandboxRow {
    const row = this.row();
    if (row.state !== 'running' || row.init_pid === null || !isAlive(row.init_pid)) {
      throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${this.id} is not running (state: ${row.state})`, { sandboxId: this.id });
    }
    return row;
  }

  enterTarget() {
    const row = this.runningRow();
    return {
      initPid: row.init_pid!,
      cgroupProcs: this.engine.cgroups.procsFiles(this.engine.runtime.cgroupName(row.id)),
      baseEnv: JSON.parse(row.env) as Record<string, string>,
    };
  }

  checkpoints(): CheckpointRow[] {
    return this.engine.catalog.checkpointsOf(this.id);
  }

  files(): SandboxFiles {
    return new SandboxFiles(() => {
      this.runningRow();
      return this.engine.paths.sandboxRoot(this.id);
    });
  }
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
  readonly files: SandboxFiles;
  /** @internal */
  readonly core: SandboxCore;

  /** @internal use Lockstep.create / Lockstep.get */
  constructor(engine: Engine, id: string) {
    this.id = id;
    this.core = new SandboxCore(engine, id);
    this.commands = new SandboxCommands(this.core);
    this.files = this.core.files();
  }

  info(): SandboxInfo {
    return sandboxInfo(this.core.row());
  }

  /** Freezes every process of the sandbox (cgroup freezer). */
  async freeze(): Promise<void> {
    const row = this.core.runningRow();
    await this.core.engine.cgroups.freeze(this.core.engine.runtime.cgroupName(row.id));
  }

  /** Takes an aligned checkpoint of the filesystem layer and the process tree. */
  async checkpoint(opts: CheckpointOptions = {}): Promise<CheckpointInfo> {
    const engine = this.core.engine;
    return engine.withSandboxLock(this.id, () => checkpointSandbox(engine, this.core.runningRow(), opts));
  }

  /** Restores files and processes to a checkpoint of this sandbox, as one step. */
  async rollback(checkpointId: string): Promise<RollbackCore> {
    const engine = this.core.engine;
    return engine.withSandboxLock(this.id, () => rollbackSandbox(engine, this.core.row(), checkpointId));
  }

  /** Starts independent sandboxes from a checkpoint of this sandbox; one result per fork. */
  async fork(checkpointId: string, opts: ForkOptions = {}): Promise<ForkResult[]> {
    const engine = this.core.engine;
    const count = validateForkCount(opts.count);
    const row = this.core.row();
    const ckpt = ownCheckpoint(engine, row, checkpointId);
    return forkSandbox(engine, row, ckpt, count, opts.onProgress ? { onProgress: opts.onProgress } : {});
  }

  /** This sandbox's checkpoints, oldest first. */
  checkpoints(): CheckpointInfo[] {
    return this.core.checkpoints().map(checkpointInfo);
  }

  /** Deletes a checkpoint; its children are re-attached to its parent. */
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    const engine = this.core.engine;
    await engine.withSandboxLock(this.id, async () => deleteCheckpoint(engine, this.core.row(), checkpointId));
  }

  async thaw(): Promise<void> {
    const row = this.core.row();
    this.core.engine.cgroups.thaw(this.core.engine.runtime.cgroupName(row.id));
  }
}
