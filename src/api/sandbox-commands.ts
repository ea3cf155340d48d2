/** sandbox.commands: commands run in a sandbox, each recorded as an observation; background commands as handles. */
import fs from 'node:fs';
import os from 'node:os';
import { CommandAbortedError, InvalidArgumentError, InvalidStateError } from '../errors.js';
import { namespacePid, startTime } from '../host/proc.js';
import {
  runCommand,
  spawnDetached,
  validateCommand,
  type RunOptions,
  type RunResult,
  type SpawnOptions,
} from '../instances/commands.js';
import {
  EXIT_DIR,
  INPUT_DIR,
  backgroundPids,
  backgroundWrapper,
  hasInput,
  hasOutput,
  readOutput,
  type OutputChunk,
  type OutputOffsets,
} from '../instances/background-output.js';
import { SandboxCore, validateToolCallId, type Provenance } from './sandbox-core.js';
import type { SandboxFiles } from '../instances/files.js';
import { dataRecords, relayInputs, relayReady, timelineOf, type FifoAddress } from '../instances/relay.js';

/** Options of a background command: `stdin: true` keeps its stdin open for sendStdin (default: /dev/null). */
export interface BackgroundOptions {
  stdin?: boolean | undefined;
}

/** Input bytes as the SDK takes them: text (UTF-8) or bytes. */
export function inputBytes(field: string, data: unknown): Buffer {
  if (typeof data === 'string') return Buffer.from(data, 'utf8');
  if (data instanceof Uint8Array) return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  throw new InvalidArgumentError(field, 'a string or a Uint8Array', data);
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
  run(
    cmd: string | string[],
    opts: RunOptions & Provenance & BackgroundOptions & { envs?: Record<string, string> | undefined; background: true },
  ): Promise<CommandHandle>;
  run(
    cmd: string | string[],
    opts?: RunOptions & Provenance & { envs?: Record<string, string> | undefined; background?: false | undefined },
  ): Promise<ObservedRunResult>;
  async run(
    cmd: string | string[],
    options: RunOptions &
      Provenance &
      BackgroundOptions & { envs?: Record<string, string> | undefined; background?: boolean | undefined } = {},
  ): Promise<ObservedRunResult | CommandHandle> {
    const opts = options.envs && !options.env ? { ...options, env: options.envs } : options;
    if (opts.background) return this.background(cmd, opts);
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    if (typeof cmd === 'string' && cmd.trim() === '')
      throw new InvalidArgumentError('command', 'a non-empty command', cmd);
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
  private async background(
    cmd: string | string[],
    opts: RunOptions & Provenance & BackgroundOptions,
  ): Promise<CommandHandle> {
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    validateCommand(argv, opts);
    if (opts.stdin !== undefined && typeof opts.stdin !== 'boolean')
      throw new InvalidArgumentError('stdin', 'a boolean', opts.stdin);
    const wrapped = backgroundWrapper(argv, { stdin: opts.stdin });
    const pid = await spawnDetached(this.sandbox.enterTarget(), wrapped, { cwd: opts.cwd, env: opts.env });
    const handle = new CommandHandle(this.sandbox, pid, opts.signal, opts.stdin === true);
    // Returns once the wrapper has made its files (its FIFO too, with stdin):
    // a client that connects, writes or reattaches right after the start
    // must find the command (the Python SDK's test met it without stdin too).
    const files = this.sandbox.files();
    try {
      await relayReady(
        async () => (await hasOutput(files, pid)) && (!opts.stdin || (await hasInput(files, pid))),
        () => handle.isRunning(),
      );
    } catch (e) {
      // The command has started (its pid is known) and the sandbox stopped
      // right after, maybe by the command's own doing (`kill -TERM 1`): the
      // start succeeded, and what the caller does next meets the stopped
      // sandbox (identity.test met this through `lockstep serve`).
      if (!(e instanceof InvalidStateError && e.code === 'SANDBOX_NOT_RUNNING')) throw e;
    }
    return handle;
  }

  /**
   * A handle on the command with this pid inside the sandbox, not checked
   * (connect checks that it is a background command of this sandbox): wait
   * and kill on a pid that names no command of the sandbox find it gone.
   */
  byPid(pid: number): CommandHandle {
    if (!Number.isInteger(pid) || pid < 1) throw new InvalidArgumentError('pid', 'a pid inside the sandbox', pid);
    return new CommandHandle(this.sandbox, pid);
  }

  /** Reattaches to a background command by its pid (from run's handle or list()). */
  async connect(pid: number): Promise<CommandHandle> {
    if (!Number.isInteger(pid) || pid < 1)
      throw new InvalidArgumentError('pid', 'the pid of a background command', pid);
    if (!(await hasOutput(this.sandbox.files(), pid)))
      throw new InvalidArgumentError('pid', 'the pid of a background command of this sandbox', pid);
    return new CommandHandle(this.sandbox, pid);
  }

  /**
   * The background commands started with run({background: true}), oldest pid
   * first, with whether each still runs; from at most
   * MAX_OUTPUT_ENTRIES_LISTED entries of the output folder
   * (background-output.ts), which the sandbox can fill.
   */
  async list(): Promise<{ pid: number; running: boolean; exitCode: number | null }[]> {
    const files = this.sandbox.files();
    const { pids } = await backgroundPids(files);
    // Whether each runs: one batch of nsfs lookups, no /proc read per pid.
    const hosts = hostPids(this.sandbox, pids);
    const out: { pid: number; running: boolean; exitCode: number | null }[] = [];
    for (let i = 0; i < pids.length; i += LIST_EXIT_READS_AT_ONCE) {
      const batch = pids.slice(i, i + LIST_EXIT_READS_AT_ONCE);
      out.push(
        ...(await Promise.all(
          batch.map(async (pid, j) => {
            const running = hosts[i + j] !== undefined;
            return { pid, running, exitCode: running ? null : await exitCodeOf(files, pid) };
          }),
        )),
      );
    }
    return out;
  }

  /**
   * Starts a background process that belongs to the sandbox (checkpoints capture
   * it); returns its pid inside the sandbox.
   */
  async spawn(cmd: string | string[], opts: SpawnOptions = {}): Promise<number> {
    const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
    if (typeof cmd === 'string' && cmd.trim() === '')
      throw new InvalidArgumentError('command', 'a non-empty command', cmd);
    validateCommand(argv, opts);
    return spawnDetached(this.sandbox.enterTarget(), argv, opts);
  }
}

/** Exit codes of finished commands list() reads at once (each a small read on libuv's pool). */
const LIST_EXIT_READS_AT_ONCE = 16;

/**
 * Host pids of the sandbox's processes with these pids (inside it), or
 * undefined for those not running. Through the nsfs ioctls (a few system
 * calls a pid); kernels before 6.11 lack them and fall back to reading NSpid
 * of each process of the sandbox's cgroup.
 */
function hostPids(sandbox: SandboxCore, pids: number[]): (number | undefined)[] {
  const row = sandbox.row();
  if (row.init_pid === null || row.init_start === null) return pids.map(() => undefined);
  try {
    const hosts = sandbox.engine.native.hostPidsIn(row.init_pid, row.init_start, pids);
    return hosts === null ? pids.map(() => undefined) : hosts.map((h) => h ?? undefined);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== 'ENOTTY' && code !== 'EINVAL') throw e;
    const cg = sandbox.engine.runtime.cgroupName(row.instance);
    const byNsPid = new Map<number, number>();
    for (const p of sandbox.engine.cgroups.pids(cg)) {
      const n = namespacePid(p);
      if (n !== undefined) byNsPid.set(n, p);
    }
    return pids.map((p) => byNsPid.get(p));
  }
}

/** The exit code the wrapper wrote, or null (killed before writing it, or not a code). */
async function exitCodeOf(files: SandboxFiles, pid: number): Promise<number | null> {
  try {
    const { content } = await files.read(`${EXIT_DIR}/${pid}`, { maxBytes: 64 });
    // Written by the wrapper, but inside the sandbox: anything else there is no exit code.
    const text = content.toString().trim();
    return /^[0-9]{1,3}$/.test(text) ? Number(text) : null;
  } catch {
    return null;
  }
}

/** A background command: read its output, write its stdin, wait for it, or kill it. */
export class CommandHandle {
  constructor(
    private readonly sandbox: SandboxCore,
    /** pid inside the sandbox */
    readonly pid: number,
    signal?: AbortSignal,
    /** Started with stdin: true (its FIFO may not exist yet); undefined: look. */
    private stdinKnown?: boolean,
  ) {
    signal?.addEventListener('abort', () => void this.kill().catch(() => undefined), { once: true });
  }

  private async stdinAddress(): Promise<FifoAddress> {
    const row = this.sandbox.runningRow();
    this.stdinKnown ??= await hasInput(this.sandbox.files(), this.pid);
    if (!this.stdinKnown)
      throw new InvalidStateError(
        'STDIN_CLOSED',
        `Background command ${this.pid} takes no input: it was started without stdin: true, or its stdin was closed`,
        { pid: this.pid },
      );
    return {
      key: `${timelineOf(row)}:stdin:${this.pid}`,
      root: this.sandbox.engine.paths.sandboxRoot(row.instance),
      path: `${INPUT_DIR.slice(1)}/${this.pid}`,
      running: () => this.isRunning(),
    };
  }

  /**
   * Writes bytes to the command's stdin (it must have been started with
   * `stdin: true`). Resolves once they are queued, in order, for the
   * process; STDIN_FULL (nothing of them queued) while more than
   * MAX_PENDING_INPUT_BYTES wait because the process is not reading;
   * STDIN_CLOSED once stdin was closed or the process is gone.
   */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const bytes = inputBytes('data', data);
    if (!this.isRunning())
      throw new InvalidStateError('STDIN_CLOSED', `Background command ${this.pid} is not running`, { pid: this.pid });
    await relayInputs(this.sandbox.engine).send(await this.stdinAddress(), dataRecords(bytes));
  }

  /**
   * Closes the command's stdin: it reads EOF after the bytes sent before.
   * Closing twice is not an error, nor is closing the stdin of a command
   * started without one (/dev/null is at EOF already).
   */
  async closeStdin(): Promise<void> {
    let address: FifoAddress;
    try {
      address = await this.stdinAddress();
    } catch (e) {
      if (e instanceof InvalidStateError && e.code === 'STDIN_CLOSED') return;
      throw e;
    }
    const inputs = relayInputs(this.sandbox.engine);
    if (inputs.isClosed(address.key) || !this.isRunning()) return;
    await inputs.close(address);
  }

  private hostPid(): number | undefined {
    return hostPids(this.sandbox, [this.pid])[0];
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

  /**
   * Resolves when the command has exited, with its exit code (null if it was
   * killed before reporting one). Nothing polls: the command's host pid is
   * looked up once and its exit watched through a pidfd (engine.exits); an
   * abort or the timeout gives the watch and the timer back at once.
   */
  async wait(opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<{ exitCode: number | null }> {
    await this.exited(opts, `background command ${this.pid}`);
    return { exitCode: await exitCodeOf(this.sandbox.files(), this.pid) };
  }

  /**
   * Resolves once the process has exited, watching its pidfd (nothing
   * polls); COMMAND_ABORTED when the signal aborts, COMMAND_TIMEOUT past
   * timeoutMs. `what` names it in those errors. A PTY waits through this too.
   */
  async exited(opts: { timeoutMs?: number; signal?: AbortSignal }, what: string): Promise<void> {
    const deadline = opts.timeoutMs ? Date.now() + opts.timeoutMs : undefined;
    for (;;) {
      const row = this.sandbox.row();
      const host = this.hostPid();
      if (host === undefined) break;
      // The start time pins the process: read after the lookup, then the lookup
      // again; had the command exited in between (its host pid reused), the
      // watch finds another start time and ends at once.
      const start = startTime(host);
      if (start === undefined || this.hostPid() !== host) continue;
      const end = await this.sandbox.engine.exits.wait(host, {
        start,
        signal: opts.signal,
        ...(deadline !== undefined ? { timeoutMs: Math.max(0, deadline - Date.now()) } : {}),
      });
      if (end === 'aborted') throw new CommandAbortedError('COMMAND_ABORTED', `Stopped waiting for ${what}`);
      if (end === 'timeout')
        throw new CommandAbortedError(
          'COMMAND_TIMEOUT',
          `${what.charAt(0).toUpperCase()}${what.slice(1)} still running after ${opts.timeoutMs} ms`,
        );
      // A rollback replaced the tree (a new init): the command may run on,
      // restored under another host pid; otherwise it has exited.
      const now = this.sandbox.row();
      if (now.init_pid === row.init_pid && now.init_start === row.init_start) break;
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
      fd = this.sandbox.engine.native.pidfdOpen(pid);
    } catch {
      return false;
    }
    try {
      if (this.hostPid() !== pid) return false;
      // The detached command leads its own process group (setsid): signal all of it.
      return this.sandbox.engine.native.pidfdSendSignal(fd, os.constants.signals[signal], true);
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
