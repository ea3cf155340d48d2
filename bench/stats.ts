/**
 * Small statistics for the benchmark: percentiles over a handful of samples
 * and per-phase summaries of the timings Lockstep returns. Nothing here
 * touches the host, so it can be unit-tested anywhere.
 */

/** p50/p95 and friends of one series of samples, in milliseconds. */
export interface Summary {
  n: number;
  min: number;
  p50: number;
  p95: number;
  max: number;
  mean: number;
}

/**
 * Percentile with linear interpolation between closest ranks (the method
 * numpy and most spreadsheets use by default). With 30 samples p95 sits
 * between the 28th and 29th smallest, so one outlier does not make it.
 */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  if (sorted.length === 1) return sorted[0]!;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (rank - lo);
}

export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  const n = sorted.length;
  return {
    n,
    min: n ? sorted[0]! : Number.NaN,
    p50: percentile(sorted, 50),
    p95: percentile(sorted, 95),
    max: n ? sorted[n - 1]! : Number.NaN,
    mean: n ? sorted.reduce((a, b) => a + b, 0) / n : Number.NaN,
  };
}

/**
 * Summaries of each named phase over many records (one record per
 * iteration, e.g. the `timings` of a checkpoint). A phase missing from a
 * record is skipped for that record only.
 */
export function summarizePhases(records: readonly Record<string, number | undefined>[]): Record<string, Summary> {
  const keys = new Set<string>();
  for (const r of records) for (const k of Object.keys(r)) keys.add(k);
  const out: Record<string, Summary> = {};
  for (const k of keys) out[k] = summarize(records.map((r) => r[k]).filter((v): v is number => typeof v === 'number'));
  return out;
}

/** Milliseconds an async call took, with its result. */
export async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const t0 = performance.now();
  const value = await fn();
  return { ms: performance.now() - t0, value };
}

/** The numeric fields of a timings object (the library may add labels such as a path name). */
export function numericFields(o: object): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(o)) if (typeof v === 'number' && Number.isFinite(v)) out[k] = v;
  return out;
}
