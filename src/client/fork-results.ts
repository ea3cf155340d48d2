/**
 * The answer of a fork or a start from a snapshot read back: one result per
 * sandbox asked for, in order, with a failed one's error as the SDK's typed
 * error (the class its code and status map to, src/errors-from-wire.ts).
 */
import type { LockstepError } from '../errors.js';
import { errorFromWire } from '../errors-from-wire.js';
import type { WireForkResults } from '../http/fork-results.js';

/** One sandbox's outcome: its id and how long it took (ms), or its error. */
export type RemoteForkResult = { ok: true; id: string; ms: number } | { ok: false; error: LockstepError };

export function forkResultsFromWire(answer: Pick<WireForkResults, 'results'>): RemoteForkResult[] {
  return answer.results.map((r) => {
    if ('error' in r) {
      const { status, ...body } = r.error;
      return { ok: false as const, error: errorFromWire(status, body) };
    }
    return { ok: true as const, id: r.id, ms: r.ms };
  });
}
