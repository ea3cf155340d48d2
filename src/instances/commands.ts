/**
 * Running commands inside a sandbox through `lockstep-helper enter`: the
 * helper joins the sandbox's cgroup and namespaces, then runs the command in
 * the foreground (stdout/stderr piped back, exit code returned) or detached
 * as a child of the sandbox's init, so that checkpoints capture it.
 *
 * Teardown on timeout or abort escalates like execa's forceKillAfterDelay:
 * SIGTERM to the command's process group, then SIGKILL to the group, then
 * SIGKILL to the helper.
 */
import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { helperPath } from '../native/binding.js';
import { COMMAND_TIMEOUT_MAX_MS } from '../limits.js';
import {
  ENTER_ARGS,
  REQUEST_FD,
  STATUS_FD,
  encodeVerbRequest,
  enterTokens,
  parseErrorLine,
} from '../host/helper-protocol.js';
import {
  CommandAbortedError,
  InvalidArgumentError,
  InvalidStateError,
  SystemCallError,
  type NativeErrorLike,
} from '../errors.js';

export interface RunOptions {
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
  timeoutMs?: number | undefined;
  signal?: AbortSignal | undefined;
  onStdout?: ((chunk: string) => void) | undefined;
  onStderr?: ((chunk: string) => void) | undefined;
  /** Bytes kept per stream; the rest is dropped and `truncated` set. */
  maxOutputBytes?: number | undefined;
  /** Grace period between SIGTERM and SIGKILL. */
  killAfterMs?: number | undefined;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  /** Signal that ended the command, if any (e.g. SIGKILL from the OOM killer). */
  signal?: string | undefined;
  truncated: boolean;
  durationMs: number;
}

/** Which sandbox to enter: its init by pid and start time, so a reused pid is never joined. */
export interface EnterTarget {
  sandboxId: string;
  initPid: number;
  initStart: number;
  cgroupProcs: string[];
  baseEnv: Record<string, string>;
}

const DEFAULT_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  LANG: 'C.UTF-8',
};
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_DEFAULT_OUTPUT = 16 * 1024 * 1024;

/** Validates argv/env/cwd at the edge with messages that name the field. */
export function validateCommand(
  argv: unknown,
  opts: { cwd?: unknown; env?: unknown; timeoutMs?: unknown } = {},
): string[] {
  if (!Array.isArray(argv) || argv.length === 0)
    throw new InvalidArgumentError('command', 'a non-empty array of strings', argv);
  argv.forEach((a, i) => {
    if (typeof a !== 'string') throw new InvalidArgumentError(`command[${i}]`, 'a string', a);
    if (a.includes('\0')) throw new InvalidArgumentError(`command[${i}]`, 'a string without NUL bytes', a);
  });
  if ((argv[0] as string).length === 0)
    throw new InvalidArgumentError('command[0]', 'a non-empty program name', argv[0]);
  if (
    opts.cwd !== undefined &&
    (typeof opts.cwd !== 'string' || !opts.cwd.startsWith('/') || opts.cwd.includes('\0'))
  ) {
    throw new InvalidArgumentError('cwd', 'an absolute path inside the sandbox', opts.cwd);
  }
  if (opts.env !== undefined) {
    if (typeof opts.env !== 'object' || opts.env === null || Array.isArray(opts.env))
      throw new InvalidArgumentError('env', 'an object of string values', opts.env);
    for (const [k, v] of Object.entries(opts.env)) {
      if (!ENV_KEY.test(k)) throw new InvalidArgumentError(`env.${k}`, 'a name of letters, digits and "_"', k);
      if (typeof v !== 'string' || v.includes('\0'))
        throw new InvalidArgumentError(`env.${k}`, 'a string without NUL bytes', v);
    }
  }
  if (
    opts.timeoutMs !== undefined &&
    (typeof opts.timeoutMs !== 'number' ||
      !Number.isInteger(opts.timeoutMs) ||
      opts.timeoutMs < 1 ||
      opts.timeoutMs > COMMAND_TIMEOUT_MAX_MS)
  ) {
    throw new InvalidArgumentError('timeoutMs', 'an integer number of milliseconds from 1 to 24 hours', opts.timeoutMs);
  }
  return argv as string[];
}

function envArgs(target: EnterTarget, env: Record<string, string> | undefined): string[] {
  const merged = { ...DEFAULT_ENV, ...target.baseEnv, ...(env ?? {}) };
  return Object.entries(merged).flatMap(([k, v]) => ['--env', `${k}=${v}`]);
}

/**
 * Starts `lockstep-helper enter` with the request written to a pipe: argv
 * holds only the verb. stdio[STATUS_FD] is the status pipe, stdio[REQUEST_FD]
 * the request (helper-protocol.ts).
 */
function spawnEnter(
  target: EnterTarget,
  options: string[],
  argv: string[],
  stdio: ['ignore', 'pipe' | 'ignore', 'pipe'],
) {
  const request = encodeVerbRequest(
    enterTokens({
      initPid: target.initPid,
      initStart: target.initStart,
      cgroupProcs: target.cgroupProcs,
      options,
      argv,
    }),
  );
  const child = spawn(helperPath, [...ENTER_ARGS], { stdio: [...stdio, 'pipe', 'pipe'] });
  const pipe = child.stdio[REQUEST_FD] as Writable;
  pipe.on('error', () => undefined); // the helper exited before reading it all: its status says why
  // Once flushed, the bytes wait in the helper's end: close ours, so the handle keeps nothing alive.
  pipe.end(request, () => pipe.destroy());
  return child;
}

/** The helper could not pin the sandbox's init (it exited, or its pid now belongs to another process). */
function notRunning(target: EnterTarget): InvalidStateError {
  return new InvalidStateError(
    'SANDBOX_NOT_RUNNING',
    `Sandbox ${target.sandboxId} is not running (its init has exited)`,
    { sandboxId: target.sandboxId },
  );
}

class Collector {
  chunks: Buffer[] = [];
  size = 0;
  truncated = false;
  constructor(private readonly max: number) {}
  push(b: Buffer) {
    if (this.size >= this.max) {
      this.truncated = true;
      return;
    }
    const room = this.max - this.size;
    const part = b.length > room ? b.subarray(0, room) : b;
    if (part.length < b.length) this.truncated = true;
    this.chunks.push(part);
    this.size += part.length;
  }
  text() {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

/** Runs argv in the foreground inside the sandbox. */
export function runCommand(target: EnterTarget, argv: string[], opts: RunOptions = {}): Promise<RunResult> {
  const started = performance.now();
  const child = spawnEnter(target, ['--cwd', opts.cwd ?? '/workspace', ...envArgs(target, opts.env)], argv, [
    'ignore',
    'pipe',
    'pipe',
  ]);
  const max = opts.maxOutputBytes ?? MAX_DEFAULT_OUTPUT;
  const out = new Collector(max);
  const err = new Collector(max);
  let status = '';
  // Chunks split UTF-8 characters anywhere; a decoder per stream carries the
  // partial bytes over, so streamed text is the same as the collected text.
  const outText = new StringDecoder('utf8');
  const errText = new StringDecoder('utf8');
  const emit = (fn: ((chunk: string) => void) | undefined, text: string) => {
    if (fn && text) fn(text);
  };
  child.stdout!.on('data', (b: Buffer) => {
    out.push(b);
    emit(opts.onStdout, outText.write(b));
  });
  child.stderr!.on('data', (b: Buffer) => {
    err.push(b);
    emit(opts.onStderr, errText.write(b));
  });
  (child.stdio[STATUS_FD] as Readable).on('data', (b: Buffer) => (status += b.toString('utf8')));

  return new Promise((resolve, reject) => {
    let aborted: CommandAbortedError | undefined;
    const timers: NodeJS.Timeout[] = [];
    const killAfter = opts.killAfterMs ?? 2000;
    const stop = (reason: CommandAbortedError) => {
      if (aborted) return;
      aborted = reason;
      child.kill('SIGTERM');
      timers.push(setTimeout(() => child.kill('SIGUSR1'), killAfter));
      timers.push(setTimeout(() => child.kill('SIGKILL'), killAfter + 1000));
    };
    if (opts.timeoutMs) {
      timers.push(
        setTimeout(
          () =>
            stop(
              new CommandAbortedError(
                'COMMAND_TIMEOUT',
                `Command timed out after ${opts.timeoutMs} ms: ${argv.join(' ')}`,
                { timeoutMs: opts.timeoutMs },
              ),
            ),
          opts.timeoutMs,
        ),
      );
    }
    const onAbort = () => stop(new CommandAbortedError('COMMAND_ABORTED', `Command aborted: ${argv.join(' ')}`));
    if (opts.signal?.aborted) onAbort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    child.on('error', (e) => {
      timers.forEach(clearTimeout);
      reject(e);
    });
    // 'close', not 'exit': the helper is the only holder of these pipes (the
    // command writes into pipes of the helper's, which it drains when the
    // command exits), so 'close' comes right after the exit with every byte
    // read, even when a background process keeps the command's pipes open.
    child.on('close', (code, signal) => {
      timers.forEach(clearTimeout);
      opts.signal?.removeEventListener('abort', onAbort);
      emit(opts.onStdout, outText.end());
      emit(opts.onStderr, errText.end());
      if (aborted) return reject(aborted);
      const exitCode = code ?? (signal ? 128 : 125);
      const failure = status.split('\n').map(parseErrorLine).find(Boolean);
      if (failure && failure.syscall === 'identity') return reject(notRunning(target));
      if (failure && failure.syscall === 'chdir') {
        return reject(new InvalidArgumentError('cwd', 'an existing directory inside the sandbox', opts.cwd));
      }
      if (failure && exitCode === 125) {
        return reject(
          new SystemCallError(
            'SANDBOX_ENTER_FAILED',
            `Cannot enter the sandbox: ${failure.syscall} failed: ${failure.code}` +
              (failure.path ? ` (${failure.path})` : ''),
            failure,
          ),
        );
      }
      let stderr = err.text();
      if (failure && failure.syscall === 'execve') {
        const msg = `lockstep: ${argv[0]}: ${failure.message}\n`;
        stderr += msg;
        opts.onStderr?.(msg);
      }
      const sig = exitCode > 128 && exitCode < 160 ? signalName(exitCode - 128) : undefined;
      resolve({
        exitCode,
        stdout: out.text(),
        stderr,
        signal: sig,
        truncated: out.truncated || err.truncated,
        durationMs: performance.now() - started,
      });
    });
  });
}

export interface SpawnOptions {
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
  /** Paths inside the sandbox for the process's output (default /dev/null). */
  stdoutPath?: string | undefined;
  stderrPath?: string | undefined;
}

/** Starts argv detached inside the sandbox (a child of its init); returns its pid inside the sandbox. */
export function spawnDetached(target: EnterTarget, argv: string[], opts: SpawnOptions = {}): Promise<number> {
  for (const [field, p] of [
    ['stdoutPath', opts.stdoutPath],
    ['stderrPath', opts.stderrPath],
  ] as const) {
    if (p !== undefined && (typeof p !== 'string' || !p.startsWith('/')))
      throw new InvalidArgumentError(field, 'an absolute path inside the sandbox', p);
  }
  const options = [
    '--detach',
    '--cwd',
    opts.cwd ?? '/workspace',
    '--stdout',
    opts.stdoutPath ?? '/dev/null',
    '--stderr',
    opts.stderrPath ?? opts.stdoutPath ?? '/dev/null',
    ...envArgs(target, opts.env),
  ];
  const child = spawnEnter(target, options, argv, ['ignore', 'ignore', 'pipe']);
  let status = '';
  let stderr = '';
  (child.stdio[STATUS_FD] as Readable).on('data', (b: Buffer) => (status += b.toString('utf8')));
  child.stderr!.on('data', (b: Buffer) => (stderr += b.toString('utf8')));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    // Settled once the helper has exited and been reaped, not when its status
    // pipe closes: the helper is in the sandbox's cgroup until then, and a
    // refused start must leave no process there (enter.c reaps its own).
    child.on('close', () => {
      const lines = status.split('\n').filter(Boolean);
      const failure = lines.map(parseErrorLine).find(Boolean);
      if (failure) {
        if (failure.syscall === 'identity') return reject(notRunning(target));
        if (failure.syscall === 'execve')
          return reject(new InvalidArgumentError('command[0]', 'a program that exists in the sandbox', argv[0]));
        if (failure.syscall === 'chdir')
          return reject(new InvalidArgumentError('cwd', 'an existing directory inside the sandbox', opts.cwd));
        return reject(
          new SystemCallError(
            'SANDBOX_ENTER_FAILED',
            `Cannot start the process: ${failure.syscall} failed: ${failure.code}` +
              (failure.path ? ` (${failure.path})` : ''),
            failure,
          ),
        );
      }
      const pidLine = lines.map((l) => JSON.parse(l) as { nsPid?: number }).find((o) => o.nsPid);
      if (!pidLine?.nsPid)
        return reject(
          new SystemCallError(
            'SANDBOX_ENTER_FAILED',
            `Cannot start the process: ${stderr.trim() || 'no pid reported'}`,
            new Error(stderr) as NativeErrorLike,
          ),
        );
      resolve(pidLine.nsPid);
    });
  });
}

const SIGNALS: Record<number, string> = {
  1: 'SIGHUP',
  2: 'SIGINT',
  6: 'SIGABRT',
  9: 'SIGKILL',
  11: 'SIGSEGV',
  13: 'SIGPIPE',
  15: 'SIGTERM',
};
function signalName(n: number): string | undefined {
  return SIGNALS[n];
}
