/**
 * CLI output: stable JSON with --json, readable text otherwise; colour only
 * on a terminal and never when NO_COLOR or CI is set. Exit codes are
 * documented in docs/cli.md, "Exit codes".
 */
import { LockstepError, type ErrorCode } from '../errors.js';
import { envValue } from '../config.js';

export const EXIT = {
  ok: 0,
  failure: 1,
  usage: 2,
  notFound: 3,
  conflict: 4,
  host: 5,
} as const;

export const useColor = () => process.stdout.isTTY === true && !envValue('NO_COLOR') && !envValue('CI');

export function printJson(value: unknown): void {
  process.stdout.write(JSON.stringify(value, null, 2) + '\n');
}

/** A usage error (bad flags, missing arguments). */
export class UsageError extends LockstepError {
  constructor(message: string) {
    super('USAGE', message);
  }
}

/** An exit code of the CLI (docs/cli.md, "Exit codes"). */
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/**
 * The exit code of every error code, in one table the compiler keeps
 * complete (a new ErrorCode does not build until it has an exit code here),
 * grouped as the "Exit codes" table of docs/cli.md lists them.
 */
export const EXIT_CODE = {
  // 2: bad usage or input
  USAGE: EXIT.usage,
  INVALID_ARGUMENT: EXIT.usage,
  INVALID_JSON: EXIT.usage,
  BAD_REQUEST: EXIT.usage,
  PATH_ESCAPES_SANDBOX: EXIT.usage,
  CONTEXT_FORMAT_UNSUPPORTED: EXIT.usage,
  FILE_TYPE_NOT_SUPPORTED: EXIT.usage,
  FILE_TOO_LARGE: EXIT.usage,
  PAYLOAD_TOO_LARGE: EXIT.usage,
  UNSUPPORTED_MEDIA_TYPE: EXIT.usage,
  LIMIT_UNSUPPORTED: EXIT.usage,
  CONFIG_INVALID: EXIT.usage,

  // 3: not found
  SANDBOX_NOT_FOUND: EXIT.notFound,
  IMAGE_NOT_FOUND: EXIT.notFound,
  CHECKPOINT_NOT_FOUND: EXIT.notFound,
  EFFECT_NOT_FOUND: EXIT.notFound,
  OBSERVATION_NOT_FOUND: EXIT.notFound,
  CONTEXT_NOT_FOUND: EXIT.notFound,
  LAYER_NOT_FOUND: EXIT.notFound,
  TENANT_NOT_FOUND: EXIT.notFound,
  FILE_NOT_FOUND: EXIT.notFound,
  ROUTE_NOT_FOUND: EXIT.notFound,
  DOCKER_IMAGE_NOT_FOUND: EXIT.notFound,
  MCP_SESSION_NOT_FOUND: EXIT.notFound,
  BUNDLE_NOT_FOUND: EXIT.notFound,
  SNAPSHOT_NOT_FOUND: EXIT.notFound,
  EXPOSURE_NOT_FOUND: EXIT.notFound,

  // 4: conflict with the current state (exists, busy, in use, not running, refused)
  IMAGE_EXISTS: EXIT.conflict,
  TENANT_EXISTS: EXIT.conflict,
  SANDBOX_BUSY: EXIT.conflict,
  SANDBOX_NOT_RUNNING: EXIT.conflict,
  STDIN_FULL: EXIT.conflict,
  STDIN_CLOSED: EXIT.conflict,
  IMAGE_IN_USE: EXIT.conflict,
  TENANT_HAS_SANDBOXES: EXIT.conflict,
  FILE_BUSY: EXIT.conflict,
  HOME_LOCKED: EXIT.conflict,
  CHECKPOINT_DAMAGED: EXIT.conflict,
  CHECKPOINT_CORRUPT: EXIT.conflict,
  IMAGE_BUILDING: EXIT.conflict,
  BUNDLE_CORRUPT: EXIT.conflict,
  SNAPSHOT_EXISTS: EXIT.conflict,
  SNAPSHOT_BUSY: EXIT.conflict,
  SNAPSHOT_INCOMPATIBLE: EXIT.conflict,
  PULL_SOURCE_NOT_ALLOWED: EXIT.conflict,
  BUNDLE_UNTRUSTED: EXIT.conflict,
  STORE_NOT_CONFIGURED: EXIT.failure,
  NETWORK_NOT_ALLOWED: EXIT.conflict,
  PORT_NOT_LISTENING: EXIT.conflict,
  EFFECT_OUTCOME_UNKNOWN: EXIT.conflict,
  EFFECT_NOT_UNKNOWN: EXIT.conflict,
  EFFECT_NOT_COMPENSABLE: EXIT.conflict,
  EFFECT_ALREADY_SETTLED: EXIT.conflict,
  ROLLBACK_REFUSED_IRREVERSIBLE: EXIT.conflict,
  IDEMPOTENCY_KEY_CONFLICT: EXIT.conflict,
  IDEMPOTENCY_KEY_IN_PROGRESS: EXIT.conflict,
  IDEMPOTENCY_KEY_REUSED: EXIT.conflict,
  LANGGRAPH_SANDBOX_DIVERGED: EXIT.conflict,
  LANGGRAPH_CONTEXT_MISSING: EXIT.conflict,
  QUOTA_EXCEEDED: EXIT.conflict,
  RATE_LIMITED: EXIT.conflict,

  // 5: the host (not set up, CRIU, the kernel, privileges, the supervisor and helper)
  NOT_ROOT: EXIT.host,
  UNSUPPORTED_PLATFORM: EXIT.host,
  NATIVE_NOT_BUILT: EXIT.host,
  NATIVE_LOAD_FAILED: EXIT.host,
  NATIVE_BUILD_FAILED: EXIT.host,
  HOST_PROVISIONING_FAILED: EXIT.host,
  CATALOG_TOO_NEW: EXIT.host,
  AGENT_STATE_SCHEMA_TOO_NEW: EXIT.host,
  HOME_NOT_SEARCHABLE: EXIT.host,
  ID_RANGES_EXHAUSTED: EXIT.host,
  CRIU_NOT_INSTALLED: EXIT.host,
  CRIU_TOO_OLD: EXIT.host,
  CRIU_UNAVAILABLE: EXIT.host,
  CRIU_CHECK_FAILED: EXIT.host,
  CRIU_DUMP_FAILED: EXIT.host,
  CRIU_RESTORE_FAILED: EXIT.host,
  SUPERVISOR_TIMEOUT: EXIT.host,
  SUPERVISOR_START_FAILED: EXIT.host,
  SUPERVISOR_UNREACHABLE: EXIT.host,
  HELPER_NO_ANSWER: EXIT.host,
  HELPER_FAILED: EXIT.host,
  SANDBOX_INIT_DIED: EXIT.host,
  SANDBOX_ENTER_FAILED: EXIT.host,
  OVERLAY_MOUNT_FAILED: EXIT.host,
  DEV_FOLDER_FAILED: EXIT.host,
  LAYER_STORE_FAILED: EXIT.host,
  LAYER_STORE_MOUNT_FAILED: EXIT.host,
  BTRFS_UNAVAILABLE: EXIT.host,
  DISK_QUOTA_UNAVAILABLE: EXIT.host,
  DISK_FULL: EXIT.host,
  CGROUP_UNAVAILABLE: EXIT.host,
  NETWORK_SETUP_FAILED: EXIT.host,
  NETWORK_ADDRESSES_EXHAUSTED: EXIT.host,
  CGROUP_CONTROLLERS: EXIT.host,
  CGROUP_TIMEOUT: EXIT.host,

  // 1: any other failure (a command or fork that did not finish, a build, the client's transport, a bug)
  UNAUTHENTICATED: EXIT.failure,
  COMMAND_TIMEOUT: EXIT.failure,
  PORT_UNREACHABLE: EXIT.failure,
  COMMAND_ABORTED: EXIT.failure,
  FORK_ABORTED: EXIT.failure,
  FORK_FAILED: EXIT.failure,
  SERVER_SHUTTING_DOWN: EXIT.failure,
  DISK_QUOTA_EXCEEDED: EXIT.failure,
  MANAGER_CLOSED: EXIT.failure,
  DOCKER_IMPORT_FAILED: EXIT.failure,
  IMAGE_BUILD_FAILED: EXIT.failure,
  FILE_ACCESS_FAILED: EXIT.failure,
  CONNECTION_FAILED: EXIT.failure,
  REQUEST_ABORTED: EXIT.failure,
  TRANSFER_ABORTED: EXIT.failure,
  STORE_UNAVAILABLE: EXIT.failure,
  INTERNAL: EXIT.failure,
} as const satisfies Record<ErrorCode, ExitCode>;

/**
 * The exit code for an error: its code's, or 1 for anything that is not a
 * LockstepError (or carries a code this version does not know, as a newer
 * server's may: never 0 for a failure).
 */
export function exitCodeFor(e: unknown): ExitCode {
  if (!(e instanceof LockstepError)) return EXIT.failure;
  return (EXIT_CODE as Record<string, ExitCode | undefined>)[e.code] ?? EXIT.failure;
}

export function reportError(e: unknown, json: boolean): number {
  const code = exitCodeFor(e);
  if (json) {
    const err =
      e instanceof LockstepError
        ? e.toJSON()
        : { name: (e as Error)?.name ?? 'Error', code: 'INTERNAL', message: String((e as Error)?.message ?? e) };
    process.stdout.write(JSON.stringify({ error: err }, null, 2) + '\n');
  } else {
    const msg = e instanceof Error ? e.message : String(e);
    process.stderr.write(`lockstep: ${msg}\n`);
    if (!(e instanceof LockstepError) && envValue('LOCKSTEP_DEBUG')) process.stderr.write(`${(e as Error).stack}\n`);
  }
  return code;
}

/** Left-aligned text table. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (c ?? '').padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** Progress on stderr: a spinner on a terminal, plain lines otherwise. */
export class Progress {
  private timer: NodeJS.Timeout | undefined;
  private text = '';
  private frame = 0;
  private readonly tty = process.stderr.isTTY === true && !envValue('CI');
  /** ttyOnly: for short operations, draw on a terminal but print nothing to a pipe or log. */
  constructor(
    private readonly quiet = false,
    private readonly opts: { ttyOnly?: boolean } = {},
  ) {}
  update(text: string): void {
    if (this.quiet) return;
    this.text = text;
    if (!this.tty) {
      if (!this.opts.ttyOnly) process.stderr.write(`${text}\n`);
      return;
    }
    if (!this.timer) {
      this.timer = setInterval(() => this.draw(), 80);
      this.timer.unref();
    }
    this.draw();
  }
  private draw(): void {
    const frames = '⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏';
    process.stderr.write(
      `\r\x1b[2K${frames[this.frame++ % frames.length]} ${this.text.slice(0, (process.stderr.columns ?? 80) - 3)}`,
    );
  }
  done(text?: string): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.tty && !this.quiet) process.stderr.write('\r\x1b[2K');
    if (text && !this.quiet) process.stderr.write(`${text}\n`);
  }
}
