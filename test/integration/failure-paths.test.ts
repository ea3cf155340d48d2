/**
 * Failure paths (issue 9 §6): a rollback whose commit fails leaves the
 * sandbox running as it was (warm standby path) or honestly stopped at the
 * checkpoint (restore path), with no journal entry left over; a
 * Lockstep.open that fails half-way lets go of the lock and the database; a
 * sandbox whose removal was interrupted is torn down by the reaper through
 * the same path as `rm`, context snapshots included.
 *
 * Failures are injected with a fault hook that throws at a named point
 * (src/faults.ts), so each operation's own error handling runs in process.
 */
import fs from 'node:fs';
import test from 'ava';
import { Lockstep } from '../../src/index.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { destroyHome, freshHome, integration, openTestLockstep } from '../helpers/harness.js';
import { hostState, sameProcessAlive, sandboxPids } from '../fixtures/host-state.js';

/** A fault hook that throws once at the point it is armed with. */
function injector() {
  let armed: string | undefined;
  return {
    arm(point: string) {
      armed = point;
    },
    hook(point: string) {
      if (point !== armed) return;
      armed = undefined;
      throw new Error(`injected fault at ${point}`);
    },
  };
}

/** Paths this process has open, from the kernel. */
function openPaths(): string[] {
  return fs.readdirSync('/proc/self/fd').flatMap((fd) => {
    try {
      return [fs.readlinkSync(`/proc/self/fd/${fd}`)];
    } catch {
      return [];
    }
  });
}

function contextCounts(ls: Lockstep): { snapshots: number; items: number } {
  const n = (sql: string) => (ls.engine.catalog.db.prepare(sql).get() as { n: number }).n;
  return {
    snapshots: n('SELECT count(*) AS n FROM agent_context_snapshots'),
    items: n('SELECT count(*) AS n FROM agent_context_items'),
  };
}

const context = { format: 'openai-chat', messages: [{ role: 'user', content: 'remember this' }] };

integration(test, () => {
  const standbyCommitFails = test.macro({
    async exec(t, point: string) {
      const faults = injector();
      const ls = await openTestLockstep(t, { open: { fault: (p) => faults.hook(p) } });
      const sb = await ls.create({ memoryMb: 64 });
      await sb.files.write('/workspace/f', 'at the checkpoint\n');
      const ckpt = await sb.checkpoint({ label: 'c' });
      await sb.settled();
      const before = ls.engine.catalog.sandbox(sb.id)!;
      t.is(ls.engine.catalog.standby(sb.id)?.checkpoint, ckpt.id, 'a warm standby of the checkpoint is ready');
      await sb.files.write('/workspace/f', 'after the checkpoint\n');
      const sleeper = await sb.commands.spawn(['sleep', '1000']);

      faults.arm(point);
      await t.throwsAsync(sb.rollback(ckpt.id), { message: `injected fault at ${point}` });

      // Still the old sandbox, running, right now (not after the next exclusive open).
      const row = ls.engine.catalog.sandbox(sb.id)!;
      t.like(row, {
        state: 'running',
        instance: before.instance,
        init_pid: before.init_pid,
        branch_id: before.branch_id,
        head_checkpoint_id: before.head_checkpoint_id,
      });
      t.deepEqual(ls.engine.catalog.operations(), []);
      t.false(ls.engine.cgroups.isFrozen(ls.engine.runtime.cgroupName(row.instance)), 'the old tree is thawed');
      t.like(await sb.commands.run(`cat /workspace/f; kill -0 ${sleeper} && echo sleeper-alive`), {
        exitCode: 0,
        stdout: 'after the checkpoint\nsleeper-alive\n',
      });
      // The standby is untouched, so the next try is still a swap.
      const standby = ls.engine.catalog.standby(sb.id)!;
      t.is(standby.checkpoint, ckpt.id);
      t.true(sameProcessAlive(standby.pid!, standby.start));

      const report = await sb.rollback(ckpt.id);
      t.is(report.path, 'standby');
      t.like(await sb.commands.run('cat /workspace/f'), { exitCode: 0, stdout: 'at the checkpoint\n' });
      await sb.settled();
      t.deepEqual(sandboxPids(ls, before.instance), [], 'the replaced tree is gone');
    },
    title: (_p, point) =>
      `a standby rollback failing at ${point} thaws the old tree and leaves the row running and true`,
  });
  test.serial(standbyCommitFails, 'rollback:killed');
  test.serial(standbyCommitFails, 'rollback:commit');

  test.serial(
    'a restore rollback whose commit fails leaves the sandbox stopped at the checkpoint, and a new rollback starts it',
    async (t) => {
      const faults = injector();
      const ls = await openTestLockstep(t, { open: { fault: (p) => faults.hook(p) } });
      const sb = await ls.create({ memoryMb: 64 });
      await sb.files.write('/workspace/f', 'at the checkpoint\n');
      const ckpt = await sb.checkpoint({ label: 'c' });
      await sb.settled();
      await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      await sb.files.write('/workspace/f', 'after the checkpoint\n');

      faults.arm('rollback:commit');
      await t.throwsAsync(sb.rollback(ckpt.id), { message: 'injected fault at rollback:commit' });
      const row = ls.engine.catalog.sandbox(sb.id)!;
      t.like(row, { state: 'stopped', init_pid: null, head_checkpoint_id: ckpt.id });
      t.deepEqual(ls.engine.catalog.operations(), []);
      t.deepEqual(sandboxPids(ls, row.instance), [], 'the restored tree that could not be recorded was stopped');
      await t.throwsAsync(sb.commands.run('true'), { code: 'SANDBOX_NOT_RUNNING' });

      const report = await sb.rollback(ckpt.id);
      t.is(report.path, 'restore');
      t.is(sb.info().state, 'running');
      t.like(await sb.commands.run('cat /workspace/f'), { exitCode: 0, stdout: 'at the checkpoint\n' });
    },
  );

  const openUnwinds = test.macro({
    async exec(t, point: string) {
      const home = freshHome('open');
      t.teardown(() => destroyHome(home));
      const faults = injector();
      faults.arm(point);
      await t.throwsAsync(Lockstep.open({ home, fault: (p) => faults.hook(p) }), {
        message: `injected fault at ${point}`,
      });
      const held = openPaths().filter((p) => p.startsWith(home));
      t.deepEqual(held, [], 'no lock file or database handle kept');
      // Nobody holds the lock: the next manager gets it exclusively at once and runs the reaper.
      const ls = await Lockstep.open({ home });
      t.not(ls.reaped, null);
      await ls.close();
    },
    title: (_p, point) => `Lockstep.open failing at ${point} releases the lock and closes the database`,
  });
  test.serial(openUnwinds, 'open:catalog');
  test.serial(openUnwinds, 'open:reaped');

  test.serial(
    'a removal interrupted after it began is finished by the reaper, context snapshots included',
    async (t) => {
      const faults = injector();
      const home = freshHome();
      const ls = await openTestLockstep(t, { home, open: { fault: (p) => faults.hook(p) } });
      const empty = contextCounts(ls);
      const sb = await ls.create({ memoryMb: 64 });
      const ckpt = await sb.checkpoint({ label: 'with context', context });
      await sb.settled();
      t.not(ckpt.contextId, null);
      t.true(contextCounts(ls).snapshots > empty.snapshots);

      faults.arm('remove:marked');
      await t.throwsAsync(ls.remove(sb.id), { message: 'injected fault at remove:marked' });
      t.is(ls.engine.catalog.sandbox(sb.id)?.state, 'removing');
      await ls.close();

      const next = await Lockstep.open({ home });
      t.teardown(() => next.close());
      t.deepEqual(next.reaped?.sandboxes, [sb.id]);
      t.deepEqual(contextCounts(next), empty, 'the checkpoint context snapshot was released');
      t.deepEqual(next.engine.catalog.allCheckpoints(), []);
      t.like(hostState(next), {
        catalogRows: [],
        runFolders: [],
        mounts: [],
        cgroups: [],
        uppers: [],
        layers: [],
        processImages: [],
      });
    },
  );
});
