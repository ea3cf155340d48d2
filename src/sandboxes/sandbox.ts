/**
 * A handle on one sandbox, shaped like the sandbox SDKs platforms already
 * use: sub-APIs as members (`sandbox.commands`, `sandbox.files`) and the
 * Lockstep verbs (checkpoint, rollback, fork) as methods.
 */
import fs from 'node:fs';
import os from 'node:os';
import type { SandboxRow, CheckpointRow } from '../catalog/catalog.js';
import { native } from '../native/binding.js';
import { CommandAbortedError, InvalidArgumentError, InvalidStateError, NotFoundError } from '../errors.js';
import type { Engine } from '../engine.js';
import { namespacePid, sleep } from '../host/proc.js';
import { CPU_PERIOD_US } from '../host/cgroups.js';
import { runCommand, spawnDetached, validateCommand, type RunOptions, type RunResult, type SpawnOptions } from './commands.js';
import { SandboxFiles, type FileEntry, type FileReadStream, type WriteOptions } from './files.js';
import { EXIT_DIR, backgroundPids, backgroundWrapper, readOutput, type OutputChunk, type OutputOffsets } from './background-output.js';
import type { Readable } from 'node:stream';
import type { AgentContext } from '../context/formats.js';
import type { EffectRecord, EffectSpec, BeginResult, Resolution, CompensationResult } from '../effects/effect-ledger.js';
import type { JsonValue } from '../effects/idempotency.js';
import type { Observation } from '../provenance/observations.js';
import type { Verdict, StaleVerdict } from '../provenance/verdicts.js';
import type { RollbackAgentOptions } from '../agent-state/agent-state.js';
import type { RollbackReport } from '../checkpoints/rollback.js';
import { checkpointSandbox, checkpointInfo, type CheckpointInfo, type CheckpointOptions } from '../checkpoints/checkpoint.js';
import { ownCheckpoint, rollbackSandbox } from '../checkpoints/rollback.js';
import { forkSandbox, validateForkCount, type ForkResult } from '../checkpoints/fork.js';
import { deleteCheckpoint, drawTree } from '../checkpoints/tree.js';
import { removeSandbox } from './remove.js';
import { prepareStandby, standbyEnabled } from '../checkpoints/standby.js';

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
}

/** Resources a sandbox uses (null where the host cannot tell). */
export interface SandboxUsage {
  cpuSeconds: number | null;
  /** Bytes the writable layer references, as of the last btrfs commit; null when the store has no quotas on. */
  diskUsedMb: number | null;
}

export function sandboxInfo(row: SandboxRow): SandboxInfo {
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
  };
}

/** Options every observed call takes: the agent's tool-call id, for provenance. */
export interface Provenance {
  toolCallId?: string | undefined;
  /** false: do not record an observation (the platform's own inspection, not the agent's). Default true. */
  observe?: boolean | undefined;
}

function validateToolCallId(id: unknown): string | undefined {
  if (id === undefined) return undefined;
  if (typeof id !== 'string' || id.length === 0 || id.length > 200) throw new InvalidArgumentError('toolCallId', 'a string of 1-200 characters', id);
  return id;
}

/** A command's result plus the id of the observation it was recorded as. */
export interface ObservedRunResult extends RunResult {
  /** Undefined when the call passed observe: false. */
  observationId: string | undefined;
}

/** Command execution inside one sandbox. */
export class SandboxCommands {
  constructor(private readonly sandbox: SandboxCore) {}

  /**
   * Runs a command; a string runs through /bin/sh -c. Resolves with the exit
   * code (never rejects on a non-zero one) and the id of the observation it
   * was recorded as, tagged with the branch, the checkpoint epoch and the
   * tool-call id.
   */
  run(cmd: string | string[], opts: RunOptions & Provenance & { envs?: Record<string, string> | undefined; background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: RunOptions & Provenance & { envs?: Record<string, string> | undefined; background?: false | undefined }): Promise<ObservedRunResult>;
  async run(cmd: string | string[], options: RunOptions & Provenance & { envs?: Record<string, string> | undefined; background?: boolean | undefined } = {}): Promise<ObservedRunResult | CommandHandle> {
    const opts = options.envs && !options.env ? { ...options, env: options.envs } : options;
    if (opts.background) return this.background(cmd, opts);
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    if (typeof cmd === 'string' && cmd.trim() === '') throw new InvalidArgumentError('command', 'a non-empty command', cmd);
    validateCommand(argv, opts);
    const toolCallId = validateToolCallId(opts.toolCallId);
    const row = this.sandbox.runningRow();
    const result = await runCommand(this.sandbox.enterTarget(row), argv, opts);
    if (opts.observe === false) return { ...result, observationId: undefined };
    const obs = this.sandbox.engine.agent.observe(row, {
      kind: 'command',
      subject: typeof cmd === 'string' ? cmd : argv.join(' '),
      exitCode: result.exitCode,
      summary: (result.stdout + result.stderr).slice(0, 500),
      ...(toolCallId ? { toolCallId } : {}),
    });
    return { ...result, observationId: obs.id };
  }

  /**
   * Starts cmd in the background as part of the sandbox's process tree and
   * returns a handle. A /bin/sh wrapper sends its output to files inside the
   * sandbox, where output() reads it, and writes its exit code where wait()
   * finds it (background-output.ts).
   */
  private async background(cmd: string | string[], opts: RunOptions & Provenance): Promise<CommandHandle> {
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    validateCommand(argv, opts);
    const wrapped = backgroundWrapper(argv);
    const pid = await spawnDetached(this.sandbox.enterTarget(), wrapped, { cwd: opts.cwd, env: opts.env });
    return new CommandHandle(this.sandbox, pid, opts.signal);
  }

  /** Reattaches to a background command by its pid (from run's handle or list()). */
  async connect(pid: number): Promise<CommandHandle> {
    if (!Number.isInteger(pid) || pid < 1) throw new InvalidArgumentError('pid', 'the pid of a background command', pid);
    if (!(await backgroundPids(this.sandbox.files())).includes(pid)) throw new InvalidArgumentError('pid', 'the pid of a background command of this sandbox', pid);
    return new CommandHandle(this.sandbox, pid);
  }

  /** The background commands started with run({background: true}), oldest pid first, with whether each still runs. */
  async list(): Promise<{ pid: number; running: boolean; exitCode: number | null }[]> {
    const out = [];
    for (const pid of await backgroundPids(this.sandbox.files())) {
      const h = new CommandHandle(this.sandbox, pid);
      const running = h.isRunning();
      out.push({ pid, running, exitCode: running ? null : (await h.wait()).exitCode });
    }
    return out;
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

  /**
   * The row, checked to be running with its init alive: the process with the
   * row's pid and start time (a bare pid may belong to a host process by now).
   * The init is watched from here on, so its exit marks the sandbox stopped.
   */
  runningRow(): SandboxRow {
    const row = this.row();
    if (row.state !== 'running' || row.init_pid === null || row.init_start === null || !this.engine.inits.track(row)) {
      throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${this.id} is not running (state: ${row.state})`, { sandboxId: this.id });
    }
    return row;
  }

  enterTarget(row: SandboxRow = this.runningRow()) {
    return {
      sandboxId: row.id,
      initPid: row.init_pid!,
      initStart: row.init_start!,
      cgroupProcs: this.engine.cgroups.procsFiles(this.engine.runtime.cgroupName(row.instance)),
      baseEnv: JSON.parse(row.env) as Record<string, string>,
    };
  }

  checkpoints(): CheckpointRow[] {
    return this.engine.catalog.checkpointsOf(this.id);
  }

  files(): SandboxFiles {
    return new SandboxFiles(() => {
      return this.engine.paths.sandboxRoot(this.runningRow().instance);
    });
  }
}

/** A background command: wait for it, or kill it. */
export class CommandHandle {
  constructor(
    private readonly sandbox: SandboxCore,
    /** pid inside the sandbox */
    readonly pid: number,
    signal?: AbortSignal,
  ) {
    signal?.addEventListener('abort', () => void this.kill().catch(() => undefined), { once: true });
  }

  private hostPid(): number | undefined {
    const cg = this.sandbox.engine.runtime.cgroupName(this.sandbox.row().instance);
    return this.sandbox.engine.cgroups.pids(cg).find((p) => namespacePid(p) === this.pid);
  }

  /** Whether the command's process is still there. */
  isRunning(): boolean {
    return this.hostPid() !== undefined;
  }

  /** What it wrote since `from` (byte offsets; default the start), and where to continue from. */
  async output(from?: OutputOffsets): Promise<OutputChunk & { running: boolean }> {
    const chunk = await readOutput(this.sandbox.files(), this.pid, from);
    return { ...chunk, running: this.isRunning() };
  }

  /** Resolves when the command has exited, with its exit code (null if it was killed before reporting one). */
  async wait(opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<{ exitCode: number | null }> {
    const deadline = opts.timeoutMs ? Date.now() + opts.timeoutMs : Infinity;
    while (this.hostPid() !== undefined) {
      if (opts.signal?.aborted) throw new CommandAbortedError('COMMAND_ABORTED', `Stopped waiting for background command ${this.pid}`);
      if (Date.now() > deadline) throw new CommandAbortedError('COMMAND_TIMEOUT', `Background command ${this.pid} still running after ${opts.timeoutMs} ms`);
      await sleep(20);
    }
    const raw = this.sandbox.files();
    try {
      const { content } = await raw.read(`${EXIT_DIR}/${this.pid}`, { maxBytes: 64 });
      // Written by the wrapper, but inside the sandbox: anything else there is no exit code.
      const text = content.toString().trim();
      return { exitCode: /^[0-9]{1,3}$/.test(text) ? Number(text) : null };
    } catch {
      return { exitCode: null };
    }
  }

  /** Sends a signal (default SIGKILL) to the command. False if it had already exited. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<boolean> {
    const pid = this.hostPid();
    if (pid === undefined) return false;
    // Pinned by a pidfd, then checked again: had the command exited and its
    // pid been reused, the signal fails rather than reach the new holder.
    let fd: number;
    try {
      fd = native().pidfdOpen(pid);
    } catch {
      return false;
    }
    try {
      if (this.hostPid() !== pid) return false;
      // The detached command leads its own process group (setsid): signal all of it.
      return native().pidfdSendSignal(fd, os.constants.signals[signal], true);
    } catch (e) {
      // Kernels before 6.9 cannot signal a group through a pidfd; the group is this sandbox's while its leader runs.
      if ((e as NodeJS.ErrnoException).code !== 'EINVAL') return false;
      try {
        process.kill(-pid, signal);
        return true;
      } catch {
        return false;
      }
    } finally {
      fs.closeSync(fd);
    }
  }
}

/** Files of a sandbox, with every read, write and listing recorded as an observation. */
export class ObservedFiles {
  constructor(
    private readonly sandbox: SandboxCore,
    private readonly raw: SandboxFiles,
  ) {}

  private record(kind: 'file-read' | 'file-write' | 'file-list', path: string, extra: { contentHash?: string; summary?: string }, p: Provenance): string | undefined {
    if (p.observe === false) return undefined;
    const toolCallId = validateToolCallId(p.toolCallId);
    return this.sandbox.engine.agent.observe(this.sandbox.row(), { kind, subject: path, ...extra, ...(toolCallId ? { toolCallId } : {}) }).id;
  }

  /** Reads a file; returns its bytes, their sha256 and the observation id. */
  async read(path: string, p: Provenance & { maxBytes?: number | undefined } = {}): Promise<{ content: Buffer; sha256: string; observationId: string | undefined }> {
    const r = await this.raw.read(path, { maxBytes: p.maxBytes });
    return { ...r, observationId: this.record('file-read', path, { contentHash: r.sha256 }, p) };
  }

  /**
   * Reads a file as a stream, for files too large to hold in memory. The read
   * is recorded as an observation (with the hash of what was delivered) when
   * the stream ends; `done` then gives the hash and the observation id.
   */
  async readStream(path: string, p: Provenance = {}): Promise<Omit<FileReadStream, 'done'> & { done: Promise<{ sha256: string; bytes: number; observationId: string | undefined }> }> {
    const validated = { toolCallId: validateToolCallId(p.toolCallId), observe: p.observe };
    const r = await this.raw.readStream(path);
    const done = r.done.then((d) => ({ ...d, observationId: this.record('file-read', path, { contentHash: d.sha256 }, validated) }));
    done.catch(() => undefined); // a stream the caller cuts off is not an unhandled rejection
    return { ...r, done };
  }

  async write(path: string, data: string | Uint8Array, opts: { mode?: number } & Provenance = {}): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    const r = await this.raw.write(path, data, opts.mode !== undefined ? { mode: opts.mode } : {});
    return { ...r, observationId: this.record('file-write', path, { contentHash: r.sha256 }, opts) };
  }

  /** Writes a file from a stream (a Readable or any async iterable of bytes); the file changes only once all of it arrived. */
  async writeStream(
    path: string,
    source: Readable | AsyncIterable<Uint8Array | string>,
    opts: Pick<WriteOptions, 'mode' | 'maxBytes' | 'signal'> & Provenance = {},
  ): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    validateToolCallId(opts.toolCallId);
    const r = await this.raw.writeStream(path, source, { mode: opts.mode, maxBytes: opts.maxBytes, signal: opts.signal });
    return { ...r, observationId: this.record('file-write', path, { contentHash: r.sha256 }, opts) };
  }

  async list(path: string, p: Provenance = {}): Promise<FileEntry[] & { observationId?: string }> {
    const entries = await this.raw.list(path);
    return Object.assign(entries, { observationId: this.record('file-list', path, { summary: entries.map((e) => e.name).join(' ').slice(0, 500) }, p) });
  }

  async exists(path: string): Promise<boolean> {
    return this.raw.exists(path);
  }

  async remove(path: string, p: Provenance = {}): Promise<void> {
    await this.raw.remove(path);
    this.record('file-write', path, { summary: 'removed' }, p);
  }

  async mkdir(path: string): Promise<void> {
    await this.raw.mkdir(path);
  }

  /** Content hash of a file, or null if it does not exist (not recorded). */
  async hash(path: string): Promise<string | null> {
    return this.raw.hash(path);
  }
}

/** The effect ledger seen from one sandbox: intents recorded before side effects run. */
export class SandboxEffects {
  constructor(private readonly sandbox: SandboxCore) {}

  private ctx() {
    return this.sandbox.engine.agent.effectContext(this.sandbox.row());
  }
  private get ledger() {
    return this.sandbox.engine.agent.effects;
  }

  /** Records the intent durably; returns the recorded output instead if this effect already committed. */
  begin(spec: EffectSpec): BeginResult {
    return this.ledger.begin(this.ctx(), spec);
  }
  commit(effectId: string, output?: JsonValue): void {
    this.get(effectId); // another sandbox's effect is reported as missing
    this.ledger.commit(effectId, output);
  }
  fail(effectId: string, err: unknown, opts: { definite: boolean }): void {
    this.get(effectId);
    this.ledger.fail(effectId, err, opts);
  }
  /** begin → fn → commit/fail; after a rollback or in a fork, a committed effect returns its recorded output without running fn. */
  run<T extends JsonValue | undefined | void>(spec: EffectSpec, fn: () => T | Promise<T>): Promise<T> {
    return this.ledger.run(this.ctx(), spec, fn);
  }
  resolveUnknown(effectId: string, resolution: Resolution): EffectRecord {
    this.get(effectId);
    return this.ledger.resolveUnknown(effectId, resolution);
  }
  /** Runs compensations in reverse order of commit. */
  compensate(effectIds: string[], runner: (effect: EffectRecord) => Promise<JsonValue | undefined>): Promise<CompensationResult[]> {
    return this.ledger.compensate(effectIds, runner);
  }
  list(): EffectRecord[] {
    return this.ledger.list(this.sandbox.id);
  }
  get(effectId: string): EffectRecord {
    const e = this.ledger.get(effectId);
    if (!this.list().some((x) => x.id === e.id)) throw new NotFoundError('effect', effectId);
    return e;
  }
}

/** Verdicts a caller records about files ("the scan passed"), bound to the file's content hash. */
export class SandboxVerdicts {
  constructor(
    private readonly sandbox: SandboxCore,
    private readonly files: SandboxFiles,
  ) {}

  /** Records a verdict about a file as it is now. */
  async record(input: { path: string; verdict: string } & Provenance): Promise<Verdict> {
    if (typeof input.verdict !== 'string' || !input.verdict || input.verdict.length > 500) throw new InvalidArgumentError('verdict', 'a string of 1-500 characters', input.verdict);
    const row = this.sandbox.row();
    const hash = await this.files.hash(input.path);
    if (hash === null) throw new InvalidArgumentError('path', 'an existing file in the sandbox', input.path);
    const toolCallId = validateToolCallId(input.toolCallId);
    return this.sandbox.engine.agent.verdicts.record({ sandboxId: row.id, branchId: row.branch_id, path: input.path, contentHash: hash, verdict: input.verdict, ...(toolCallId ? { toolCallId } : {}) });
  }

  list(): Verdict[] {
    return this.sandbox.engine.agent.verdicts.list(this.sandbox.id);
  }

  /** Verdicts whose file no longer has the content they were made on. */
  async stale(): Promise<StaleVerdict[]> {
    const hashes = new Map<string, string | null>();
    for (const p of this.sandbox.engine.agent.verdictPaths(this.sandbox.id)) hashes.set(p, await this.files.hash(p).catch(() => null));
    return this.sandbox.engine.agent.verdicts.staleVerdicts(this.sandbox.id, (p) => hashes.get(p) ?? null);
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
  readonly files: ObservedFiles;
  readonly effects: SandboxEffects;
  readonly verdicts: SandboxVerdicts;
  /** @internal */
  readonly core: SandboxCore;

  /** @internal use Lockstep.create / Lockstep.get */
  constructor(engine: Engine, id: string) {
    this.id = id;
    this.core = new SandboxCore(engine, id);
    this.commands = new SandboxCommands(this.core);
    const raw = this.core.files();
    this.files = new ObservedFiles(this.core, raw);
    this.effects = new SandboxEffects(this.core);
    this.verdicts = new SandboxVerdicts(this.core, raw);
  }

  info(): SandboxInfo {
    return sandboxInfo(this.core.row());
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

  /** Takes an aligned checkpoint: filesystem layer, process tree, the agent's context and the ledger cursor, atomically. */
  async checkpoint(opts: CheckpointOptions = {}): Promise<CheckpointInfo> {
    const engine = this.core.engine;
    const info = await engine.withSandboxLock(this.id, () => checkpointSandbox(engine, this.core.runningRow(), opts));
    this.queueStandby(info.id); // a later rollback to this checkpoint becomes a swap
    return info;
  }

  /** Prepares a warm standby of a checkpoint in the background, behind this sandbox's lock. */
  private queueStandby(checkpointId: string): void {
    if (!standbyEnabled()) return;
    const engine = this.core.engine;
    const ckpt = engine.catalog.checkpoint(checkpointId)!;
    void engine.withSandboxLock(this.id, () => prepareStandby(engine, this.id, ckpt)).catch(() => undefined);
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
    const report = await engine.withSandboxLock(this.id, () => rollbackSandbox(engine, this.core.row(), checkpointId, opts));
    this.queueStandby(report.checkpointId); // agents often fail the same step again
    return report;
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
    return forkSandbox(engine, row, ckpt, count, { ...(opts.onProgress ? { onProgress: opts.onProgress } : {}), ...(opts.signal ? { signal: opts.signal } : {}) });
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
