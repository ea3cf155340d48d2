/**
 * The long operations requests have in flight (checkpoints, rollbacks,
 * forks, commands), each with an AbortController, so that a shutdown can
 * let them finish until a deadline and then abort the rest.
 */

/** One operation in flight. */
interface Operation {
  kind: string;
  controller: AbortController;
  done: Promise<unknown>;
}

/** Tracks in-flight operations; drain() waits for them with a deadline. */
export class OperationTracker {
  private readonly ops = new Set<Operation>();
  private draining = false;

  get size(): number {
    return this.ops.size;
  }

  /** True once drain() has started: no new operation should begin. */
  get isDraining(): boolean {
    return this.draining;
  }

  /**
   * Runs fn with a signal that aborts on shutdown past the deadline, or when
   * `linked` aborts (the client went away).
   */
  async run<T>(kind: string, fn: (signal: AbortSignal) => Promise<T>, linked?: AbortSignal): Promise<T> {
    const controller = new AbortController();
    const onLinked = () => controller.abort(linked?.reason);
    if (linked?.aborted) controller.abort(linked.reason);
    linked?.addEventListener('abort', onLinked, { once: true });
    const done = fn(controller.signal);
    const op: Operation = { kind, controller, done };
    this.ops.add(op);
    try {
      return await done;
    } finally {
      this.ops.delete(op);
      linked?.removeEventListener('abort', onLinked);
    }
  }

  /**
   * Waits for the operations in flight, at most `graceMs`; then aborts those
   * still running and waits for them to settle, at most `abortWaitMs` more.
   * Returns what was aborted and what was still running at the end.
   */
  async drain(graceMs: number, abortWaitMs: number): Promise<{ aborted: string[]; abandoned: string[] }> {
    this.draining = true;
    const settled = (): Promise<void> =>
      Promise.allSettled([...this.ops].map((o) => o.done)).then(() => (this.ops.size ? settled() : undefined));
    if (await finishes(settled(), graceMs)) return { aborted: [], abandoned: [] };
    const aborted = [...this.ops].map((o) => o.kind);
    for (const o of this.ops) o.controller.abort(new Error('server shutting down'));
    await finishes(settled(), abortWaitMs);
    return { aborted, abandoned: [...this.ops].map((o) => o.kind) };
  }
}

/** Resolves true if p settles within ms, false otherwise. */
async function finishes(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((r) => (timer = setTimeout(() => r(false), ms)));
  try {
    return await Promise.race([p.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
