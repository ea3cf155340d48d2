/**
 * The manager learns at once when a sandbox's init exits (`kill -TERM 1`
 * from inside, the OOM killer, a crash) and marks the sandbox `stopped`,
 * so that no later call is pointed at a pid the kernel may already have
 * given to a host process. The addon's PidWatcher holds a pidfd per init and
 * calls back from a thread of its own; this class decides what an exit means.
 *
 * An exit the manager caused itself (a rollback replacing the tree, a
 * remove) is told apart under the sandbox's lock: by then the row names a
 * new init, or is no longer `running`, and nothing is marked.
 */
import type { Logger } from '../log.js';
import { native, type PidWatcher } from '../native/binding.js';
import type { SandboxRuntime } from './runtime.js';

/** What the watcher reads of a sandbox's row: its state and the init it names (the catalog's row, in production). */
export interface InitRow {
  id: string;
  instance: string;
  state: string;
  init_pid: number | null;
  init_start: number | null;
}

/** Where the watcher reads and writes sandbox rows (the catalog, in production). */
export interface InitRows {
  sandbox(id: string): InitRow | undefined;
  updateSandbox(
    id: string,
    fields: {
      state: 'stopped';
      init_pid: null;
      init_start: null;
    },
  ): void;
  /** The sandbox's warm standby, if it has one. */
  standby(id: string): { instance: string } | undefined;
  clearStandby(id: string): void;
  /** Runs fn in one transaction. */
  tx<T>(fn: () => T): T;
}

interface Watched {
  watchId: number;
  pid: number;
  start: number;
}

type LockFn = <T>(id: string, fn: () => Promise<T>) => Promise<T>;
/** Makes the pidfd watcher (the addon's; unit tests pass a fake). */
export type MakePidWatcher = (onExit: (watchId: number) => void) => PidWatcher;
const nativeWatcher: MakePidWatcher = (onExit) => new (native().PidWatcher)(onExit);

/** Watches every running sandbox's init this manager knows of. */
export class InitWatcher {
  private watcher: PidWatcher | undefined;
  private readonly bySandbox = new Map<string, Watched>();
  private readonly byWatch = new Map<number, string>();
  private readonly settling = new Set<Promise<void>>();
  private readonly soon = new Set<NodeJS.Immediate>();
  private closing = false;

  constructor(
    private readonly catalog: InitRows,
    private readonly runtime: Pick<SandboxRuntime, 'killProcesses' | 'destroy'>,
    private readonly withLock: LockFn,
    private readonly log: Logger,
    private readonly makeWatcher: MakePidWatcher = nativeWatcher,
  ) {}

  /**
   * Watches the init the row names. False when the sandbox is not running or
   * that init has exited (or its pid now belongs to another process); the
   * row is then marked stopped in the background, under the sandbox's lock.
   */
  track(row: InitRow): boolean {
    if (this.closing) return row.state === 'running';
    if (this.watch(row)) return true;
    if (row.state === 'running' && row.init_pid !== null)
      this.settle(row.id, { pid: row.init_pid, start: row.init_start });
    return false;
  }

  /**
   * track() of the sandbox's row as it is once the current call has
   * answered (a rollback's new init); nothing happens after close().
   */
  trackSoon(sandboxId: string): void {
    if (this.closing) return;
    const timer = setImmediate(() => {
      this.soon.delete(timer);
      if (this.closing) return;
      const row = this.catalog.sandbox(sandboxId);
      if (row) this.track(row);
    });
    this.soon.add(timer);
  }

  /** Stops watching a sandbox (removed, or its init replaced on purpose). */
  untrack(sandboxId: string): void {
    const w = this.bySandbox.get(sandboxId);
    if (!w) return;
    this.bySandbox.delete(sandboxId);
    this.byWatch.delete(w.watchId);
    this.watcher?.unwatch(w.watchId);
  }

  /** Resolves when every exit seen so far has been written to the catalog. */
  async settled(): Promise<void> {
    while (this.settling.size) await Promise.allSettled([...this.settling]);
  }

  /** Stops the watcher thread, then lets the exits already seen reach the catalog; idempotent. */
  async close(): Promise<void> {
    this.closing = true;
    for (const timer of this.soon) clearImmediate(timer);
    this.soon.clear();
    this.watcher?.close();
    this.watcher = undefined;
    this.bySandbox.clear();
    this.byWatch.clear();
    await this.settled();
  }

  /** Watches the row's init unless it is gone; true when it is watched now. */
  private watch(row: InitRow): boolean {
    if (this.closing) return false;
    if (row.state !== 'running' || row.init_pid === null || row.init_start === null) {
      this.untrack(row.id);
      return false;
    }
    const current = this.bySandbox.get(row.id);
    if (current && current.pid === row.init_pid && current.start === row.init_start) return true;
    this.untrack(row.id);
    this.watcher ??= this.makeWatcher((watchId) => this.onExit(watchId));
    const w = this.watcher.watch(row.init_pid, row.init_start);
    if (!w) return false;
    this.bySandbox.set(row.id, { watchId: w.id, pid: row.init_pid, start: row.init_start });
    this.byWatch.set(w.id, row.id);
    return true;
  }

  private onExit(watchId: number): void {
    const sandboxId = this.byWatch.get(watchId);
    const exited = sandboxId === undefined ? undefined : this.bySandbox.get(sandboxId);
    if (sandboxId === undefined || !exited || exited.watchId !== watchId) return;
    this.byWatch.delete(watchId);
    this.bySandbox.delete(sandboxId);
    this.settle(sandboxId, exited);
  }

  /**
   * Under the sandbox's lock, so that it runs after any rollback or remove in
   * progress: if the row still names the init that exited, the sandbox is
   * stopped; if it names a new one (a rollback here or in another manager),
   * that one is watched instead; if it is no longer running, nothing is left
   * to do.
   */
  private settle(sandboxId: string, exited: { pid: number; start: number | null }): void {
    // A removed sandbox has no lock file left to take (and must not get one back).
    if (!this.catalog.sandbox(sandboxId)) return;
    const work = this.withLock(sandboxId, async () => {
      const row = this.catalog.sandbox(sandboxId);
      if (!row || row.state !== 'running') return;
      if (row.init_pid !== exited.pid || row.init_start !== exited.start) {
        this.track(row);
        return;
      }
      const standby = this.catalog.standby(sandboxId);
      this.catalog.tx(() => {
        this.catalog.updateSandbox(sandboxId, { state: 'stopped', init_pid: null, init_start: null });
        this.catalog.clearStandby(sandboxId);
      });
      this.log.warn({ sandboxId, pid: exited.pid }, 'the sandbox init exited: sandbox stopped');
      // What outlived the init (an enter helper still in the cgroup, a warm standby) goes too.
      await this.runtime
        .killProcesses(row.instance)
        .catch((err) => this.log.warn({ err, sandboxId }, 'killing what was left of a stopped sandbox'));
      if (standby)
        await this.runtime
          .destroy(standby.instance)
          .catch((err) => this.log.warn({ err, sandboxId }, 'removing the standby of a stopped sandbox'));
    });
    const tracked: Promise<void> = work
      .catch((err) => this.log.warn({ err, sandboxId }, 'could not record that a sandbox init exited'))
      .finally(() => this.settling.delete(tracked));
    this.settling.add(tracked);
  }
}
