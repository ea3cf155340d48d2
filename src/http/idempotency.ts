/**
 * Idempotency-Key on POST: the first successful response is stored per
 * (tenant id, key) with a hash of method, path and body, and replayed for
 * retries for 24 hours. The same key with a different request is refused
 * (IDEMPOTENCY_KEY_REUSED); the same key while the first request is still
 * running is refused too (IDEMPOTENCY_KEY_IN_PROGRESS, retry later).
 *
 * Only 2xx responses are stored: an error left nothing behind (or nothing a
 * retry would duplicate), so a retry after one runs the request again.
 *
 * Stored replies are bounded (issue 23, finding 11: a command's reply holds
 * up to 16 MB of stdout and 16 MB of stderr, and 30 of them grew the
 * catalog by almost 1 GiB): a reply is kept only while it is at most
 * REPLY_LIMITS.replyBytes and fits the tenant's and the manager's budgets
 * (less a headroom); otherwise only the fact that the key ran is kept (a row
 * of a few hundred bytes), and a retry with that key is refused with
 * IDEMPOTENCY_KEY_CONFLICT saying so. It is not run again: the point of the
 * key is that a retry does not repeat what the request did (a command, a
 * fork), and a user who wants it run again can send a new key. Once even
 * those rows reach a budget, new keyed requests of the tenant (or of
 * everyone, for the manager's budget) are refused before they run,
 * RATE_LIMITED with Retry-After set to when the oldest of its rows expires;
 * requests without a key are not affected.
 */
import { createHash } from 'node:crypto';
import { HttpError } from './errors.js';
import { migrateIdempotency, rowBytes, type StoredReplies, type StoredResponse } from '../tenants/replies.js';

export { migrateIdempotency, type StoredResponse };

/** How long a stored response is replayed. */
export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
const KEY = /^[\x21-\x7e]{1,255}$/;

const MiB = 1024 * 1024;

/** How many bytes stored replies may keep (defaults; a server may pass others). */
export interface ReplyLimits {
  /** Largest reply kept (its JSON body). */
  replyBytes: number;
  /** All of one tenant's rows. */
  tenantBytes: number;
  /** All tenants' rows together: what the catalog may grow by. */
  totalBytes: number;
}

export const REPLY_LIMITS: ReplyLimits = { replyBytes: 1 * MiB, tenantBytes: 64 * MiB, totalBytes: 512 * MiB };

/**
 * The part of each budget kept for "ran, not kept" rows: replies fill the
 * budget less this, so a tenant whose replies filled theirs still gets its
 * keyed requests run (and their keys honoured) for a long while before the
 * budget refuses any.
 */
const HEADROOM = 8;

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
  /** Bytes the rows keep, per tenant and in all: read once from the table, kept up to date here. */
  private sums: { byTenant: Map<string, number>; total: number } | undefined;

  constructor(
    private readonly replies: StoredReplies,
    private readonly clock: () => number = Date.now,
    readonly limits: ReplyLimits = REPLY_LIMITS,
  ) {}

  private usage(): { byTenant: Map<string, number>; total: number } {
    if (!this.sums) {
      const byTenant = this.replies.usage();
      let total = 0;
      for (const n of byTenant.values()) total += n;
      this.sums = { byTenant, total };
    }
    return this.sums;
  }

  /** Bytes stored replies keep: the tenant's and all tenants'. */
  storedBytes(tenant: string): { tenant: number; total: number } {
    const u = this.usage();
    return { tenant: u.byTenant.get(tenant) ?? 0, total: u.total };
  }

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
      if (!row.kept) throw notKept(key, row.replyBytes, this.limits);
      return { status: row.status, body: row.body, streamed: row.streamed };
    }
    this.refuseOverBudget(tenant, key, hash);
    this.inFlight.set(id, hash);
    return undefined;
  }

  /** RATE_LIMITED when not even a "ran, not kept" row of this key would fit a budget. */
  private refuseOverBudget(tenant: string, key: string, hash: string): void {
    const used = this.storedBytes(tenant);
    const row = rowBytes(key, hash, 0);
    const over =
      used.tenant + row > this.limits.tenantBytes
        ? { scope: 'tenant', limit: this.limits.tenantBytes }
        : used.total + row > this.limits.totalBytes
          ? { scope: 'manager', limit: this.limits.totalBytes }
          : undefined;
    if (!over) return;
    const oldest = this.replies.oldest(over.scope === 'tenant' ? tenant : undefined) ?? this.clock();
    const retryAfterS = Math.max(1, Math.ceil((oldest + IDEMPOTENCY_TTL_MS - this.clock()) / 1000));
    throw new HttpError(
      429,
      'RATE_LIMITED',
      `Stored replies of Idempotency-Key requests ${over.scope === 'tenant' ? 'of this tenant' : 'of all tenants'} ` +
        `have reached their ${over.limit} bytes; send requests without a key, or retry in ${retryAfterS} s`,
      {
        field: 'Idempotency-Key',
        scope: over.scope,
        limit: over.limit,
        used: used[over.scope === 'tenant' ? 'tenant' : 'total'],
        retryAfterS,
      },
    );
  }

  /**
   * Stores the response of a claimed key: the reply itself when it is small
   * enough and fits the budgets (less their headroom), else only that the
   * key ran (a replay is then IDEMPOTENCY_KEY_CONFLICT). Returns whether the
   * reply was kept.
   */
  store(tenant: string, key: string, hash: string, res: StoredResponse): boolean {
    const body = Buffer.byteLength(res.body);
    const used = this.storedBytes(tenant);
    const full = rowBytes(key, hash, body);
    const l = this.limits;
    const kept =
      body <= l.replyBytes &&
      used.tenant + full <= l.tenantBytes - l.tenantBytes / HEADROOM &&
      used.total + full <= l.totalBytes - l.totalBytes / HEADROOM;
    const delta = this.replies.put(tenant, key, hash, res, this.clock(), kept);
    const u = this.usage();
    u.byTenant.set(tenant, (u.byTenant.get(tenant) ?? 0) + delta);
    u.total += delta;
    return kept;
  }

  /** Ends the claim (after store(), or after a failure, which is not stored). */
  release(tenant: string, key: string): void {
    this.inFlight.delete(`${tenant}\n${key}`);
  }

  /** Deletes expired responses; returns how many. */
  sweep(): number {
    const n = this.replies.deleteUpTo(this.clock() - IDEMPOTENCY_TTL_MS);
    this.sums = undefined; // read again: also catches rows another process (tenant rm) removed
    return n;
  }

  /** Forgets a tenant's keys (when the tenant is removed). */
  forgetTenant(tenant: string): void {
    this.replies.forgetTenant(tenant);
    this.sums = undefined;
  }
}

function notKept(key: string, replyBytes: number, limits: ReplyLimits): HttpError {
  return new HttpError(
    409,
    'IDEMPOTENCY_KEY_CONFLICT',
    `The request with Idempotency-Key ${JSON.stringify(key)} already ran, but its reply (${replyBytes} bytes) ` +
      `was not kept (replies are kept up to ${limits.replyBytes} bytes, within the tenant's stored replies budget); ` +
      'it is not run again: send a new key to run it again',
    { field: 'Idempotency-Key', replyBytes, replyLimitBytes: limits.replyBytes },
  );
}

function reused(key: string): HttpError {
  return new HttpError(
    409,
    'IDEMPOTENCY_KEY_REUSED',
    `Idempotency-Key ${JSON.stringify(key)} was already used for a different request`,
    { field: 'Idempotency-Key' },
  );
}
