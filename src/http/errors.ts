/**
 * One error body for every failure the API returns:
 * `{ "error": { "code", "message", "field"? } }`, with `code` stable and
 * `field` naming the offending input. LockstepError codes map to statuses
 * here and nowhere else.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { LockstepError, type ErrorCode } from '../errors.js';
import { noteRequestError } from './request-log.js';

/** The body of every error response. */
export interface ErrorBody {
  error: { code: ErrorCode; message: string; field?: string };
}

/** An error raised by the HTTP layer itself (auth, idempotency, shutdown). */
export class HttpError extends LockstepError {
  readonly statusCode: number;
  constructor(statusCode: number, code: ErrorCode, message: string, details: Record<string, unknown> = {}) {
    super(code, message, { details });
    this.statusCode = statusCode;
  }
}

/**
 * The HTTP status of every code, in one table the compiler keeps complete:
 * a new ErrorCode does not build until it has a status here.
 */
export const HTTP_STATUS = {
  INVALID_ARGUMENT: 400,
  INVALID_JSON: 400,
  BAD_REQUEST: 400,
  USAGE: 400,
  PATH_ESCAPES_SANDBOX: 400,
  CONTEXT_FORMAT_UNSUPPORTED: 400,
  FILE_TYPE_NOT_SUPPORTED: 400,
  FILE_TOO_LARGE: 413,
  PAYLOAD_TOO_LARGE: 413,
  UNSUPPORTED_MEDIA_TYPE: 415,
  // The request is well-formed but names a limit this host cannot enforce.
  LIMIT_UNSUPPORTED: 422,
  QUOTA_EXCEEDED: 429,
  RATE_LIMITED: 429,
  UNAUTHENTICATED: 401,

  SANDBOX_NOT_FOUND: 404,
  IMAGE_NOT_FOUND: 404,
  CHECKPOINT_NOT_FOUND: 404,
  EFFECT_NOT_FOUND: 404,
  OBSERVATION_NOT_FOUND: 404,
  CONTEXT_NOT_FOUND: 404,
  LAYER_NOT_FOUND: 404,
  TENANT_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  ROUTE_NOT_FOUND: 404,
  DOCKER_IMAGE_NOT_FOUND: 404,
  // No bundle of that name in the snapshot store.
  BUNDLE_NOT_FOUND: 404,
  SNAPSHOT_NOT_FOUND: 404,
  // No exposed port with that id for this caller (a wrong token answers the same).
  EXPOSURE_NOT_FOUND: 404,

  // Conflicts with the object's current state (already settled, not unknown, damaged, ...).
  IMAGE_EXISTS: 409,
  TENANT_EXISTS: 409,
  SANDBOX_BUSY: 409,
  STDIN_FULL: 409,
  STDIN_CLOSED: 409,
  SANDBOX_NOT_RUNNING: 409,
  IMAGE_IN_USE: 409,
  TENANT_HAS_SANDBOXES: 409,
  NETWORK_NOT_ALLOWED: 403,
  FILE_BUSY: 409,
  CHECKPOINT_DAMAGED: 409,
  // The checkpoint's files are not what was recorded when it was taken: this
  // one cannot be used, the sandbox and its other checkpoints can.
  CHECKPOINT_CORRUPT: 409,
  // A stored bundle's chunk is missing or does not hash to its name: that bundle cannot be read.
  BUNDLE_CORRUPT: 409,
  EFFECT_OUTCOME_UNKNOWN: 409,
  EFFECT_NOT_UNKNOWN: 409,
  EFFECT_NOT_COMPENSABLE: 409,
  EFFECT_ALREADY_SETTLED: 409,
  ROLLBACK_REFUSED_IRREVERSIBLE: 409,
  IDEMPOTENCY_KEY_CONFLICT: 409,
  IDEMPOTENCY_KEY_IN_PROGRESS: 409,
  IDEMPOTENCY_KEY_REUSED: 409,
  AGENT_STATE_SCHEMA_TOO_NEW: 409,
  LANGGRAPH_SANDBOX_DIVERGED: 409,
  LANGGRAPH_CONTEXT_MISSING: 409,
  CGROUP_TIMEOUT: 409,
  SNAPSHOT_EXISTS: 409,
  SNAPSHOT_BUSY: 409,
  PORT_NOT_LISTENING: 409,
  // The sandbox behind an exposed port did not accept, or did not answer HTTP in time: a gateway's answer.
  PORT_UNREACHABLE: 502,
  // A well-formed bundle this host cannot run (kernel, CPU, CRIU or lockstep-init differ).
  SNAPSHOT_INCOMPATIBLE: 422,
  // The server may pull snapshots only from the origins its operator listed (LOCKSTEP_PULL_SOURCES).
  PULL_SOURCE_NOT_ALLOWED: 403,
  // Unsigned, signed by a key this host does not trust (LOCKSTEP_TRUSTED_BUNDLE_KEYS), or altered.
  BUNDLE_UNTRUSTED: 422,
  // The operator configured no snapshot store (LOCKSTEP_SNAPSHOT_STORE): push and store pulls are off.
  STORE_NOT_CONFIGURED: 501,

  COMMAND_TIMEOUT: 504,
  // Aborted by the server's shutdown (or for a client that is gone).
  COMMAND_ABORTED: 503,
  FORK_ABORTED: 503,
  FORK_FAILED: 500,
  SERVER_SHUTTING_DOWN: 503,
  // A snapshot-store transfer stopped by its signal; a retried put reuses what was stored.
  TRANSFER_ABORTED: 503,
  // The snapshot store (an S3 endpoint, a shared folder) failed or cannot be reached: a retry may succeed.
  STORE_UNAVAILABLE: 503,
  // A create waited its limit for an image made on first use; the build goes on (Retry-After).
  IMAGE_BUILDING: 503,

  DISK_QUOTA_EXCEEDED: 507,
  DISK_FULL: 507,

  // The host is not set up or cannot run this Lockstep (`lockstep setup` fixes the first).
  NATIVE_NOT_BUILT: 503,
  NATIVE_LOAD_FAILED: 503,
  NATIVE_BUILD_FAILED: 503,
  UNSUPPORTED_PLATFORM: 503,
  CRIU_NOT_INSTALLED: 503,
  HOST_PROVISIONING_FAILED: 503,
  CATALOG_TOO_NEW: 503,
  // The state directory cannot be searched by the sandboxes' unprivileged ids (`lockstep setup` fixes it).
  HOME_NOT_SEARCHABLE: 503,
  // Every host id range for user namespaces is taken: capacity, not the request.
  ID_RANGES_EXHAUSTED: 503,
  NETWORK_ADDRESSES_EXHAUSTED: 503,
  NETWORK_SETUP_FAILED: 500,
  // The per-host supervisor (the sandboxes' parent) did not take the request: a retry may succeed.
  SUPERVISOR_UNREACHABLE: 503,
  MCP_SESSION_NOT_FOUND: 404,
  // Raised by lockstep/client itself, never sent by a server: the status is what a proxy would answer.
  CONNECTION_FAILED: 502,
  REQUEST_ABORTED: 499,
  CONFIG_INVALID: 503,

  // Failures of the host or the manager: the body hides the details, the log has them.
  NOT_ROOT: 500,
  HOME_LOCKED: 500,
  MANAGER_CLOSED: 500,
  CRIU_TOO_OLD: 500,
  CRIU_UNAVAILABLE: 500,
  CRIU_CHECK_FAILED: 500,
  CRIU_DUMP_FAILED: 500,
  CRIU_RESTORE_FAILED: 500,
  SUPERVISOR_TIMEOUT: 503,
  SUPERVISOR_START_FAILED: 500,
  HELPER_NO_ANSWER: 500,
  HELPER_FAILED: 500,
  SANDBOX_INIT_DIED: 500,
  SANDBOX_ENTER_FAILED: 500,
  OVERLAY_MOUNT_FAILED: 500,
  DEV_FOLDER_FAILED: 500,
  LAYER_STORE_FAILED: 500,
  LAYER_STORE_MOUNT_FAILED: 500,
  BTRFS_UNAVAILABLE: 500,
  DISK_QUOTA_UNAVAILABLE: 500,
  CGROUP_UNAVAILABLE: 500,
  CGROUP_CONTROLLERS: 500,
  DOCKER_IMPORT_FAILED: 500,
  IMAGE_BUILD_FAILED: 500,
  FILE_ACCESS_FAILED: 500,
  INTERNAL: 500,
} as const satisfies Record<ErrorCode, number>;

/** True for a string that is one of Lockstep's codes. */
export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(HTTP_STATUS, code);
}

/**
 * HTTP status for a code (HTTP_STATUS above). An HttpError
 * carries its own; a string that is no ErrorCode (from a newer peer, say)
 * is a 500.
 */
export function statusForCode(code: string, err?: unknown): number {
  if (err instanceof HttpError) return err.statusCode;
  return isErrorCode(code) ? HTTP_STATUS[code] : 500;
}

/** Turns an ajv instance path ("/envs/FOO", "/cmd/1") into a field name ("envs.FOO", "cmd[1]"). */
export function fieldName(instancePath: string, child?: string): string {
  const parts = instancePath
    .split('/')
    .slice(1)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  if (child !== undefined) parts.push(child);
  let out = '';
  for (const p of parts) out += /^\d+$/.test(p) ? `[${p}]` : out ? `.${p}` : p;
  return out;
}

interface AjvError {
  keyword: string;
  instancePath: string;
  /** Set on errors raised inside propertyNames: the offending key. */
  propertyName?: string;
  message?: string;
  params: Record<string, unknown>;
}

/** The first schema violation as a field and a sentence. */
export function describeValidation(
  errors: AjvError[],
  context: string | undefined,
): { field: string; message: string } {
  const e = errors[0]!;
  const where =
    context === 'querystring'
      ? 'query parameter'
      : context === 'params'
        ? 'path parameter'
        : context === 'headers'
          ? 'header'
          : 'field';
  if (e.keyword === 'required') {
    const field = fieldName(e.instancePath, String(e.params.missingProperty));
    return { field, message: `Missing required ${where} ${field}` };
  }
  if (e.keyword === 'additionalProperties') {
    const field = fieldName(e.instancePath, String(e.params.additionalProperty));
    return { field, message: `Unknown ${where} ${field}` };
  }
  if (e.propertyName !== undefined) {
    const field = fieldName(e.instancePath, e.propertyName);
    return { field, message: `Invalid ${where} name ${field}: ${e.message ?? 'is not allowed'}` };
  }
  const field = fieldName(e.instancePath) || (context === 'body' ? 'body' : (context ?? 'input'));
  let message = e.message ?? 'is invalid';
  if (e.keyword === 'enum' && Array.isArray(e.params.allowedValues))
    message = `must be one of ${e.params.allowedValues.map((v) => JSON.stringify(v)).join(', ')}`;
  return { field, message: `Invalid ${where} ${field}: ${message}` };
}

/** 5xx answers that are about the request, not the server's internals: their message is the caller's to read. */
const PUBLIC_5XX = new Set<ErrorCode>(['IMAGE_BUILDING', 'PORT_UNREACHABLE']);

/** Maps any thrown value to a status and error body; never leaks internals of unexpected errors. */
export function toErrorResponse(err: unknown): { status: number; body: ErrorBody; internal: boolean } {
  const fe = err as FastifyError & { validation?: AjvError[]; validationContext?: string };
  if (fe && Array.isArray(fe.validation) && fe.validation.length) {
    const { field, message } = describeValidation(fe.validation, fe.validationContext);
    return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message, field } }, internal: false };
  }
  if (err instanceof LockstepError) {
    const status = statusForCode(err.code, err);
    if (status >= 500 && !PUBLIC_5XX.has(err.code))
      return {
        status,
        body: { error: { code: err.code, message: 'Internal error; the server log has the details' } },
        internal: true,
      };
    const field = typeof err.details.field === 'string' ? err.details.field : (err as { field?: unknown }).field;
    return {
      status,
      body: { error: { code: err.code, message: err.message, ...(typeof field === 'string' ? { field } : {}) } },
      internal: false,
    };
  }
  switch (fe?.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return {
        status: 413,
        body: {
          error: {
            code: 'PAYLOAD_TOO_LARGE',
            message: 'The request body is larger than this route accepts',
            field: 'body',
          },
        },
        internal: false,
      };
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return {
        status: 415,
        body: {
          error: {
            code: 'UNSUPPORTED_MEDIA_TYPE',
            message: 'Unsupported Content-Type: send application/json (or application/octet-stream for file contents)',
            field: 'Content-Type',
          },
        },
        internal: false,
      };
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return {
        status: 400,
        body: {
          error: {
            code: 'INVALID_ARGUMENT',
            message: 'The body is empty but Content-Type is application/json',
            field: 'body',
          },
        },
        internal: false,
      };
    // Raised before routing (fastify's frameworkErrors), for the path itself.
    case 'FST_ERR_BAD_URL':
      return {
        status: 400,
        body: {
          error: {
            code: 'INVALID_ARGUMENT',
            message: 'The request path is not valid percent-encoding (a % must be followed by two hex digits)',
            field: 'url',
          },
        },
        internal: false,
      };
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return {
        status: 400,
        body: {
          error: {
            code: 'INVALID_ARGUMENT',
            message: 'A path parameter is longer than any id (at most 100 characters)',
            field: 'url',
          },
        },
        internal: false,
      };
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return {
        status: 400,
        body: {
          error: {
            code: 'INVALID_ARGUMENT',
            message: 'Content-Length does not match the body',
            field: 'Content-Length',
          },
        },
        internal: false,
      };
  }
  if (err instanceof SyntaxError || fe?.code === 'FST_ERR_CTP_INVALID_JSON_BODY') {
    return {
      status: 400,
      body: { error: { code: 'INVALID_JSON', message: 'The body is not valid JSON', field: 'body' } },
      internal: false,
    };
  }
  const sc = fe?.statusCode;
  if (typeof sc === 'number' && sc >= 400 && sc < 500) {
    return { status: sc, body: { error: { code: 'BAD_REQUEST', message: fe.message } }, internal: false };
  }
  return {
    status: 500,
    body: { error: { code: 'INTERNAL', message: 'Internal error; the server log has the details' } },
    internal: true,
  };
}

/** Fastify error handler: the error body, logged with the request's bindings. */
export function errorHandler(err: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  const { status, body, internal } = toErrorResponse(err);
  // Logged on the request's one log line (request-log.ts), with the error itself when internal.
  noteRequestError(request, body.error.code, internal ? err : undefined);
  if (status === 401) reply.header('www-authenticate', 'Bearer realm="lockstep"');
  const retryAfterS = err instanceof LockstepError ? err.details.retryAfterS : undefined;
  if (typeof retryAfterS === 'number') reply.header('retry-after', String(Math.max(1, Math.ceil(retryAfterS))));
  void reply.code(status).type('application/json; charset=utf-8').send(body);
}
