/**
 * Waiting for a host process to exit without polling. One PidWatcher (the
 * addon's pidfd + epoll thread, as for sandbox inits) serves every wait of
 * the manager: a wait costs one pidfd in its epoll set and one map entry
 * here, nothing on the event loop until the process exits. A wait that is
 * aborted or times out gives both back at once (and its timer), so a
 * client that walks away leaves nothing running behind it.
 */
import type { PidWatcher } from '../native/binding.js';

/** How a wait ended. */
export type ExitWaitEnd = 'exited' | 'aborted' | 'timeout';

export class ProcessExits {
  private watcher: PidWatcher | undefined;
  private readonly waiting = new Map<number, (how: ExitWaitEnd) => void>();
  private closed = false;
  /**
   * The watcher's thread does not keep the event loop alive (a manager with
   * only its inits watched may exit): while a wait is pending this timer
   * does, so a program whose last await is a wait is not ended under it.
   */
  private keepAlive: NodeJS.Timeout | undefined;

  constructor(private readonly makeWatcher: (onExit: (id: number) => void) => PidWatcher) {}

  /** Waits in progress (what an abort must bring back down). */
  get size(): number {
    return this.waiting.size;
  }

  /**
   * Resolves when pid exits ('exited' at once if it is gone, a zombie, or not
   * the process started at `start`), when signal aborts ('aborted'), or after
   * timeoutMs ('timeout'), whichever comes first.
   */
  wait(pid: number, opts: { start?: number; signal?: AbortSignal; timeoutMs?: number } = {}): Promise<ExitWaitEnd> {
    const { signal, timeoutMs, start } = opts;
    if (signal?.aborted) return Promise.resolve('aborted');
    if (this.closed) return Promise.resolve('aborted');
    this.watcher ??= this.makeWatcher((id) => this.waiting.get(id)?.('exited'));
    const w = this.watcher.watch(pid, start);
    if (!w) return Promise.resolve('exited');
    return new Promise<ExitWaitEnd>((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const end = (how: ExitWaitEnd) => {
        if (!this.waiting.delete(w.id)) return;
        if (this.waiting.size === 0 && this.keepAlive) {
          clearInterval(this.keepAlive);
          this.keepAlive = undefined;
        }
        if (how !== 'exited') this.watcher?.unwatch(w.id);
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        resolve(how);
      };
      const onAbort = () => end('aborted');
      this.waiting.set(w.id, end);
      this.keepAlive ??= setInterval(() => undefined, 1 << 30);
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timeoutMs !== undefined) timer = setTimeout(() => end('timeout'), timeoutMs);
    });
  }

  /** Ends every wait ('aborted') and stops the watcher thread; idempotent. */
  close(): void {
    this.closed = true;
    // Each end() unwatches its pid, clears its timer and listener, and resolves.
    for (const end of [...this.waiting.values()]) end('aborted');
    this.watcher?.close();
    this.watcher = undefined;
  }
}
