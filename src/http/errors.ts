/**
 * One error body for every failure the API returns:
 * `{ "error": { "code", "message", "field"? } }`, with `code` stable and
 * `field` naming the offending input. LockstepError codes map to statuses
 * here and nowhere else.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { InvalidStateError, LockstepError } from '../errors.js';
import { noteRequestError } from './request-log.js';

/** The body of every error response. */
export interface ErrorBody {
  error: { code: string; message: string; field?: string };
}

/** An error raised by the HTTP layer itself (auth, idempotency, shutdown). */
export class HttpError extends LockstepError {
  readonly statusCode: number;
  constructor(statusCode: number, code: string, message: string, details: Record<string, unknown> = {}) {
    super(code, message, { details });
    this.statusCode = statusCode;
  }
}

const CONFLICTS = new Set([
  'SANDBOX_BUSY',
  'IMAGE_IN_USE',
  'EFFECT_OUTCOME_UNKNOWN',
  'ROLLBACK_REFUSED_IRREVERSIBLE',
  'IDEMPOTENCY_KEY_CONFLICT',
  'SANDBOX_NOT_RUNNING',
  'TENANT_HAS_SANDBOXES',
  'FILE_BUSY',
  // The checkpoint's files are not what was recorded when it was taken: this
  // one cannot be used, the sandbox and its other checkpoints can.
  'CHECKPOINT_CORRUPT',
]);

const HOST_NOT_READY = new Set([
  'NATIVE_NOT_BUILT',
  'NATIVE_LOAD_FAILED',
  'NATIVE_BUILD_FAILED',
  'UNSUPPORTED_PLATFORM',
  'CRIU_NOT_INSTALLED',
  'HOST_PROVISIONING_FAILED',
  'CATALOG_TOO_NEW',
  'CONFIG_INVALID',
]);

/** HTTP status for a LockstepError code (the table in src/http/README.md). */
export function statusForCode(code: string, err?: unknown): number {
  if (err instanceof HttpError) return err.statusCode;
  if (code.endsWith('_NOT_FOUND')) return 404;
  if (code === 'INVALID_ARGUMENT' || code === 'PATH_ESCAPES_SANDBOX' || code === 'CONTEXT_FORMAT_UNSUPPORTED' || code === 'FILE_TYPE_NOT_SUPPORTED') return 400;
  if (code === 'FILE_TOO_LARGE') return 413;
  if (code === 'QUOTA_EXCEEDED') return 429;
  // The request is well-formed but names a limit this host cannot enforce.
  if (code === 'LIMIT_UNSUPPORTED') return 422;
  if (code === 'DISK_QUOTA_EXCEEDED' || code === 'DISK_FULL') return 507;
  if (code === 'COMMAND_TIMEOUT') return 504;
  // Aborted by the server's shutdown (or for a client that is gone).
  if (code === 'COMMAND_ABORTED') return 503;
  // Every host id range for user namespaces is taken: capacity, not the request.
  if (code === 'ID_RANGES_EXHAUSTED') return 503;
  if (code.endsWith('_EXISTS') || CONFLICTS.has(code)) return 409;
  // The remaining state errors (already settled, not unknown, damaged, ...)
  // are conflicts with the object's current state too.
  if (err instanceof InvalidStateError) return 409;
  // The host is not set up or cannot run this Lockstep (`lockstep setup` fixes the first).
  if (HOST_NOT_READY.has(code)) return 503;
  // The per-host supervisor (the sandboxes' parent) did not take the request: a retry may succeed.
  if (code === 'SUPERVISOR_UNREACHABLE' || code === 'SUPERVISOR_TIMEOUT') return 503;
  return 500;
}

/** Turns an ajv instance path ("/envs/FOO", "/cmd/1") into a field name ("envs.FOO", "cmd[1]"). */
export function fieldName(instancePath: string, child?: string): string {
  const parts = instancePath.split('/').slice(1).map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
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
export function describeValidation(errors: AjvError[], context: string | undefined): { field: string; message: string } {
  const e = errors[0]!;
  const where = context === 'querystring' ? 'query parameter' : context === 'params' ? 'path parameter' : context === 'headers' ? 'header' : 'field';
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
  const field = fieldName(e.instancePath) || (context === 'body' ? 'body' : context ?? 'input');
  let message = e.message ?? 'is invalid';
  if (e.keyword === 'enum' && Array.isArray(e.params.allowedValues)) message = `must be one of ${e.params.allowedValues.map((v) => JSON.stringify(v)).join(', ')}`;
  return { field, message: `Invalid ${where} ${field}: ${message}` };
}

/** Maps any thrown value to a status and error body; never leaks internals of unexpected errors. */
export function toErrorResponse(err: unknown): { status: number; body: ErrorBody; internal: boolean } {
  const fe = err as FastifyError & { validation?: AjvError[]; validationContext?: string };
  if (fe && Array.isArray(fe.validation) && fe.validation.length) {
    const { field, message } = describeValidation(fe.validation, fe.validationContext);
    return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message, field } }, internal: false };
  }
  if (err instanceof LockstepError) {
    const status = statusForCode(err.code, err);
    if (status >= 500) return { status, body: { error: { code: err.code, message: 'Internal error; the server log has the details' } }, internal: true };
    const field = typeof err.details.field === 'string' ? err.details.field : (err as { field?: unknown }).field;
    return { status, body: { error: { code: err.code, message: err.message, ...(typeof field === 'string' ? { field } : {}) } }, internal: false };
  }
  switch (fe?.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, body: { error: { code: 'PAYLOAD_TOO_LARGE', message: 'The request body is larger than this route accepts', field: 'body' } }, internal: false };
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { status: 415, body: { error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'Unsupported Content-Type: send application/json (or application/octet-stream for file contents)', field: 'Content-Type' } }, internal: false };
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message: 'The body is empty but Content-Type is application/json', field: 'body' } }, internal: false };
    // Raised before routing (fastify's frameworkErrors), for the path itself.
    case 'FST_ERR_BAD_URL':
      return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message: 'The request path is not valid percent-encoding (a % must be followed by two hex digits)', field: 'url' } }, internal: false };
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message: 'A path parameter is longer than any id (at most 100 characters)', field: 'url' } }, internal: false };
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { status: 400, body: { error: { code: 'INVALID_ARGUMENT', message: 'Content-Length does not match the body', field: 'Content-Length' } }, internal: false };
  }
  if (err instanceof SyntaxError || fe?.code === 'FST_ERR_CTP_INVALID_JSON_BODY') {
    return { status: 400, body: { error: { code: 'INVALID_JSON', message: 'The body is not valid JSON', field: 'body' } }, internal: false };
  }
  const sc = fe?.statusCode;
  if (typeof sc === 'number' && sc >= 400 && sc < 500) {
    return { status: sc, body: { error: { code: 'BAD_REQUEST', message: fe.message } }, internal: false };
  }
  return { status: 500, body: { error: { code: 'INTERNAL', message: 'Internal error; the server log has the details' } }, internal: true };
}

/** Fastify error handler: the error body, logged with the request's bindings. */
export function errorHandler(err: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  const { status, body, internal } = toErrorResponse(err);
  // Logged on the request's one log line (request-log.ts), with the error itself when internal.
  noteRequestError(request, body.error.code, internal ? err : undefined);
  if (status === 401) reply.header('www-authenticate', 'Bearer realm="lockstep"');
  void reply.code(status).type('application/json; charset=utf-8').send(body);
}
