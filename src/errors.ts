/**
 * Typed errors. Every error Lockstep throws is a LockstepError with a stable
 * string `code`; callers branch on `code`, never on the message. The original
 * failure (a native SystemError, a CRIU log, an SQLite error) is kept as `cause`.
 */

/** Base class of every error Lockstep throws. */
export class LockstepError extends Error {
  readonly code: string;
  /** Extra structured facts for callers and logs (ids, paths, log tails). */
  readonly details: Record<string, unknown>;

  constructor(code: string, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.details = options.details ?? {};
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
  constructor(kind: 'sandbox' | 'image' | 'checkpoint' | 'effect' | 'observation' | 'context' | 'layer' | 'tenant', id: string, hint?: string) {
    const what = kind === 'image' || kind === 'tenant' ? `named ${JSON.stringify(id)}` : `with id ${JSON.stringify(id)}`;
    super(`${kind.toUpperCase()}_NOT_FOUND`, `No ${kind} ${what}${hint ? `: ${hint}` : ''}`, { details: { kind, id } });
  }
}

/** Something with that name already exists. */
export class AlreadyExistsError extends LockstepError {
  constructor(kind: string, id: string) {
    super(`${kind.toUpperCase()}_EXISTS`, `A ${kind} named ${JSON.stringify(id)} already exists`, { details: { kind, id } });
  }
}

/** The object is in a state that does not allow the operation (stopped sandbox, image in use, ...). */
export class InvalidStateError extends LockstepError {
  constructor(code: string, message: string, details: Record<string, unknown> = {}) {
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

/** A requested resource limit that this host cannot enforce (no controller, no I/O scheduler that honours weights, no quotas). */
export class LimitUnsupportedError extends LockstepError {
  readonly field: string;
  constructor(field: string, reason: string) {
    super('LIMIT_UNSUPPORTED', `Cannot apply ${field} on this host: ${reason}`, { details: { field, reason } });
    this.field = field;
  }
}

/** The host lacks something Lockstep needs (CRIU, btrfs, cgroup controller, root). */
export class HostError extends LockstepError {
  constructor(code: string, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(code, message, options);
  }
}

/** A kernel call failed; carries errno, syscall and path like Node's own SystemError. */
export class SystemCallError extends LockstepError {
  readonly errno: number | undefined;
  readonly syscall: string | undefined;
  readonly path: string | undefined;
  readonly sysCode: string | undefined;
  constructor(code: string, message: string, cause: NativeErrorLike) {
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
    super('DISK_FULL', `${what}: the layer store is full (free room there, e.g. by removing sandboxes or checkpoints)`, { cause });
  }
}

/** CRIU refused or failed; `logTail` holds the end of its log. */
export class CriuError extends LockstepError {
  readonly logTail: string;
  constructor(code: 'CRIU_DUMP_FAILED' | 'CRIU_RESTORE_FAILED' | 'CRIU_UNAVAILABLE' | 'CRIU_CHECK_FAILED', message: string, logTail: string, cause?: unknown) {
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
