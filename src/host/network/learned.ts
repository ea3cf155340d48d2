/**
 * The addresses a sandbox's resolver has learned (answers to allowed
 * names), and the batching of their allow-set elements. A sandbox picks
 * the names it asks, so without bounds it picks how large the host's
 * firewall grows: here an address already learned for the same rule with
 * a later or equal expiry adds nothing, a sandbox holds at most
 * `maxPerSandbox` live learned addresses (past it, the answer is sent
 * without its elements: connecting to it is refused, the safe side), and
 * the elements of answers arriving within a few ms go to nft as one
 * transaction. Pure bookkeeping; applying a batch is the caller's function.
 */
import type { AllowElement } from './nftables.js';

export const LEARNED_LIMITS = {
  /** Live learned addresses per sandbox. */
  maxPerSandbox: 256,
  /** How long answers are gathered into one batch. */
  batchWindowMs: 3,
  /** A batch is sent at once when it holds this many elements. */
  maxBatchElements: 1024,
};

function ruleKey(e: AllowElement): string {
  return `${e.proto}/${e.ports[0]}-${e.ports[1]}`;
}

export interface Admitted {
  /** The elements nft needs (new, or extending an expiry): pass them to `adding`. */
  add: AllowElement[];
  /** Batches still applying the elements this answer needs and did not add itself: wait for them too. */
  waitFor: Promise<void>[];
  /** Addresses left out because the sandbox holds its maximum. */
  refused: number;
}

interface Learned {
  expiry: number;
  /** Set while the batch adding it is applying. */
  pending?: Promise<void> | undefined;
}

export class LearnedAddresses {
  /** sandbox address → learned cidr → rule → what was learned. */
  private readonly bySandbox = new Map<string, Map<string, Map<string, Learned>>>();

  constructor(private readonly maxPerSandbox = LEARNED_LIMITS.maxPerSandbox) {}

  /** Live learned addresses of a sandbox. */
  count(sandbox: string, nowMs: number): number {
    const mine = this.bySandbox.get(sandbox);
    if (!mine) return 0;
    this.prune(mine, nowMs);
    return mine.size;
  }

  /**
   * Records the elements of an answer (each with `timeoutS`) and returns
   * the ones that must be added, and the batches in flight that add the
   * rest: the answer goes out when both are in.
   */
  admit(elements: readonly AllowElement[], nowMs: number): Admitted {
    const add: AllowElement[] = [];
    const waitFor = new Set<Promise<void>>();
    const refusedCidrs = new Set<string>();
    for (const e of elements) {
      let mine = this.bySandbox.get(e.sandbox);
      if (!mine) this.bySandbox.set(e.sandbox, (mine = new Map()));
      const expiry = nowMs + (e.timeoutS ?? 0) * 1000;
      let rules = mine.get(e.cidr);
      if (!rules || !live(rules, nowMs)) {
        if (mine.size >= this.maxPerSandbox) this.prune(mine, nowMs);
        if (!mine.has(e.cidr) && mine.size >= this.maxPerSandbox) {
          refusedCidrs.add(e.cidr);
          continue;
        }
        rules = new Map();
        mine.set(e.cidr, rules);
      }
      const k = ruleKey(e);
      const known = rules.get(k);
      if (known !== undefined && known.expiry >= expiry) {
        if (known.pending) waitFor.add(known.pending);
        continue;
      }
      rules.set(k, { expiry });
      add.push(e);
    }
    return { add, waitFor: [...waitFor], refused: refusedCidrs.size };
  }

  /**
   * The batch applying `added` (what `admit` returned): answers that need
   * the same elements meanwhile wait for it; if it fails, the elements are
   * forgotten, so the next answer adds them again.
   */
  adding(added: readonly AllowElement[], batch: Promise<void>): void {
    const entries = added.map((e) => ({ e, l: this.bySandbox.get(e.sandbox)?.get(e.cidr)?.get(ruleKey(e)) }));
    for (const { l } of entries) if (l) l.pending = batch;
    batch.then(
      () => {
        for (const { l } of entries) if (l && l.pending === batch) l.pending = undefined;
      },
      () => {
        for (const { e, l } of entries) {
          const rules = this.bySandbox.get(e.sandbox)?.get(e.cidr);
          if (!l || rules?.get(ruleKey(e)) !== l) continue;
          rules.delete(ruleKey(e));
          if (rules.size === 0) this.bySandbox.get(e.sandbox)!.delete(e.cidr);
        }
      },
    );
  }

  /** Forgets a sandbox (its resolver closed, its policy removed). */
  forget(sandbox: string): void {
    this.bySandbox.delete(sandbox);
  }

  private prune(mine: Map<string, Map<string, Learned>>, nowMs: number): void {
    for (const [cidr, rules] of mine) if (!live(rules, nowMs)) mine.delete(cidr);
  }
}

function live(rules: Map<string, Learned>, nowMs: number): boolean {
  for (const l of rules.values()) if (l.expiry > nowMs) return true;
  return false;
}

/**
 * Gathers elements for `windowMs` (or until `maxElements`) and applies them
 * in one call; each `add` resolves when its batch is in, or rejects with
 * the batch's error. One batch is applied at a time; what arrives meanwhile
 * waits for the next one.
 */
export class ElementBatcher {
  private queued: { elements: readonly AllowElement[]; resolve: () => void; reject: (e: unknown) => void }[] = [];
  private size = 0;
  private timer: NodeJS.Timeout | undefined;
  private running = false;

  constructor(
    private readonly apply: (elements: AllowElement[]) => Promise<void>,
    private readonly windowMs = LEARNED_LIMITS.batchWindowMs,
    private readonly maxElements = LEARNED_LIMITS.maxBatchElements,
  ) {}

  add(elements: readonly AllowElement[]): Promise<void> {
    if (elements.length === 0) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      this.queued.push({ elements, resolve, reject });
      this.size += elements.length;
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.running || this.queued.length === 0) return;
    if (this.size >= this.maxElements) {
      clearTimeout(this.timer);
      this.timer = undefined;
      void this.flush();
    } else this.timer ??= setTimeout(() => void this.flush(), this.windowMs);
  }

  private async flush(): Promise<void> {
    this.timer = undefined;
    if (this.running) return;
    const batch: typeof this.queued = [];
    let n = 0;
    while (this.queued.length && (n === 0 || n + this.queued[0]!.elements.length <= this.maxElements)) {
      const q = this.queued.shift()!;
      n += q.elements.length;
      batch.push(q);
    }
    this.size -= n;
    this.running = true;
    try {
      await this.apply(batch.flatMap((q) => q.elements));
      for (const q of batch) q.resolve();
    } catch (e) {
      for (const q of batch) q.reject(e);
    } finally {
      this.running = false;
      this.schedule();
    }
  }
}
