/**
 * What an init's exit means, decided under the sandbox's lock: the row still
 * naming that init is stopped; a row naming a new init (a rollback) or no
 * longer running (a remove) is left alone. A fake pidfd watcher stands in
 * for the addon; the catalog is a real SQLite file.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { Catalog, type SandboxRow } from '../../src/catalog/catalog.js';
import { InitWatcher } from '../../src/instances/init-watcher.js';
import type { PidWatcher } from '../../src/native/binding.js';

/** Processes that "run": pid -> start time. */
class FakeWatcher implements PidWatcher {
  readonly watched = new Map<number, number>(); // watch id -> pid
  private next = 1;
  closed = false;
  constructor(
    readonly alive: Map<number, number>,
    readonly onExit: (id: number) => void,
  ) {}
  watch(pid: number, expectedStart?: number) {
    const start = this.alive.get(pid);
    if (start === undefined || (expectedStart !== undefined && start !== expectedStart)) return null;
    const id = this.next++;
    this.watched.set(id, pid);
    return { id, start };
  }
  unwatch(id: number) {
    this.watched.delete(id);
  }
  close() {
    this.closed = true;
  }
  /** The process exits: the addon calls back once per watch of it. */
  exit(pid: number) {
    this.alive.delete(pid);
    for (const [id, p] of [...this.watched]) {
      if (p !== pid) continue;
      this.watched.delete(id);
      this.onExit(id);
    }
  }
}

function setup(t: { teardown: (fn: () => void) => void }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-inits-'));
  const catalog = new Catalog(path.join(dir, 'catalog.db'));
  catalog.putImage({ name: 'base', rootfs: '/nowhere', source: 'test', size_bytes: 0, created_at: 0, deleted: 0 });
  const killed: string[] = [];
  const alive = new Map<number, number>();
  let fake!: FakeWatcher;
  // One queue for every sandbox is enough to order the test's steps.
  let chain: Promise<unknown> = Promise.resolve();
  const withLock = <T>(_id: string, fn: () => Promise<T>): Promise<T> => {
    const next = chain.then(fn);
    chain = next.catch(() => undefined);
    return next;
  };
  const runtime = {
    killProcesses: async (id: string) => void killed.push(id),
    destroy: async (id: string) => void killed.push(`destroy:${id}`),
  };
  const inits = new InitWatcher(
    catalog,
    runtime,
    withLock,
    pino({ level: 'silent' }),
    (onExit) => (fake = new FakeWatcher(alive, onExit)),
  );
  t.teardown(() => {
    catalog.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const sandbox = (id: string, pid: number, start: number): SandboxRow => {
    alive.set(pid, start);
    catalog.insertSandbox({
      id,
      tenant: null,
      image: 'base',
      runtime_layer: 'rt',
      state: 'running',
      init_pid: pid,
      init_start: start,
      memory_bytes: null,
      pids_max: null,
      hostname: id,
      lineage_id: 'lin',
      branch_id: 'br',
      head_checkpoint_id: null,
      forked_from: null,
      env: '{}',
      metadata: '{}',
      created_at: 0,
      expires_at: null,
      instance: id,
      cpu_weight: null,
      cpu_quota_us: null,
      io_weight: null,
      disk_bytes: null,
      id_base: null,
    });
    return catalog.sandbox(id)!;
  };
  return { catalog, inits, alive, killed, sandbox, fake: () => fake };
}

test('an init that exits on its own stops its sandbox, clears the pid and removes what is left', async (t) => {
  const { catalog, inits, killed, sandbox, fake } = setup(t);
  sandbox('sbx_a', 100, 5);
  catalog.setStandby('sbx_a', { instance: 'sbx_a.st', checkpoint: 'ckpt_1', pid: 300, start: 7, at: 0 });
  t.true(inits.track(catalog.sandbox('sbx_a')!));
  t.true(inits.track(sandbox('sbx_b', 200, 6)));
  fake().exit(100);
  await inits.settled();
  t.like(catalog.sandbox('sbx_a'), {
    state: 'stopped',
    init_pid: null,
    init_start: null,
  });
  t.is(catalog.standby('sbx_a'), undefined);
  t.like(catalog.sandbox('sbx_b'), { state: 'running', init_pid: 200 });
  t.deepEqual(killed, ['sbx_a', 'destroy:sbx_a.st']);
});

test('an exit after a rollback replaced the init changes nothing, and the new init is watched', async (t) => {
  const { catalog, inits, alive, sandbox, fake } = setup(t);
  inits.track(sandbox('sbx_a', 100, 5));
  // Another manager rolled back: the row names a new init before the old one's exit is handled.
  alive.set(400, 9);
  catalog.updateSandbox('sbx_a', { init_pid: 400, init_start: 9 });
  fake().exit(100);
  await inits.settled();
  t.like(catalog.sandbox('sbx_a'), { state: 'running', init_pid: 400, init_start: 9 });
  t.deepEqual([...fake().watched.values()], [400]);
  fake().exit(400);
  await inits.settled();
  t.like(catalog.sandbox('sbx_a'), { state: 'stopped', init_pid: null });
});

test('a sandbox being removed is not marked stopped, and an untracked one is not watched', async (t) => {
  const { catalog, inits, killed, sandbox, fake } = setup(t);
  inits.track(sandbox('sbx_a', 100, 5));
  catalog.updateSandbox('sbx_a', { state: 'removing' });
  fake().exit(100);
  await inits.settled();
  t.is(catalog.sandbox('sbx_a')!.state, 'removing');
  inits.track(sandbox('sbx_b', 200, 6));
  inits.untrack('sbx_b');
  t.deepEqual([...fake().watched.values()], []);
  t.deepEqual(killed, []);
});

test('a row whose pid now belongs to another process (start time differs) is not watched and is stopped', async (t) => {
  const { catalog, inits, alive, sandbox } = setup(t);
  const row = sandbox('sbx_a', 100, 5);
  alive.set(100, 77); // pid 100 reused by a process that started later
  t.false(inits.track(row));
  await inits.settled();
  t.like(catalog.sandbox('sbx_a'), { state: 'stopped', init_pid: null });
});

test('close stops the watcher; exits already seen still reach the catalog; later tracking is inert', async (t) => {
  const { catalog, inits, sandbox, fake } = setup(t);
  inits.track(sandbox('sbx_a', 100, 5));
  const watcher = fake();
  watcher.exit(100);
  await inits.close();
  t.true(watcher.closed);
  t.is(catalog.sandbox('sbx_a')!.state, 'stopped');
  await inits.close(); // idempotent
  t.true(inits.track(sandbox('sbx_b', 200, 6)), 'a running row is taken at its word once closing');
  t.is(fake(), watcher, 'no new watcher after close');
});

test('trackSoon watches the row as it is after the current turn; an init already gone is stopped; nothing after close', async (t) => {
  const { catalog, inits, alive, sandbox, fake } = setup(t);
  inits.track(sandbox('sbx_a', 100, 5));
  alive.set(400, 9);
  catalog.updateSandbox('sbx_a', { init_pid: 400, init_start: 9 });
  inits.trackSoon('sbx_a');
  t.deepEqual([...fake().watched.values()], [100]); // not yet: the caller answers first
  await new Promise((r) => setImmediate(r));
  t.deepEqual([...fake().watched.values()], [400]);
  // The new init exited before its watch began: the row is stopped all the same.
  sandbox('sbx_b', 500, 3);
  alive.delete(500);
  inits.trackSoon('sbx_b');
  await new Promise((r) => setImmediate(r));
  await inits.settled();
  t.like(catalog.sandbox('sbx_b'), { state: 'stopped', init_pid: null });
  // Queued, then the manager closes (and its catalog with it): nothing runs.
  alive.set(600, 4);
  catalog.updateSandbox('sbx_a', { init_pid: 600, init_start: 4 });
  inits.trackSoon('sbx_a');
  await inits.close();
  await new Promise((r) => setImmediate(r));
  t.deepEqual([...fake().watched.values()], [400]);
});
