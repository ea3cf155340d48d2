/**
 * The answer of a fork and of a start from a snapshot: `results`, one slot
 * per child in the order asked for (its id and how long it took, or its error
 * as the API's error body with the status that error has alone), and the
 * older `ids` and `errors` lists (kept for callers written before `results`).
 * Internal failures (CRIU logs, paths) stay in the server log.
 */
import type { ForkResult } from '../checkpoints/fork.js';
import { statusForCode } from './errors.js';

const HIDDEN = 'Internal error; the server log has the details';

/** A failed child's slot: `status` is what the same error alone would answer. */
export interface WireForkError {
  code: string;
  message: string;
  field?: string;
  status: number;
}

export interface WireForkResults {
  results: Array<{ id: string; ms: number } | { error: WireForkError }>;
  ids: string[];
  errors: { code: string; message: string }[];
}

function wireError(e: Extract<ForkResult, { ok: false }>['error']): WireForkError {
  const status = statusForCode(e.code);
  if (status >= 500) return { code: e.code, message: HIDDEN, status };
  const field = e.details?.field;
  return { code: e.code, message: e.message, ...(typeof field === 'string' ? { field } : {}), status };
}

export function forkResultsToWire(results: ForkResult[]): WireForkResults {
  const slots: WireForkResults['results'] = results.map((r) =>
    r.ok ? { id: r.id, ms: Math.round(r.ms) } : { error: wireError(r.error) },
  );
  return {
    results: slots,
    ids: results.flatMap((r) => (r.ok ? [r.id] : [])),
    errors: slots.flatMap((s) => ('error' in s ? [{ code: s.error.code, message: s.error.message }] : [])),
  };
}
