/**
 * The server's error bodies turned back into the in-process SDK's typed
 * errors, so that code written against `lockstep` catches the same classes
 * and branches on the same `code` through `lockstep/client`.
 *
 * Only src/errors.ts is imported here: the client must load on machines
 * without the native addon (a platform's own service, another OS).
 */
import {
  CommandAbortedError,
  InvalidArgumentError,
  InvalidStateError,
  LockstepError,
  NotFoundError,
  type ErrorCode,
} from './errors.js';

/** The body of every error the HTTP API sends. */
export interface WireError {
  code: string;
  message: string;
  field?: string;
}

/** A request could not reach the server, or its answer was not the API's (a proxy's page, a cut connection). */
export class ConnectionError extends LockstepError {
  constructor(message: string, cause?: unknown) {
    super('CONNECTION_FAILED', message, { cause });
  }
}

/** The caller's AbortSignal ended the request; `cause` is the signal's reason. */
export class RequestAbortedError extends LockstepError {
  constructor(reason: unknown) {
    super('REQUEST_ABORTED', 'The request was aborted by its AbortSignal', { cause: reason });
  }
}

/** A LockstepError class, whatever its constructor takes. */
export type LockstepErrorClass = abstract new (...args: never[]) => LockstepError;

/**
 * The class each code arrives as through `lockstep/client` (and
 * snapshots/pull.ts): the class in-process code throws for it, among those
 * `lockstep/client` exports, else InvalidStateError for a conflict with the
 * current state, else LockstepError. The compiler keeps it complete: a new
 * ErrorCode does not build until it has a class here. The Python client's
 * map (clients/python/lockstep/errors.py) follows this one;
 * test/unit/errors-from-wire.test.ts checks both.
 */
export const CLASS_FOR_CODE = {
  INVALID_ARGUMENT: InvalidArgumentError,
  INVALID_JSON: LockstepError,
  BAD_REQUEST: LockstepError,
  USAGE: LockstepError,
  PATH_ESCAPES_SANDBOX: LockstepError,
  CONTEXT_FORMAT_UNSUPPORTED: LockstepError,
  FILE_TYPE_NOT_SUPPORTED: LockstepError,
  FILE_TOO_LARGE: LockstepError,
  PAYLOAD_TOO_LARGE: LockstepError,
  UNSUPPORTED_MEDIA_TYPE: LockstepError,
  LIMIT_UNSUPPORTED: LockstepError,
  QUOTA_EXCEEDED: LockstepError,
  RATE_LIMITED: LockstepError,
  UNAUTHENTICATED: LockstepError,

  SANDBOX_NOT_FOUND: NotFoundError,
  IMAGE_NOT_FOUND: NotFoundError,
  CHECKPOINT_NOT_FOUND: NotFoundError,
  EFFECT_NOT_FOUND: NotFoundError,
  OBSERVATION_NOT_FOUND: NotFoundError,
  CONTEXT_NOT_FOUND: NotFoundError,
  LAYER_NOT_FOUND: NotFoundError,
  TENANT_NOT_FOUND: NotFoundError,
  FILE_NOT_FOUND: NotFoundError,
  // A path no route serves, not a missing object.
  ROUTE_NOT_FOUND: LockstepError,
  DOCKER_IMAGE_NOT_FOUND: NotFoundError,
  BUNDLE_NOT_FOUND: NotFoundError,
  SNAPSHOT_NOT_FOUND: NotFoundError,
  EXPOSURE_NOT_FOUND: NotFoundError,
  MCP_SESSION_NOT_FOUND: NotFoundError,

  // Conflicts with the current state (in-process, the *_EXISTS codes are AlreadyExistsError).
  IMAGE_EXISTS: InvalidStateError,
  TENANT_EXISTS: InvalidStateError,
  SNAPSHOT_EXISTS: InvalidStateError,
  SANDBOX_BUSY: InvalidStateError,
  SANDBOX_NOT_RUNNING: InvalidStateError,
  IMAGE_IN_USE: InvalidStateError,
  TENANT_HAS_SANDBOXES: InvalidStateError,
  NETWORK_NOT_ALLOWED: InvalidStateError,
  FILE_BUSY: InvalidStateError,
  CHECKPOINT_DAMAGED: InvalidStateError,
  CHECKPOINT_CORRUPT: InvalidStateError,
  BUNDLE_CORRUPT: InvalidStateError,
  EFFECT_OUTCOME_UNKNOWN: InvalidStateError,
  EFFECT_NOT_UNKNOWN: InvalidStateError,
  EFFECT_NOT_COMPENSABLE: InvalidStateError,
  EFFECT_ALREADY_SETTLED: InvalidStateError,
  ROLLBACK_REFUSED_IRREVERSIBLE: InvalidStateError,
  IDEMPOTENCY_KEY_CONFLICT: InvalidStateError,
  IDEMPOTENCY_KEY_IN_PROGRESS: InvalidStateError,
  IDEMPOTENCY_KEY_REUSED: InvalidStateError,
  AGENT_STATE_SCHEMA_TOO_NEW: InvalidStateError,
  LANGGRAPH_SANDBOX_DIVERGED: InvalidStateError,
  LANGGRAPH_CONTEXT_MISSING: InvalidStateError,
  CGROUP_TIMEOUT: InvalidStateError,
  STDIN_FULL: InvalidStateError,
  STDIN_CLOSED: InvalidStateError,
  SNAPSHOT_BUSY: InvalidStateError,
  PORT_NOT_LISTENING: InvalidStateError,
  IMAGE_BUILDING: InvalidStateError,

  SNAPSHOT_INCOMPATIBLE: LockstepError,
  BUNDLE_UNTRUSTED: LockstepError,
  PULL_SOURCE_NOT_ALLOWED: LockstepError,
  STORE_NOT_CONFIGURED: LockstepError,

  COMMAND_TIMEOUT: CommandAbortedError,
  COMMAND_ABORTED: CommandAbortedError,
  FORK_ABORTED: LockstepError,
  FORK_FAILED: LockstepError,
  SERVER_SHUTTING_DOWN: LockstepError,

  DISK_QUOTA_EXCEEDED: LockstepError,
  DISK_FULL: LockstepError,

  NATIVE_NOT_BUILT: LockstepError,
  NATIVE_LOAD_FAILED: LockstepError,
  NATIVE_BUILD_FAILED: LockstepError,
  UNSUPPORTED_PLATFORM: LockstepError,
  CRIU_NOT_INSTALLED: LockstepError,
  HOST_PROVISIONING_FAILED: LockstepError,
  CATALOG_TOO_NEW: LockstepError,
  CONFIG_INVALID: LockstepError,

  NOT_ROOT: LockstepError,
  HOME_LOCKED: LockstepError,
  MANAGER_CLOSED: LockstepError,
  CRIU_TOO_OLD: LockstepError,
  CRIU_UNAVAILABLE: LockstepError,
  CRIU_CHECK_FAILED: LockstepError,
  CRIU_DUMP_FAILED: LockstepError,
  CRIU_RESTORE_FAILED: LockstepError,
  SUPERVISOR_TIMEOUT: LockstepError,
  SUPERVISOR_START_FAILED: LockstepError,
  HELPER_NO_ANSWER: LockstepError,
  HELPER_FAILED: LockstepError,
  SANDBOX_INIT_DIED: LockstepError,
  SANDBOX_ENTER_FAILED: LockstepError,
  OVERLAY_MOUNT_FAILED: LockstepError,
  DEV_FOLDER_FAILED: LockstepError,
  LAYER_STORE_FAILED: LockstepError,
  LAYER_STORE_MOUNT_FAILED: LockstepError,
  BTRFS_UNAVAILABLE: LockstepError,
  DISK_QUOTA_UNAVAILABLE: LockstepError,
  CGROUP_UNAVAILABLE: LockstepError,
  CGROUP_CONTROLLERS: LockstepError,
  DOCKER_IMPORT_FAILED: LockstepError,
  IMAGE_BUILD_FAILED: LockstepError,
  FILE_ACCESS_FAILED: LockstepError,
  STORE_UNAVAILABLE: LockstepError,
  TRANSFER_ABORTED: LockstepError,
  SUPERVISOR_UNREACHABLE: LockstepError,
  HOME_NOT_SEARCHABLE: LockstepError,
  ID_RANGES_EXHAUSTED: LockstepError,
  NETWORK_ADDRESSES_EXHAUSTED: LockstepError,
  NETWORK_SETUP_FAILED: LockstepError,
  PORT_UNREACHABLE: LockstepError,
  INTERNAL: LockstepError,

  // Raised by the client itself, never sent by a server.
  CONNECTION_FAILED: ConnectionError,
  REQUEST_ABORTED: RequestAbortedError,
} as const satisfies Record<ErrorCode, LockstepErrorClass>;

/** The class a code arrives as (CLASS_FOR_CODE); a code this client does not know, from a newer server, is a LockstepError. */
export function classForCode(code: string): LockstepErrorClass {
  return Object.hasOwn(CLASS_FOR_CODE, code) ? CLASS_FOR_CODE[code as ErrorCode] : LockstepError;
}

/**
 * An instance of the class for this code, carrying the server's own code and
 * message (built by LockstepError's constructor with the mapped class as its
 * target: the classes' own constructors compose messages from fields the wire
 * does not carry). `details` holds the status and, when sent, the field.
 */
export function errorFromWire(status: number, body: WireError): LockstepError {
  const details: Record<string, unknown> = { status, ...(body.field !== undefined ? { field: body.field } : {}) };
  // An unknown code keeps its text: the caller can still branch on it.
  const err = Reflect.construct(
    LockstepError,
    [body.code as ErrorCode, body.message, { details }],
    classForCode(body.code),
  );
  // InvalidArgumentError and LimitUnsupportedError expose the field as a property too.
  if (body.field !== undefined) Object.defineProperty(err, 'field', { value: body.field, enumerable: true });
  return err;
}

/** Reads an error response; a body that is not the API's becomes a ConnectionError naming the status. */
export async function errorFromResponse(res: Response): Promise<LockstepError> {
  const text = await res.text().catch(() => '');
  try {
    const parsed = JSON.parse(text) as { error?: WireError };
    if (parsed.error && typeof parsed.error.code === 'string' && typeof parsed.error.message === 'string')
      return errorFromWire(res.status, parsed.error);
  } catch {
    /* not JSON: a proxy or something else answered */
  }
  return new ConnectionError(
    `The server answered ${res.status} ${res.statusText} with a body ` +
      `that is not a Lockstep error: ${text.slice(0, 200)}`,
  );
}
