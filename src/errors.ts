/**
 * Typed errors. Every error Lockstep throws is a LockstepError with a stable
 * string `code`; callers branch on `code`, never on the message. The original
 * failure (a native SystemError, a CRIU log, an SQLite error) is kept as `cause`.
 */

/**
 * Every code Lockstep reports, thrown or in an answer body. A new code goes
 * here first: src/http/errors.ts must then give it a status (the compiler
 * checks), and test/unit/error-codes.test.ts checks that every code thrown in
 * src/ is listed.
 */
export const ERROR_CODES = [
  // Bad input
  'INVALID_ARGUMENT',
  'INVALID_JSON',
  'BAD_REQUEST',
  'USAGE',
  'PATH_ESCAPES_SANDBOX',
  'CONTEXT_FORMAT_UNSUPPORTED',
  'FILE_TYPE_NOT_SUPPORTED',
  'FILE_TOO_LARGE',
  'PAYLOAD_TOO_LARGE',
  'UNSUPPORTED_MEDIA_TYPE',
  'LIMIT_UNSUPPORTED',
  'QUOTA_EXCEEDED',
  // Too much in flight at once for one tenant or for the manager (Retry-After says when to try again)
  'RATE_LIMITED',
  'UNAUTHENTICATED',
  // Not found
  'SANDBOX_NOT_FOUND',
  'IMAGE_NOT_FOUND',
  'CHECKPOINT_NOT_FOUND',
  'EFFECT_NOT_FOUND',
  'OBSERVATION_NOT_FOUND',
  'CONTEXT_NOT_FOUND',
  'LAYER_NOT_FOUND',
  'TENANT_NOT_FOUND',
  'FILE_NOT_FOUND',
  'ROUTE_NOT_FOUND',
  'DOCKER_IMAGE_NOT_FOUND',
  'BUNDLE_NOT_FOUND',
  'SNAPSHOT_NOT_FOUND',
  'EXPOSURE_NOT_FOUND',
  // Conflicts with the current state
  'IMAGE_EXISTS',
  'TENANT_EXISTS',
  'SANDBOX_BUSY',
  'SANDBOX_NOT_RUNNING',
  'IMAGE_IN_USE',
  'TENANT_HAS_SANDBOXES',
  'NETWORK_NOT_ALLOWED',
  'FILE_BUSY',
  'CHECKPOINT_DAMAGED',
  'EFFECT_OUTCOME_UNKNOWN',
  'EFFECT_NOT_UNKNOWN',
  'EFFECT_NOT_COMPENSABLE',
  'EFFECT_ALREADY_SETTLED',
  'ROLLBACK_REFUSED_IRREVERSIBLE',
  'IDEMPOTENCY_KEY_CONFLICT',
  'IDEMPOTENCY_KEY_IN_PROGRESS',
  'IDEMPOTENCY_KEY_REUSED',
  'AGENT_STATE_SCHEMA_TOO_NEW',
  'LANGGRAPH_SANDBOX_DIVERGED',
  'LANGGRAPH_CONTEXT_MISSING',
  'CGROUP_TIMEOUT',
  'STDIN_FULL',
  'STDIN_CLOSED',
  'SNAPSHOT_EXISTS',
  'SNAPSHOT_BUSY',
  // An exposed port that nothing in the sandbox listens on
  'PORT_NOT_LISTENING',
  // Snapshot bundles that cannot be imported here
  'SNAPSHOT_INCOMPATIBLE',
  'BUNDLE_CORRUPT',
  'BUNDLE_UNTRUSTED',
  'PULL_SOURCE_NOT_ALLOWED',
  'STORE_NOT_CONFIGURED',
  // Commands and forks that did not finish
  'COMMAND_TIMEOUT',
  'COMMAND_ABORTED',
  'FORK_ABORTED',
  'FORK_FAILED',
  'SERVER_SHUTTING_DOWN',
  'IMAGE_BUILDING',
  // Disk
  'DISK_QUOTA_EXCEEDED',
  'DISK_FULL',
  // The host is not set up (`lockstep setup` fixes most)
  'NATIVE_NOT_BUILT',
  'NATIVE_LOAD_FAILED',
  'NATIVE_BUILD_FAILED',
  'UNSUPPORTED_PLATFORM',
  'CRIU_NOT_INSTALLED',
  'HOST_PROVISIONING_FAILED',
  'CATALOG_TOO_NEW',
  'CONFIG_INVALID',
  // The host or the manager failed
  'NOT_ROOT',
  'HOME_LOCKED',
  'MANAGER_CLOSED',
  'CRIU_TOO_OLD',
  'CRIU_UNAVAILABLE',
  'CRIU_CHECK_FAILED',
  'CRIU_DUMP_FAILED',
  'CRIU_RESTORE_FAILED',
  'SUPERVISOR_TIMEOUT',
  'SUPERVISOR_START_FAILED',
  'HELPER_NO_ANSWER',
  'HELPER_FAILED',
  'SANDBOX_INIT_DIED',
  'SANDBOX_ENTER_FAILED',
  'OVERLAY_MOUNT_FAILED',
  'DEV_FOLDER_FAILED',
  'LAYER_STORE_FAILED',
  'LAYER_STORE_MOUNT_FAILED',
  'BTRFS_UNAVAILABLE',
  'DISK_QUOTA_UNAVAILABLE',
  'CGROUP_UNAVAILABLE',
  'CGROUP_CONTROLLERS',
  'DOCKER_IMPORT_FAILED',
  'IMAGE_BUILD_FAILED',
  'FILE_ACCESS_FAILED',
  'CHECKPOINT_CORRUPT',
  'STORE_UNAVAILABLE',
  'TRANSFER_ABORTED',
  'SUPERVISOR_UNREACHABLE',
  'HOME_NOT_SEARCHABLE',
  'ID_RANGES_EXHAUSTED',
  'NETWORK_ADDRESSES_EXHAUSTED',
  'NETWORK_SETUP_FAILED',
  'MCP_SESSION_NOT_FOUND',
  'CONNECTION_FAILED',
  'REQUEST_ABORTED',
  // A proxied request the sandbox did not accept or answer in time (or answered with something that is not HTTP)
  'PORT_UNREACHABLE',
  'INTERNAL',
] as const;

/** A stable error code (see ERROR_CODES). */
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Kinds of things NotFoundError names; each has a `<KIND>_NOT_FOUND` code. */
export type NotFoundKind =
  | 'sandbox'
  | 'image'
  | 'checkpoint'
  | 'effect'
  | 'observation'
  | 'context'
  | 'layer'
  | 'tenant'
  | 'bundle'
  | 'snapshot'
  | 'exposure';
/** Kinds of things AlreadyExistsError names; each has a `<KIND>_EXISTS` code. */
export type ExistingKind = 'image' | 'tenant' | 'snapshot';

/**
 * The brand every LockstepError carries: the names of its class and of each
 * parent up to LockstepError (`['NotFoundError', 'LockstepError']`). A global
 * symbol, so that two copies of this module (two installs of the package in
 * one process) recognise each other's errors.
 */
export const ERROR_BRAND = Symbol.for('lockstep.error');

/** Base class of every error Lockstep throws. */
export class LockstepError extends Error {
  readonly code: ErrorCode;
  /** Extra structured facts for callers and logs (ids, paths, log tails). */
  readonly details: Record<string, unknown>;
  declare readonly [ERROR_BRAND]: readonly string[];

  constructor(code: ErrorCode, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.details = options.details ?? {};
    const lineage: string[] = [];
    for (let c: unknown = new.target; c !== Error && typeof c === 'function'; c = Object.getPrototypeOf(c))
      lineage.push(c.name);
    Object.defineProperty(this, ERROR_BRAND, { value: Object.freeze(lineage) });
  }

  /**
   * `instanceof` for this class and every subclass: true for its own
   * instances, and for an error made by another copy of this module whose
   * brand names this class (so `e instanceof NotFoundError` holds whichever
   * copy threw it).
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true;
    const brand = (value as { [ERROR_BRAND]?: unknown } | null | undefined)?.[ERROR_BRAND];
    return Array.isArray(brand) && brand.includes(this.name);
  }

  toJSON(): Record<string, unknown> {
    return { name: this.name, code: this.code, message: this.message, ...this.details };
  }
}

/** Bad input rejected at the edge: names the field, what was expected and what was received. */
export class InvalidArgumentError extends LockstepError {
  readonly field: string;
  constructor(field: string, expected: string, received: unknown) {
    super('INVALID_ARGUMENT', `Invalid ${field}: expected ${expected}, received ${describe(received)}`, {
      details: { field, expected },
    });
    this.field = field;
  }
}

/** A named thing (sandbox, image, checkpoint, effect, ...) does not exist, or is not visible to the caller. */
export class NotFoundError extends LockstepError {
  /** `hint`: what to do about it, appended to the message. */
  constructor(kind: NotFoundKind, id: string, hint?: string) {
    const what =
      kind === 'image' || kind === 'tenant' || kind === 'bundle'
        ? `named ${JSON.stringify(id)}`
        : `with id ${JSON.stringify(id)}`;
    super(
      `${kind.toUpperCase() as Uppercase<NotFoundKind>}_NOT_FOUND`,
      `No ${kind} ${what}${hint ? `: ${hint}` : ''}`,
      { details: { kind, id } },
    );
  }
}

/** Something with that name already exists. */
export class AlreadyExistsError extends LockstepError {
  constructor(kind: ExistingKind, id: string) {
    super(
      `${kind.toUpperCase() as Uppercase<ExistingKind>}_EXISTS`,
      `A ${kind} named ${JSON.stringify(id)} already exists`,
      { details: { kind, id } },
    );
  }
}

/** The object is in a state that does not allow the operation (stopped sandbox, image in use, ...). */
export class InvalidStateError extends LockstepError {
  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}) {
    super(code, message, { details });
  }
}

/**
 * What sets a host up (host packages, CRIU, the native build, the layer
 * store, images): every "not set up" error names it. In a clone of the
 * repository, `npm run setup` runs it too.
 */
export const SETUP_COMMAND = 'npx lockstep setup';
/** The sentence a "not set up" error ends with. */
export const SETUP_HINT = `run \`${SETUP_COMMAND}\` as root (in a clone of the repository: \`npm run setup\`)`;

/**
 * A requested resource limit that this host cannot enforce (no controller, no I/O
 * scheduler that honours weights, no quotas).
 */
export class LimitUnsupportedError extends LockstepError {
  readonly field: string;
  constructor(field: string, reason: string) {
    super('LIMIT_UNSUPPORTED', `Cannot apply ${field} on this host: ${reason}`, { details: { field, reason } });
    this.field = field;
  }
}

/** The host lacks something Lockstep needs (CRIU, btrfs, cgroup controller, root). */
export class HostError extends LockstepError {
  constructor(code: ErrorCode, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(code, message, options);
  }
}

/** A kernel call failed; carries errno, syscall and path like Node's own SystemError. */
export class SystemCallError extends LockstepError {
  readonly errno: number | undefined;
  readonly syscall: string | undefined;
  readonly path: string | undefined;
  readonly sysCode: string | undefined;
  constructor(code: ErrorCode, message: string, cause: NativeErrorLike) {
    super(code, message, {
      cause,
      details: { errno: cause.errno, syscall: cause.syscall, path: cause.path, sysCode: cause.code },
    });
    this.errno = cause.errno;
    this.syscall = cause.syscall;
    this.path = cause.path;
    this.sysCode = cause.code;
  }
}

/**
 * The layer store has no room left (ENOSPC on the btrfs holding layers and
 * process images). Whatever the operation had made is removed; the sandbox
 * keeps running, and the operation works again once room is freed.
 */
export class StoreFullError extends LockstepError {
  constructor(what: string, cause: unknown) {
    super(
      'DISK_FULL',
      `${what}: the layer store is full (free room there, e.g. by removing sandboxes or checkpoints)`,
      { cause },
    );
  }
}

/**
 * Refused because too much of one kind is in flight at once, for the caller's
 * tenant or for the whole manager: `retryAfterS` is when to try again (HTTP's
 * Retry-After). Nothing was started.
 */
export class RateLimitedError extends LockstepError {
  readonly retryAfterS: number;
  constructor(what: string, limit: number, scope: 'tenant' | 'manager' | 'sandbox', retryAfterS = 1) {
    super(
      'RATE_LIMITED',
      `Too many ${what} in flight for this ${scope} (at most ${limit}); try again in ${retryAfterS} s`,
      {
        details: { what, limit, scope, retryAfterS },
      },
    );
    this.retryAfterS = retryAfterS;
  }
}

/** CRIU refused or failed; `logTail` holds the end of its log. */
export class CriuError extends LockstepError {
  readonly logTail: string;
  constructor(
    code: 'CRIU_DUMP_FAILED' | 'CRIU_RESTORE_FAILED' | 'CRIU_UNAVAILABLE' | 'CRIU_CHECK_FAILED',
    message: string,
    logTail: string,
    cause?: unknown,
  ) {
    super(code, logTail ? `${message}\n--- criu log (tail) ---\n${logTail}` : message, { cause, details: { logTail } });
    this.logTail = logTail;
  }
}

/** A command run in a sandbox did not finish in time or was aborted. */
export class CommandAbortedError extends LockstepError {
  constructor(code: 'COMMAND_TIMEOUT' | 'COMMAND_ABORTED', message: string, details: Record<string, unknown> = {}) {
    super(code, message, { details });
  }
}

/** Shape of the errors the native addon throws (same fields as Node's SystemError). */
export interface NativeErrorLike extends Error {
  code?: string;
  errno?: number;
  syscall?: string;
  path?: string;
}

export function isNativeError(e: unknown): e is NativeErrorLike {
  return e instanceof Error && typeof (e as NativeErrorLike).syscall === 'string';
}

function describe(v: unknown): string {
  if (v === undefined) return 'undefined';
  if (typeof v === 'string') return JSON.stringify(v.length > 80 ? v.slice(0, 80) + '…' : v);
  if (typeof v === 'number' || typeof v === 'boolean' || v === null) return String(v);
  if (Array.isArray(v)) return `an array of length ${v.length}`;
  return `a value of type ${typeof v}`;
}
