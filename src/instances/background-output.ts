/**
 * Output of background commands. The /bin/sh wrapper that starts one
 * redirects its stdout and stderr to files named by its pid under
 * OUTPUT_DIR inside the sandbox, so the output is part of the sandbox: a
 * checkpoint captures it with the process, a rollback rewinds both to the
 * same instant (the restored process keeps writing at its restored file
 * offset), and a fork starts with a copy. Readers poll by byte offset; an
 * offset past the end means the file was rewound (rollback), and reading
 * starts again from 0 with `rewound` set.
 *
 * Every byte comes from inside the sandbox: the files are read through the
 * file API (RESOLVE_BENEATH, regular files only), and what is returned is the
 * tenant's own output, never parsed.
 */
import type { SandboxFiles } from './files.js';
import { LockstepError } from '../errors.js';

export const OUTPUT_DIR = '/run/lockstep/out';
export const EXIT_DIR = '/run/lockstep/exit';
/**
 * Output files are read whole (FILE_TOO_LARGE past this); a command that writes
 * more should write to a file of its own.
 */
export const MAX_OUTPUT_BYTES = 16 * 1024 * 1024;

/**
 * FIFOs of the background commands started with stdin: the relay of the
 * command with wrapper pid N reads INPUT_DIR/N.
 */
export const INPUT_DIR = '/run/lockstep/in';
/** The relay inside the sandbox (runtime layer; native/init/lockstep-relay.c). */
export const RELAY_PATH = '/.lockstep/relay';

/**
 * The wrapper: output to OUTPUT_DIR/<pid>.{stdout,stderr}, exit code to
 * EXIT_DIR/<pid>. With stdin, the command runs under the relay, which feeds
 * its stdin from the FIFO INPUT_DIR/<pid> (relay.ts); without, its stdin is
 * /dev/null.
 */
export function backgroundWrapper(argv: string[], opts: { stdin?: boolean | undefined } = {}): string[] {
  const run = opts.stdin ? `${RELAY_PATH} stdin ${INPUT_DIR}/$$ -- "$@"` : '"$@"';
  const dirs = opts.stdin ? `${EXIT_DIR} ${OUTPUT_DIR} ${INPUT_DIR}` : `${EXIT_DIR} ${OUTPUT_DIR}`;
  const script =
    `mkdir -p ${dirs}; exec >${OUTPUT_DIR}/$$.stdout ` + `2>${OUTPUT_DIR}/$$.stderr; ${run}; echo $? > ${EXIT_DIR}/$$`;
  return ['/bin/sh', '-c', script, 'lockstep-bg', ...argv];
}

/**
 * Whether the background command with this pid was started with stdin (its
 * FIFO exists): one lstat of its own name, never a scan of the folder (the
 * sandbox can fill it).
 */
export async function hasInput(files: SandboxFiles, pid: number): Promise<boolean> {
  // A FIFO is of kind 'other'; the writer's open checks that it is one.
  return (await files.typeOf(`${INPUT_DIR}/${pid}`)) === 'other';
}

/** Whether the wrapper of the background command with this pid has made its output file. */
export async function hasOutput(files: SandboxFiles, pid: number): Promise<boolean> {
  return (await files.typeOf(`${OUTPUT_DIR}/${pid}.stdout`)) === 'file';
}

/** Byte offsets into the two output files. */
export interface OutputOffsets {
  stdout: number;
  stderr: number;
}

/** New output since the offsets given. */
export interface OutputChunk {
  stdout: string;
  stderr: string;
  /** Where to continue from. */
  offsets: OutputOffsets;
  /** The files were shorter than the offsets (a rollback rewound them): this chunk starts at 0. */
  rewound: boolean;
}

/** Longest prefix of b that ends on a whole UTF-8 character (the rest is read next time). */
export function wholeUtf8(b: Buffer): Buffer {
  let end = b.length;
  // Step back over at most 3 continuation bytes to the start of the last character.
  let i = end - 1;
  while (i >= 0 && i >= end - 4 && (b[i]! & 0xc0) === 0x80) i--;
  if (i < 0) return b.subarray(0, 0);
  const lead = b[i]!;
  const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  if (end - i < need) end = i;
  return b.subarray(0, end);
}

async function readWhole(files: SandboxFiles, path: string): Promise<{ bytes: Buffer; size: number } | undefined> {
  try {
    const { content } = await files.read(path, { maxBytes: MAX_OUTPUT_BYTES });
    return { bytes: content, size: content.length };
  } catch (e) {
    if (e instanceof LockstepError && e.code === 'FILE_NOT_FOUND') return undefined;
    throw e;
  }
}

/** Reads what the command wrote after `from`. */
export async function readOutput(
  files: SandboxFiles,
  pid: number,
  from: OutputOffsets = { stdout: 0, stderr: 0 },
): Promise<OutputChunk> {
  const [out, err] = await Promise.all([
    readWhole(files, `${OUTPUT_DIR}/${pid}.stdout`),
    readWhole(files, `${OUTPUT_DIR}/${pid}.stderr`),
  ]);
  const rewound = (out?.size ?? 0) < from.stdout || (err?.size ?? 0) < from.stderr;
  const start = rewound ? { stdout: 0, stderr: 0 } : from;
  const take = (f: { bytes: Buffer } | undefined, at: number) => wholeUtf8((f?.bytes ?? Buffer.alloc(0)).subarray(at));
  const o = take(out, start.stdout);
  const e = take(err, start.stderr);
  return {
    stdout: o.toString('utf8'),
    stderr: e.toString('utf8'),
    offsets: { stdout: start.stdout + o.length, stderr: start.stderr + e.length },
    rewound,
  };
}

/**
 * At most this many entries of OUTPUT_DIR are read to list the background
 * commands. The folder is inside the sandbox, which can plant any number of
 * `<n>.stdout` files there (150k made every listing take seconds): past the
 * bound the listing holds the commands among the first entries the
 * directory yields (two per command), and the rest are still reachable by
 * pid (output, wait, kill address a command's own files). 2048 entries are
 * 1024 commands: more than a sandbox keeps unless it plants them.
 */
export const MAX_OUTPUT_ENTRIES_LISTED = 2048;

/**
 * Pids of the background commands this sandbox has output files for, in
 * order, from at most MAX_OUTPUT_ENTRIES_LISTED entries; `truncated` when the
 * folder held more.
 */
export async function backgroundPids(
  files: SandboxFiles,
  maxEntries = MAX_OUTPUT_ENTRIES_LISTED,
): Promise<{ pids: number[]; truncated: boolean }> {
  let listed;
  try {
    listed = await files.listSome(OUTPUT_DIR, maxEntries);
  } catch (e) {
    if (e instanceof LockstepError && e.code === 'FILE_NOT_FOUND') return { pids: [], truncated: false };
    throw e;
  }
  const pids = new Set<number>();
  for (const e of listed.entries) {
    const m = /^([1-9][0-9]{0,8})\.stdout$/.exec(e.name);
    if (m && e.type === 'file') pids.add(Number(m[1]));
  }
  return { pids: [...pids].sort((a, b) => a - b), truncated: listed.truncated };
}
