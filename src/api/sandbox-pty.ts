/**
 * sandbox.pty: interactive processes on a terminal of the sandbox's own.
 *
 * `create` starts the relay (native/init/lockstep-relay.c) as a background
 * process of the sandbox: it takes a terminal pair from the sandbox's devpts
 * instance, runs the command on the slave as its controlling terminal, and
 * keeps the master, the input FIFO and the transcript inside the sandbox.
 * A handle is only an address (the relay's pid): input goes to the FIFO
 * (relay.ts), output is read from the transcript by byte offsets, so any
 * number of readers can follow and reattach from where they were.
 *
 * Checkpoint, rollback and fork (docs/interactive.md, "Interactive
 * processes"): the relay, the terminal pair and the command are part of the
 * process tree, so a checkpoint with a PTY open dumps them all; a rollback
 * brings the PTY back as it was at the checkpoint (same pid, the transcript
 * cut back to that instant: the next read says `rewound`); a fork has its own
 * copy. A PTY started after the checkpoint is gone after the rollback: its
 * handle reports it ended, with `reason: 'rolled-back'`.
 */
import { CommandAbortedError, InvalidArgumentError, InvalidStateError, LockstepError } from '../errors.js';
import { sleep } from '../host/proc.js';
import { spawnDetached, validateCommand } from '../instances/commands.js';
import { RELAY_PATH } from '../instances/background-output.js';
import { CommandHandle, inputBytes } from './sandbox-commands.js';
import type { SandboxCore } from './sandbox-core.js';
import {
  dataRecords,
  relayInputs,
  relayReady,
  resizeRecord,
  timelineOf,
  type FifoAddress,
} from '../instances/relay.js';

/** At most this many entries of PTY_DIR are read to list the PTYs (three per PTY: about 680 PTYs). */
export const MAX_PTY_ENTRIES_LISTED = 2048;

export const PTY_DIR = '/run/lockstep/pty';
/** Most bytes one output() call returns; a reader behind by more reads again. */
export const MAX_PTY_READ_BYTES = 1 << 20;
const POLL_MS = 50;
const DEFAULT_CMD = ['/bin/sh', '-i'];

/** Options of pty.create. */
export interface PtyCreateOptions {
  cols: number;
  rows: number;
  /** Default /bin/sh -i; a string runs through /bin/sh -c. */
  cmd?: string | string[] | undefined;
  /** TERM defaults to xterm-256color. */
  envs?: Record<string, string> | undefined;
  cwd?: string | undefined;
  /** Called with the terminal's output as it comes, until the process ends (see PtyHandle.follow). */
  onData?: ((data: Uint8Array) => void) | undefined;
}

/** New terminal output since an offset. */
export interface PtyOutput {
  data: Buffer;
  /** Where to continue from. */
  offset: number;
  /** The transcript was shorter than the offset asked for (a rollback cut it back): data starts at 0. */
  rewound: boolean;
  running: boolean;
}

/** How a PTY ended. */
export interface PtyExit {
  /** The command's exit code (128+N for signal N); null when it left none. */
  exitCode: number | null;
  /**
   * exited: the command ended (exitCode set); killed: the relay was killed
   * (kill()) before the command reported; rolled-back: the sandbox went back
   * to a checkpoint taken before this PTY started, so it is not in this
   * timeline.
   */
  reason: 'exited' | 'killed' | 'rolled-back';
}

function dimension(field: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535)
    throw new InvalidArgumentError(field, 'an integer from 1 to 65535', v);
  return v;
}

/** Terminals of one sandbox. */
export class SandboxPty {
  constructor(private readonly sandbox: SandboxCore) {}

  /** Starts cmd on a new terminal of the sandbox's own and returns its handle (id: the relay's pid). */
  async create(opts: PtyCreateOptions): Promise<PtyHandle> {
    if (typeof opts !== 'object' || opts === null) throw new InvalidArgumentError('options', '{cols, rows}', opts);
    const cols = dimension('cols', opts.cols);
    const rows = dimension('rows', opts.rows);
    const argv =
      opts.cmd === undefined ? DEFAULT_CMD : typeof opts.cmd === 'string' ? ['/bin/sh', '-c', opts.cmd] : opts.cmd;
    if (typeof opts.cmd === 'string' && opts.cmd.trim() === '')
      throw new InvalidArgumentError('cmd', 'a non-empty command', opts.cmd);
    validateCommand(argv, { cwd: opts.cwd, env: opts.envs });
    if (opts.onData !== undefined && typeof opts.onData !== 'function')
      throw new InvalidArgumentError('onData', 'a function', opts.onData);
    const env = { TERM: 'xterm-256color', ...(opts.envs ?? {}) };
    const pid = await spawnDetached(
      this.sandbox.enterTarget(),
      [RELAY_PATH, 'pty', String(cols), String(rows), '--', ...argv],
      { cwd: opts.cwd, env },
    );
    const handle = new PtyHandle(this.sandbox, pid);
    // Reachable by id (connect, the HTTP routes) once this returns.
    const files = this.sandbox.files();
    await relayReady(
      // Its own FIFO by name (one lstat): never a listing of a folder the sandbox can fill.
      async () => (await files.typeOf(`${PTY_DIR}/${pid}.in`).catch(() => undefined)) !== undefined,
      () => handle.isRunning(),
    );
    if (opts.onData) void handle.follow(opts.onData).catch(() => undefined);
    return handle;
  }

  /** Reattaches to a PTY of this sandbox by its id (from create or list). */
  async connect(pid: number): Promise<PtyHandle> {
    if (!Number.isInteger(pid) || pid < 1) throw new InvalidArgumentError('pid', 'the id of a PTY', pid);
    if ((await this.sandbox.files().typeOf(`${PTY_DIR}/${pid}.out`)) !== 'file')
      throw new InvalidArgumentError('pid', 'the id of a PTY of this sandbox', pid);
    return new PtyHandle(this.sandbox, pid);
  }

  /** The PTYs of this sandbox (every one with a transcript), oldest id first. */
  async list(): Promise<{ pid: number; running: boolean; exitCode: number | null }[]> {
    const out = [];
    for (const pid of await this.pids()) {
      const h = new PtyHandle(this.sandbox, pid);
      const running = h.isRunning();
      out.push({ pid, running, exitCode: running ? null : await h.exitCode() });
    }
    return out;
  }

  /**
   * Ids of the PTYs with a transcript, from at most MAX_PTY_ENTRIES_LISTED
   * entries of the folder (inside the sandbox, which can plant any number of
   * files there); past the bound the others are still reachable by id.
   */
  private async pids(): Promise<number[]> {
    let entries;
    try {
      entries = (await this.sandbox.files().listSome(PTY_DIR, MAX_PTY_ENTRIES_LISTED)).entries;
    } catch (e) {
      if (e instanceof LockstepError && e.code === 'FILE_NOT_FOUND') return [];
      throw e;
    }
    const pids = new Set<number>();
    for (const e of entries) {
      const m = /^([1-9][0-9]{0,8})\.out$/.exec(e.name);
      if (m && e.type === 'file') pids.add(Number(m[1]));
    }
    return [...pids].sort((a, b) => a - b);
  }
}

/** One PTY: write to it, resize it, read its output by offsets, wait for it or kill it. */
export class PtyHandle {
  private readonly process: CommandHandle;
  /** The sandbox's process tree when the handle was made: another one later means a rollback happened in between. */
  private readonly timeline: string;

  constructor(
    private readonly sandbox: SandboxCore,
    /** The PTY's id: the relay's pid inside the sandbox. */
    readonly pid: number,
  ) {
    this.process = new CommandHandle(sandbox, pid);
    this.timeline = timelineOf(sandbox.row());
  }

  private address(): FifoAddress {
    const row = this.sandbox.runningRow();
    return {
      key: `${timelineOf(row)}:pty:${this.pid}`,
      root: this.sandbox.engine.paths.sandboxRoot(row.instance),
      path: `${PTY_DIR.slice(1)}/${this.pid}.in`,
      running: () => this.isRunning(),
    };
  }

  private notRunning(): InvalidStateError {
    return new InvalidStateError('STDIN_CLOSED', `PTY ${this.pid} is not running`, { pid: this.pid });
  }

  isRunning(): boolean {
    return this.process.isRunning();
  }

  /** Sends bytes (text as UTF-8) to the terminal, as typed keys; STDIN_FULL while the program is not reading. */
  async write(data: string | Uint8Array): Promise<void> {
    const bytes = inputBytes('data', data);
    if (!this.isRunning()) throw this.notRunning();
    await relayInputs(this.sandbox.engine).send(this.address(), dataRecords(bytes));
  }

  /** Sets the terminal's size; the program gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    const c = dimension('cols', cols);
    const r = dimension('rows', rows);
    if (!this.isRunning()) throw this.notRunning();
    await relayInputs(this.sandbox.engine).send(this.address(), resizeRecord(c, r));
  }

  /** Terminal output from byte `from` (default 0) of the transcript, at most MAX_PTY_READ_BYTES. */
  async output(from = 0): Promise<PtyOutput> {
    if (!Number.isSafeInteger(from) || from < 0) throw new InvalidArgumentError('offset', 'a byte offset', from);
    const running = this.isRunning();
    let r: { content: Buffer; size: number };
    try {
      r = await this.sandbox.files().readFrom(`${PTY_DIR}/${this.pid}.out`, from, MAX_PTY_READ_BYTES);
    } catch (e) {
      // Gone with a rollback to before the PTY started: nothing to read in this timeline.
      if (e instanceof LockstepError && e.code === 'FILE_NOT_FOUND')
        return { data: Buffer.alloc(0), offset: 0, rewound: from > 0, running };
      throw e;
    }
    if (r.size < from) {
      const again = await this.sandbox.files().readFrom(`${PTY_DIR}/${this.pid}.out`, 0, MAX_PTY_READ_BYTES);
      return { data: again.content, offset: again.content.length, rewound: true, running };
    }
    return { data: r.content, offset: from + r.content.length, rewound: false, running };
  }

  /**
   * Calls onData with the output from `from` on as it comes (polling the
   * transcript), until the PTY has ended and everything was read, or the
   * signal aborts; resolves with how it ended. After a rollback, `onRewound`
   * is told, and the output starts again from the checkpoint's transcript.
   */
  async follow(
    onData: (data: Uint8Array) => void,
    opts: { from?: number; signal?: AbortSignal; onRewound?: () => void } = {},
  ): Promise<PtyExit> {
    let offset = opts.from ?? 0;
    for (;;) {
      if (opts.signal?.aborted) throw new CommandAbortedError('COMMAND_ABORTED', `Stopped following PTY ${this.pid}`);
      const r = await this.output(offset);
      if (r.rewound) opts.onRewound?.();
      if (r.data.length > 0) onData(r.data);
      offset = r.offset;
      if (r.data.length === MAX_PTY_READ_BYTES) continue;
      if (!r.running) {
        // The relay writes the transcript before it exits: one last read has it all.
        const last = await this.output(offset);
        if (last.data.length > 0) onData(last.data);
        return this.wait();
      }
      await sleep(POLL_MS);
    }
  }

  /** The exit code the relay recorded, or null. */
  async exitCode(): Promise<number | null> {
    try {
      const { content } = await this.sandbox.files().read(`${PTY_DIR}/${this.pid}.exit`, { maxBytes: 64 });
      const text = content.toString().trim();
      return /^[0-9]{1,3}$/.test(text) ? Number(text) : null;
    } catch {
      return null;
    }
  }

  /** Resolves when the PTY has ended, with how. */
  async wait(opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<PtyExit> {
    await this.process.exited(opts, `PTY ${this.pid}`);
    const exitCode = await this.exitCode();
    if (exitCode !== null) return { exitCode, reason: 'exited' };
    const rolledBack = timelineOf(this.sandbox.row()) !== this.timeline && !(await this.hasTranscript());
    return { exitCode: null, reason: rolledBack ? 'rolled-back' : 'killed' };
  }

  private async hasTranscript(): Promise<boolean> {
    try {
      await this.sandbox.files().readFrom(`${PTY_DIR}/${this.pid}.out`, 0, 0);
      return true;
    } catch {
      return false;
    }
  }

  /** Kills the PTY's relay and with it the program (it dies with its relay). False if it had already ended. */
  async kill(): Promise<boolean> {
    return this.process.kill('SIGKILL');
  }
}
