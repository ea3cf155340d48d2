/**
 * Bounds on what callers can make the manager hold at once: waits, streams,
 * listings, DNS queries in flight. One `Admission` counts one kind of work,
 * per key (a tenant, a sandbox) and in total; `enter` either admits and
 * returns the release, or refuses at once with RATE_LIMITED (never queues:
 * a queue is itself something a caller could grow without bound).
 *
 * The release is idempotent, so a `finally` and an abort listener may both
 * call it.
 */
import { RateLimitedError } from './errors.js';

export interface AdmissionLimits {
  /** What is counted, in the refusal's message ("command waits"). */
  what: string;
  /** At most this many for one key at once. */
  perKey: number;
  /** At most this many for the whole manager at once. */
  total: number;
  /** The scope a key names, in the refusal's message. */
  scope?: 'tenant' | 'sandbox';
  /** Retry-After of a refusal, in seconds (default 1). */
  retryAfterS?: number;
}

export class Admission {
  private readonly byKey = new Map<string, number>();
  private count = 0;

  constructor(readonly limits: AdmissionLimits) {
    for (const k of ['perKey', 'total'] as const)
      if (!Number.isInteger(limits[k]) || limits[k] < 1)
        throw new RangeError(`Admission ${limits.what}: ${k} must be a positive integer`);
  }

  /** Admitted now for this key, and in total. */
  inFlight(key?: string): number {
    return key === undefined ? this.count : (this.byKey.get(key) ?? 0);
  }

  /** Admits one more for `key`, or throws RATE_LIMITED; call the result once it is over. */
  enter(key: string): () => void {
    const { what, perKey, total, scope = 'tenant', retryAfterS = 1 } = this.limits;
    const mine = this.byKey.get(key) ?? 0;
    if (mine >= perKey) throw new RateLimitedError(what, perKey, scope, retryAfterS);
    if (this.count >= total) throw new RateLimitedError(what, total, 'manager', retryAfterS);
    this.byKey.set(key, mine + 1);
    this.count++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.count--;
      const left = (this.byKey.get(key) ?? 1) - 1;
      if (left > 0) this.byKey.set(key, left);
      else this.byKey.delete(key);
    };
  }

  /** Runs fn admitted under key; released when it settles. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const release = this.enter(key);
    try {
      return await fn();
    } finally {
      release();
    }
  }
}
