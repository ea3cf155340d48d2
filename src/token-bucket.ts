/**
 * Per-key token buckets: a rate a caller may not exceed on average, with a
 * burst. `take` either spends a token or says no at once (the caller
 * refuses the work; nothing queues). Keys whose bucket is full again are
 * dropped, so idle keys cost nothing.
 */
export interface RateLimits {
  /** Tokens added per second. */
  ratePerS: number;
  /** Bucket size: how many may come at once after a pause. */
  burst: number;
}

export class TokenBuckets {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  constructor(
    readonly limits: RateLimits,
    private readonly now: () => number = () => performance.now(),
  ) {
    if (!(limits.ratePerS > 0) || !(limits.burst >= 1)) throw new RangeError('TokenBuckets: rate > 0 and burst >= 1');
  }

  /** Spends one token of `key`; false when its bucket is empty. */
  take(key: string): boolean {
    const t = this.now();
    const b = this.buckets.get(key);
    const tokens = b
      ? Math.min(this.limits.burst, b.tokens + ((t - b.at) / 1000) * this.limits.ratePerS)
      : this.limits.burst;
    if (tokens < 1) {
      if (b) {
        b.tokens = tokens;
        b.at = t;
      }
      return false;
    }
    this.buckets.set(key, { tokens: tokens - 1, at: t });
    if (this.buckets.size > 4096) this.sweep(t);
    return true;
  }

  forget(key: string): void {
    this.buckets.delete(key);
  }

  private sweep(t: number): void {
    for (const [k, b] of this.buckets)
      if (b.tokens + ((t - b.at) / 1000) * this.limits.ratePerS >= this.limits.burst) this.buckets.delete(k);
  }
}
