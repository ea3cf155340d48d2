/**
 * The wire format between the manager and `lockstep-helper` (native/helper/),
 * in one place:
 *
 * - A verb's request (`lockstep-helper VERB --request-fd N`): the options
 *   argv would hold, each ending with a NUL, written to a pipe the helper
 *   reads to EOF (main.c's read_request; at most 8 MiB). argv, and so
 *   /proc/<pid>/cmdline, holds only the verb: an enter request carries the
 *   command's environment values.
 * - A supervisor request (supervise.c): one per connection, NUL-separated
 *   tokens ending with an empty token (at most 64 KiB): "run ARGV...",
 *   "daemon LOG ARGV..." or "daemon-isolated LOG ARGV...".
 * - Answers and errors: one JSON object per line on stdout or the status fd;
 *   an error is `{"error":{code, errno, syscall, path?, message}}`, shaped
 *   like Node's SystemError.
 */
import { HostError, InvalidArgumentError, SystemCallError, type NativeErrorLike } from '../errors.js';

/** The fd an enter request is read from (the helper's `--request-fd`). */
export const REQUEST_FD = 4;
/** The fd `helper enter` reports on (`--status-fd`): the command's pid, or why it did not start. */
export const STATUS_FD = 3;

/** Bytes a verb's request may hold: main.c's MAX_REQUEST (8 MiB) less one, which it refuses. */
export const MAX_VERB_REQUEST_BYTES = 8 * 1024 * 1024 - 1;
/** Bytes a supervisor request may hold, final NULs included: supervise.c's REQUEST_MAX less one. */
export const MAX_SUPERVISOR_REQUEST_BYTES = 65536 - 1;

/**
 * A request the helper could not read as meant: a token with a NUL byte, an empty
 * one where it would end the request, or too many bytes.
 */
export class HelperRequestError extends InvalidArgumentError {}

function checkTokens(tokens: readonly string[], what: string, emptyEnds: boolean): void {
  tokens.forEach((t, i) => {
    if (typeof t !== 'string') throw new HelperRequestError(`${what} token ${i}`, 'a string', t);
    if (t.includes('\0')) throw new HelperRequestError(`${what} token ${i}`, 'a string without NUL bytes', t);
    if (emptyEnds && t === '')
      throw new HelperRequestError(`${what} token ${i}`, 'a non-empty string (an empty token ends the request)', t);
  });
}

function checkSize(encoded: string, max: number, what: string): string {
  const bytes = Buffer.byteLength(encoded, 'utf8');
  if (bytes > max) throw new HelperRequestError(what, `at most ${max} bytes`, `${bytes} bytes`);
  return encoded;
}

/** Encodes a verb's request for `--request-fd`: every token followed by a NUL. */
export function encodeVerbRequest(tokens: readonly string[]): string {
  checkTokens(tokens, 'helper request', false);
  return checkSize(tokens.map((t) => t + '\0').join(''), MAX_VERB_REQUEST_BYTES, 'helper request');
}

/** Decodes what encodeVerbRequest wrote (the helper's reading of it; for tests and tools). */
export function decodeVerbRequest(data: string): string[] {
  if (data === '') return [];
  if (!data.endsWith('\0')) throw new HelperRequestError('helper request', 'tokens each ending with a NUL', data);
  return data.slice(0, -1).split('\0');
}

/** Encodes a supervisor request: the tokens, NUL-separated, then an empty token. */
export function encodeSupervisorRequest(tokens: readonly string[]): string {
  checkTokens(tokens, 'supervisor request', true);
  return checkSize(tokens.join('\0') + '\0\0', MAX_SUPERVISOR_REQUEST_BYTES, 'supervisor request');
}

/** Decodes what encodeSupervisorRequest wrote: the tokens before the empty one. */
export function decodeSupervisorRequest(data: string): string[] {
  const end = data.indexOf('\0\0');
  if (end < 0) throw new HelperRequestError('supervisor request', 'tokens ending with an empty token', data);
  return end === 0 ? [] : data.slice(0, end).split('\0');
}

/** What `helper create` needs to start a sandbox's init (runtime.ts fills it from the sandbox's host paths). */
export interface CreateRequest {
  root: string;
  dev: string;
  shm: string;
  hostname: string;
  /** cgroup.procs files the init joins. */
  cgroupProcs: readonly string[];
  /** The user namespace's host id range (null: none). */
  idRange: { base: number; count: number } | null;
}

/** The argv of `helper create` after the program: the verb and its options. */
export function createArgs(o: CreateRequest): string[] {
  return [
    'create',
    '--root',
    o.root,
    '--dev',
    o.dev,
    '--shm',
    o.shm,
    '--hostname',
    o.hostname,
    ...o.cgroupProcs.flatMap((f) => ['--cgroup', f]),
    ...(o.idRange === null ? [] : ['--id-base', String(o.idRange.base), '--id-count', String(o.idRange.count)]),
  ];
}

/** The argv of `helper prepare` after the program. */
export function prepareArgs(dev: string): string[] {
  return ['prepare', '--dev', dev];
}

/** What `helper enter` needs: the init by identity, where to put the command, and the command. */
export interface EnterRequest {
  initPid: number;
  initStart: number;
  cgroupProcs: readonly string[];
  /** Verb options before the cgroups (--cwd, --env K=V, --detach, --stdout, --stderr). */
  options: readonly string[];
  argv: readonly string[];
}

/** The argv of `helper enter`: only the verb and the request fd, so no option shows in /proc/<pid>/cmdline. */
export const ENTER_ARGS: readonly string[] = ['enter', '--request-fd', String(REQUEST_FD)];

/** The tokens of an enter request, for encodeVerbRequest. */
export function enterTokens(o: EnterRequest): string[] {
  return [
    '--pid',
    String(o.initPid),
    '--start',
    String(o.initStart),
    '--status-fd',
    String(STATUS_FD),
    ...o.options,
    ...o.cgroupProcs.flatMap((f) => ['--cgroup', f]),
    '--',
    ...o.argv,
  ];
}

/** The error of one answer or status line, or undefined (a result, or not JSON). */
export function parseErrorLine(line: string): NativeErrorLike | undefined {
  try {
    const o = JSON.parse(line) as { error?: NativeErrorLike & { message?: string } };
    if (!o.error) return undefined;
    return Object.assign(new Error(o.error.message ?? 'failed'), o.error);
  } catch {
    return undefined;
  }
}

/** A helper's JSON answer (its last line): the result, or its error thrown as HELPER_FAILED. */
export function parseHelperAnswer<T>(text: string, what: string): T {
  const line = text.trim().split('\n').filter(Boolean).pop();
  if (!line) throw new HostError('HELPER_NO_ANSWER', `${what}: the helper exited without an answer`);
  const obj = JSON.parse(line) as { error?: NativeErrorLike & { message?: string } } & T;
  if (obj.error) {
    const e = Object.assign(new Error(obj.error.message ?? 'failed'), obj.error) as NativeErrorLike;
    throw new SystemCallError(
      'HELPER_FAILED',
      `${what}: ${e.syscall} failed: ${e.code} (${e.message})${e.path ? `, path '${e.path}'` : ''}`,
      e,
    );
  }
  return obj;
}
