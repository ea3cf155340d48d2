/**
 * One page of a directory's names, in name order, without holding the
 * directory in memory.
 *
 * Why sorted pages with the last name as cursor, and not readdir order: a
 * directory offset (telldir) is not stable across opens on every filesystem
 * (overlayfs merges its layers anew on each open), and a cap in readdir
 * order could only say "truncated" with no way to see the rest. Names in
 * order give a cursor any caller can hold ("the names after X"), stable
 * across calls: paging through an unchanging directory returns every name
 * exactly once, and a name added or removed between pages affects only
 * itself.
 *
 * The cost: each page reads the whole directory again (opendir streams it in
 * chunks on libuv's pool), keeping only the `limit + 1` smallest names after
 * the cursor in a max-heap: memory is O(limit), time O(n log limit) per
 * page. The time a listing can take is bounded by how many run at once
 * (ObservedFiles' admission), not by holding anything.
 */
import fs from 'node:fs';

/** Directory entries read per trip to the pool. */
const DIR_BUFFER = 1024;

export interface DirPage {
  /** The names of the page, in order (UTF-16 code unit order, as Array.prototype.sort). */
  names: string[];
  /** More names follow the last one. */
  more: boolean;
}

/**
 * The first `limit` names of the directory at `dirPath` that sort after
 * `after` (all of them when after is undefined). `limit` may be Infinity:
 * every name, sorted (the caller then holds the whole directory itself).
 */
export async function readDirPage(dirPath: string, limit: number, after?: string): Promise<DirPage> {
  const keep = new MaxHeap(limit + 1);
  const dir = await fs.promises.opendir(dirPath, { bufferSize: DIR_BUFFER });
  // for-await closes the Dir when the loop ends or throws.
  for await (const d of dir) {
    if (after === undefined || d.name > after) keep.offer(d.name);
  }
  const names = keep.drainSorted();
  const more = names.length > limit;
  if (more) names.length = limit;
  return { names, more };
}

/** The `cap` smallest strings offered so far (a binary max-heap: the largest kept is at the top). */
class MaxHeap {
  private readonly a: string[] = [];
  constructor(private readonly cap: number) {}

  offer(s: string): void {
    const a = this.a;
    if (a.length < this.cap) {
      a.push(s);
      let i = a.length - 1;
      while (i > 0) {
        const parent = (i - 1) >> 1;
        if (a[parent]! >= a[i]!) break;
        [a[parent], a[i]] = [a[i]!, a[parent]!];
        i = parent;
      }
    } else if (s < a[0]!) {
      a[0] = s;
      this.siftDown(0);
    }
  }

  private siftDown(i: number): void {
    const a = this.a;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let top = i;
      if (l < a.length && a[l]! > a[top]!) top = l;
      if (r < a.length && a[r]! > a[top]!) top = r;
      if (top === i) return;
      [a[top], a[i]] = [a[i]!, a[top]!];
      i = top;
    }
  }

  /** Everything kept, smallest first (the heap is emptied). */
  drainSorted(): string[] {
    return this.a.splice(0).sort();
  }
}
