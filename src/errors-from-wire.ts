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

const STATE_CODES = new Set([
  'SANDBOX_BUSY',
  'SANDBOX_NOT_RUNNING',
  'IMAGE_IN_USE',
  'EFFECT_NOT_UNKNOWN',
  'IDEMPOTENCY_KEY_CONFLICT',
  'IDEMPOTENCY_KEY_REUSED',
  'IDEMPOTENCY_KEY_IN_PROGRESS',
  'TENANT_HAS_SANDBOXES',
  'FILE_BUSY',
]);

/**
 * An instance of the SDK's class for this code, carrying the server's own
 * message (the SDK constructors compose theirs from fields the wire does
 * not carry, so the prototype is set on a base error instead).
 */
export function errorFromWire(status: number, body: WireError): LockstepError {
  const details: Record<string, unknown> = { status, ...(body.field !== undefined ? { field: body.field } : {}) };
  const cls = classFor(body.code, status);
  // A newer server may send a code this client does not know: it keeps the code and gets the base class.
  const err = new LockstepError(body.code as ErrorCode, body.message, { details });
  Object.setPrototypeOf(err, cls.prototype);
  Object.defineProperty(err, 'name', { value: cls.name, enumerable: false, configurable: true, writable: true });
  // InvalidArgumentError and LimitUnsupportedError expose the field as a property too.
  if (body.field !== undefined) Object.defineProperty(err, 'field', { value: body.field, enumerable: true });
  return err;
}

function classFor(code: string, status: number): abstract new (...args: never[]) => LockstepError {
  if (code === 'INVALID_ARGUMENT') return InvalidArgumentError;
  if (code.endsWith('_NOT_FOUND') && code !== 'ROUTE_NOT_FOUND') return NotFoundError;
  if (code === 'COMMAND_TIMEOUT' || code === 'COMMAND_ABORTED') return CommandAbortedError;
  if (STATE_CODES.has(code) || status === 409) return InvalidStateError;
  return LockstepError;
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
