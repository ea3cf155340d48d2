/**
 * Idempotency-Key on POST: the first successful response is stored per
 * (tenant id, key) with a hash of method, path and body, and replayed for
 * retries for 24 hours. The same key with a different request is refused
 * (IDEMPOTENCY_KEY_REUSED); the same key while the first request is still
 * running is refused too (IDEMPOTENCY_KEY_IN_PROGRESS, retry later).
 *
 * Only 2xx responses are stored: an error left nothing behind (or nothing a
 * retry would duplicate), so a retry after one runs the request again.
 */
import { createHash } from 'node:crypto';
import { HttpError } from './errors.js';
import { migrateIdempotency, type StoredReplies, type StoredResponse } from '../tenants/replies.js';

export { migrateIdempotency, type StoredResponse };

/** How long a stored response is replayed. */
export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
const KEY = /^[\x21-\x7e]{1,255}$/;

/** Hash of what makes two requests "the same": method, path with query, and body. */
export function requestHash(method: string, url: string, body: unknown): string {
  const h = createHash('sha256').update(method).update('\n').update(url).update('\n');
  if (Buffer.isBuffer(body)) h.update('b').update(body);
  // A streamed body (a bundle import) is not read here: its key names the request.
  else if (body && typeof (body as { pipe?: unknown }).pipe === 'function') h.update('s');
  else if (body !== undefined) h.update('j').update(canonical(body));
  return h.digest('hex');
}

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

export function validateIdempotencyKey(key: unknown): string {
  if (typeof key !== 'string' || !KEY.test(key)) {
    throw new HttpError(400, 'INVALID_ARGUMENT', 'Invalid Idempotency-Key: expected 1-255 printable ASCII characters', {
      field: 'Idempotency-Key',
    });
  }
  return key;
}

/** Stored responses (the tenants' replies table), plus the keys whose first request is still running. */
export class IdempotencyStore {
  private readonly inFlight = new Map<string, string>();

  constructor(
    private readonly replies: StoredReplies,
    private readonly clock: () => number = Date.now,
  ) {}

  /**
   * Before running a request: the stored response to replay, or undefined
   * (then the key is held until release()). Throws on reuse or concurrency.
   */
  claim(tenant: string, key: string, hash: string): StoredResponse | undefined {
    const id = `${tenant}\n${key}`;
    const held = this.inFlight.get(id);
    if (held !== undefined) {
      if (held !== hash) throw reused(key);
      throw new HttpError(
        409,
        'IDEMPOTENCY_KEY_IN_PROGRESS',
        `A request with Idempotency-Key ${JSON.stringify(key)} is still running; retry when it has finished`,
        { field: 'Idempotency-Key' },
      );
    }
    const row = this.replies.find(tenant, key);
    if (row && row.createdAt > this.clock() - IDEMPOTENCY_TTL_MS) {
      if (row.requestHash !== hash) throw reused(key);
      return { status: row.status, body: row.body, streamed: row.streamed };
    }
    this.inFlight.set(id, hash);
    return undefined;
  }

  /** Stores the response of a claimed key. */
  store(tenant: string, key: string, hash: string, res: StoredResponse): void {
    this.replies.put(tenant, key, hash, res, this.clock());
  }

  /** Ends the claim (after store(), or after a failure, which is not stored). */
  release(tenant: string, key: string): void {
    this.inFlight.delete(`${tenant}\n${key}`);
  }

  /** Deletes expired responses; returns how many. */
  sweep(): number {
    return this.replies.deleteUpTo(this.clock() - IDEMPOTENCY_TTL_MS);
  }

  /** Forgets a tenant's keys (when the tenant is removed). */
  forgetTenant(tenant: string): void {
    this.replies.forgetTenant(tenant);
  }
}

function reused(key: string): HttpError {
  return new HttpError(
    409,
    'IDEMPOTENCY_KEY_REUSED',
    `Idempotency-Key ${JSON.stringify(key)} was already used for a different request`,
    { field: 'Idempotency-Key' },
  );
}
