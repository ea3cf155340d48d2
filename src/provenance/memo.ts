/**
 * A memoised "is this id an ancestor (or the same)?" predicate, shared by
 * observations, verdicts and the effect ledger.
 */
import { InvalidArgumentError } from '../errors.js';

/** Wraps an ancestry predicate so each id is asked once per call site (rollback reports ask per record). */
export function memo(pred: (id: string) => boolean): (id: string) => boolean {
  if (typeof pred !== 'function') throw new InvalidArgumentError('isAncestorOrSelf', 'a function', pred);
  const cache = new Map<string, boolean>();
  return (id) => {
    let v = cache.get(id);
    if (v === undefined) cache.set(id, (v = pred(id)));
    return v;
  };
}
