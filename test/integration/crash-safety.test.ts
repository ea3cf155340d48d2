/**
 * Crash safety (issue 3 §6): a manager killed with SIGKILL at every fault
 * point of checkpoint, rollback and fork (src/faults.ts) leaves a state
 * directory that, once reopened, has a consistent catalog, every sandbox
 * entirely in its old state or entirely in its new one (files and processes
 * from the same side, never a mixture), and nothing orphaned on the host.
 *
 * Each crash happens in a child process (test/fixtures/crash-runner.mjs)
 * sharing this file's state directory; the test then closes its own manager
 * and reopens the directory, which runs the reaper.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import { Lockstep, type CheckpointInfo, type Sandbox } from '../../src/index.js';
import { FAULT_POINTS } from '../../src/faults.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { listDir, mountPointsUnder } from '../fixtures/host-state.js';
import {
  counterInLayer,
  counterValue,
  hostPath,
  setTag,
  startCounter,
  startMemo,
  tagInMemory,
  waitCounter,
} from '../fixtures/stub-workloads.js';

const RUNNER = fileURLToPath(new URL('../../../test/fixtures/crash-runner.mjs', import.meta.url));

interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

/** Runs the crash runner with LOCKSTEP_FAULT set; resolves when it is gone. */
function crashRunner(fault: string, args: string[]): Promise<ChildExit> {
  return new Promise((resolve, reject) => {
    // checkpoint:persisted is on the path only when durability comes before the commit.
    const durableLater = fault === 'checkpoint:persisted' ? { LOCKSTEP_DURABLE_LATER: 'off' } : {};
    const child = spawn(process.execPath, [RUNNER, ...args], {
      env: { ...process.env, LOCKSTEP_FAULT: fault, ...durableLater },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (b: Buffer) => (output += b.toString()));
    child.stderr.on('data', (b: Buffer) => (output += b.toString()));
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, output: output.slice(-4000) }));
  });
}

integration(test, () => {
  let ls: Lockstep;
  let home: string;
  let sb: Sandbox;
  /** The checkpoint rollbacks and forks target, its counter value and its in-memory tag. */
  let target: CheckpointInfo;
  let atTarget: number;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
    home = ls.home;
    sb = await ls.create({ image: 'base' });
    await startCounter(sb, ls);
    await startMemo(sb, ls);
    await setTag(ls, sb.id, 'T');
    await sb.files.write('/workspace/at-T', 'written before T\n');
    await waitCounter(ls, sb.id, (v) => v >= 5);
    target = await sb.checkpoint({ label: 'T' });
    target = await sb.durable(target.id); // what each test reads as "before" is T's final record
    atTarget = await counterInLayer(ls, target);
  });
  test.after.always(async () => {
    await ls?.close();
    for (const fn of teardowns.reverse()) await fn();
  });

  /** Closes this manager and opens the state directory again: the reaper runs. */
  async function reopen(): Promise<Lockstep> {
    await ls.close();
    ls = await Lockstep.open({ home });
    sb = ls.get(sb.id);
    return ls;
  }

  /** Runs one operation in a child killed at `fault`; asserts the fault point was reached, then reopens. */
  async function crashAt(
    t: ExecutionContext,
    fault: string,
    op: 'checkpoint' | 'rollback' | 'fork' | 'snapshot' | 'delete-snapshot' | 'import-snapshot',
    ...args: string[]
  ): Promise<void> {
    await crashOnly(t, fault, op, ...args);
    await reopen();
  }

  /** crashAt without the reopen, for tests that change what the reaper will find first. */
  async function crashOnly(
    t: ExecutionContext,
    fault: string,
    op: 'checkpoint' | 'rollback' | 'fork' | 'snapshot' | 'delete-snapshot' | 'import-snapshot',
    ...args: string[]
  ): Promise<void> {
    await sb.settled(); // no background work of ours may race the child
    const exit = await crashRunner(fault, [op, home, ...args]);
    t.is(exit.signal, 'SIGKILL', `the manager died at ${fault} (exit ${exit.code}):\n${exit.output}`);
  }

  /**
   * The catalog and the host agree: no journal entries left; every run
   * folder, writable layer, cgroup and mount belongs to an instance the
   * catalog knows (a sandbox's current one or its warm standby) and every
   * such instance has them all; checkpoint layers and process images are
   * exactly those of committed checkpoints; every sandbox runs, thawed.
   */
  function assertConsistent(t: ExecutionContext): void {
    const { catalog, paths, runtime, cgroups } = ls.engine;
    t.deepEqual(catalog.operations(), [], 'no unfinished operation in the journal');
    const keys = [...catalog.instanceKeys()].sort();
    t.deepEqual(listDir(paths.uppers), keys, 'writable layers');
    t.deepEqual(listDir(paths.sandboxesRun, true), keys, 'run folders');
    const controllers = cgroups.version === 2 ? [''] : ['pids', 'memory', 'freezer'];
    for (const c of controllers)
      t.deepEqual(
        listDir(path.join('/sys/fs/cgroup', c, runtime.cgroupGroup), true),
        keys,
        `cgroups (${c || 'unified'})`,
      );
    const mounts = mountPointsUnder(paths.sandboxesRun).filter((m) => m !== paths.sandboxesRun);
    t.deepEqual(
      [...new Set(mounts.map((m) => path.relative(paths.sandboxesRun, m).split('/')[0]!))].sort(),
      keys,
      'mounts',
    );
    for (const k of keys) t.true(mounts.includes(paths.sandboxRoot(k)), `root of ${k} mounted`);
    // Exactly the layers and images of committed checkpoints and of snapshots.
    const ckpts = catalog.allCheckpoints();
    const snaps = catalog.db.prepare('SELECT layer_id, process_image FROM snapshots').all() as {
      layer_id: string;
      process_image: string;
    }[];
    const uniq = (xs: string[]) => [...new Set(xs)].sort();
    t.deepEqual(
      listDir(paths.layers),
      uniq([...ckpts.map((c) => c.layer_id), ...snaps.map((s) => s.layer_id)]),
      'layers',
    );
    t.deepEqual(
      listDir(paths.processImages),
      uniq([...ckpts.map((c) => c.id), ...snaps.map((s) => s.process_image)]),
      'process images',
    );
    t.deepEqual(listDir(paths.scratch), []);
    for (const row of catalog.allSandboxes()) {
      t.is(row.state, 'running', `${row.id} runs`);
      t.false(cgroups.isFrozen(runtime.cgroupName(row.instance)), `${row.id} is thawed`);
    }
  }

  /** The sandbox runs: a command works and the counter advances from at least `from`. */
  async function assertRunning(t: ExecutionContext, s: Sandbox): Promise<number> {
    t.is((await s.commands.run('echo alive')).stdout, 'alive\n');
    const now = await counterValue(ls, s.id);
    return waitCounter(ls, s.id, (v) => v > now);
  }

  // The journal makes the outcome of each crash point certain: a checkpoint
  // or a fork exists only once its transaction committed; a rollback that got
  // past "begin" had started killing the old tree, so it is rolled forward.
  const checkpointCrash = test.macro({
    async exec(t, point: string) {
      const tag = `before-checkpoint-${point}`;
      await setTag(ls, sb.id, tag);
      const before = sb.checkpoints();
      const headBefore = sb.info().headCheckpointId;

      await crashAt(t, `checkpoint:${point}`, 'checkpoint', sb.id);

      t.deepEqual(ls.reaped?.operations, point === 'committed' ? [] : [`checkpoint:started:${sb.id}`]);
      assertConsistent(t);
      const after = sb.checkpoints();
      // Processes were never stopped for good: the same tree still runs, thawed, with its memory.
      t.is(await tagInMemory(ls, sb.id), tag);
      await assertRunning(t, sb);
      if (point === 'committed') {
        t.is(after.length, before.length + 1);
        const made = after.at(-1)!;
        t.like(made, { label: 'crash', parentId: headBefore });
        t.is(sb.info().headCheckpointId, made.id);
        t.true(
          fs.existsSync(ls.engine.paths.layer(made.layerId)) && fs.existsSync(ls.engine.paths.processImage(made.id)),
        );
        await setTag(ls, sb.id, 'moved on');
        const report = await sb.rollback(made.id);
        t.is(report.checkpointId, made.id);
        t.is(await tagInMemory(ls, sb.id), tag, 'rolling back to the committed checkpoint works');
      } else {
        t.deepEqual(after, before, 'no checkpoint');
        t.is(sb.info().headCheckpointId, headBefore);
      }
    },
    title: (_p, point) =>
      `kill -9 at checkpoint:${point} leaves the checkpoint ${point === 'committed' ? 'complete' : 'absent'} and the sandbox running`,
  });
  for (const point of FAULT_POINTS.checkpoint) test.serial(checkpointCrash, point);

  // Past its commit a checkpoint can be rolled back to; its files are made
  // durable and checksummed in the background. A crash there leaves them
  // whole in the page cache (same boot): the reaper syncs, checksums and
  // records them, and a CRIU restore from it verifies against those.
  const durableCrash = test.macro({
    async exec(t, point: string) {
      const tag = `before-durable-${point}`;
      await setTag(ls, sb.id, tag);
      const before = sb.checkpoints();
      const headBefore = sb.info().headCheckpointId;

      await crashAt(t, `durable:${point}`, 'checkpoint', sb.id);

      t.deepEqual(ls.reaped?.operations, [], 'the checkpoint had committed');
      assertConsistent(t);
      const after = sb.checkpoints();
      t.is(after.length, before.length + 1);
      const made = after.at(-1)!;
      t.like(made, { label: 'crash', parentId: headBefore });
      t.is(sb.info().headCheckpointId, made.id);
      // At `committed` the record was written; before it, the reaper wrote it.
      t.deepEqual(ls.reaped?.checkpoints, point === 'committed' ? [] : [`durable:${made.id}`]);
      t.not(made.durableAt, null, 'the checkpoint is durable once the reaper has run');
      const checksums = JSON.parse(ls.engine.catalog.checkpoint(made.id)!.checksums!) as { images: object };
      t.true(Object.keys(checksums.images).length > 0, 'its process image files have checksums');
      t.is(await tagInMemory(ls, sb.id), tag);
      await assertRunning(t, sb);
      // No standby was made by the dead manager: this rollback is a CRIU restore, verified first.
      t.not(ls.engine.catalog.standby(sb.id)?.checkpoint ?? null, made.id);
      await setTag(ls, sb.id, 'moved on');
      t.is((await sb.rollback(made.id)).checkpointId, made.id);
      t.is(await tagInMemory(ls, sb.id), tag, 'rolling back to the recovered checkpoint works');
      await assertRunning(t, sb);
    },
    title: (_p, point) => `kill -9 at durable:${point} leaves the checkpoint complete, durable and verified`,
  });
  for (const point of FAULT_POINTS.durable) test.serial(durableCrash, point);

  test.serial(
    'a checkpoint not yet durable when the host restarted is dropped whole, and its parent is head again',
    async (t) => {
      const tag = 'before-restart';
      await setTag(ls, sb.id, tag);
      const before = sb.checkpoints();
      const headBefore = sb.info().headCheckpointId!;
      await crashOnly(t, 'durable:begin', 'checkpoint', sb.id);
      // The catalog (synchronous=FULL) outlives a restart; the unsynced files
      // may not. Model the restart by the boot the row names.
      const pending = ls.engine.catalog.pendingCheckpoints(sb.id);
      t.is(pending.length, 1, 'the crashed manager left one pending checkpoint');
      const lost = pending[0]!;
      ls.engine.catalog.db.prepare('UPDATE checkpoints SET boot_id = ? WHERE id = ?').run('an-earlier-boot', lost.id);
      await reopen();

      t.deepEqual(ls.reaped?.checkpoints, [`dropped:${lost.id}`]);
      assertConsistent(t); // its layer and process image are gone with its row
      t.deepEqual(sb.checkpoints(), before, 'no trace of the dropped checkpoint');
      t.is(sb.info().headCheckpointId, headBefore, 'its parent is the head again');
      t.false(fs.existsSync(ls.engine.paths.layer(lost.layer_id)));
      t.false(fs.existsSync(ls.engine.paths.processImage(lost.id)));
      // The parent still restores whole.
      await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      t.is((await sb.rollback(headBefore)).checkpointId, headBefore);
      await assertRunning(t, sb);
    },
  );

  const rollbackCrash = test.macro({
    async exec(t, via: 'restore' | 'standby', point: string) {
      // Start from T, with a warm standby of T or none, then move away from it.
      if (via === 'standby') {
        await sb.rollback(target.id);
        await sb.settled();
        t.is(ls.engine.catalog.standby(sb.id)?.checkpoint ?? null, target.id, 'a warm standby of T is ready');
      } else {
        await sb.settled();
        await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      }
      const tag = `after-T-${via}-${point}`;
      await setTag(ls, sb.id, tag);
      await sb.files.write('/workspace/after-T', `${tag}\n`);
      const preCrash = await waitCounter(ls, sb.id, (v) => v >= atTarget + 30);
      const before = sb.info();

      await crashAt(t, `rollback:${point}`, 'rollback', sb.id, target.id);

      // The counter first: it keeps moving while the rest is checked.
      const counter = await waitCounter(ls, sb.id, (v) => v > atTarget);
      const phase = point === 'begin' ? 'prepared' : 'killing';
      t.deepEqual(ls.reaped?.operations, point === 'committed' ? [] : [`rollback:${phase}:${sb.id}`]);
      assertConsistent(t);
      const info = sb.info();
      const marker = fs.existsSync(hostPath(ls, sb.id, '/workspace/after-T'));
      const memory = await tagInMemory(ls, sb.id);
      t.is(fs.readFileSync(hostPath(ls, sb.id, '/workspace/at-T'), 'utf8'), 'written before T\n');
      if (point === 'begin') {
        // Entirely the old state: old files, old processes, old timeline.
        t.like(info, { headCheckpointId: before.headCheckpointId, branchId: before.branchId, pid: before.pid });
        t.true(marker, 'the file written after T is still there');
        t.is(memory, tag, 'the processes still hold what they held before the crash');
        t.true(counter >= preCrash, `the counter goes on from ${preCrash} (now ${counter})`);
      } else {
        // Entirely at T: T's files and T's processes, on a new timeline.
        t.is(info.headCheckpointId, target.id);
        t.not(info.branchId, before.branchId);
        t.false(marker, 'the file written after T is gone');
        t.is(memory, 'T', "the processes hold T's memory");
        t.true(counter < preCrash, `the counter restarted from ${atTarget}, not ${preCrash} (now ${counter})`);
      }
      await assertRunning(t, sb);
    },
    title: (_p, via, point) =>
      `kill -9 at rollback:${point} (${via} path) leaves the sandbox entirely ${point === 'begin' ? 'in its old state' : 'at the checkpoint'}`,
  });
  for (const point of FAULT_POINTS.rollback) test.serial(rollbackCrash, 'restore', point);
  // A rollback to a checkpoint with a warm standby swaps it in: it kills the
  // old tree and commits, with no layer reset, mount or CRIU restore between.
  for (const point of FAULT_POINTS.rollback.filter((p) => ['begin', 'killed', 'committed'].includes(p)))
    test.serial(rollbackCrash, 'standby', point);

  const forkCrash = test.macro({
    async exec(t, point: string) {
      const tag = `parent-${point}`;
      await setTag(ls, sb.id, tag);
      const before = sb.info();
      const sandboxesBefore = ls.list().map((s) => s.id);

      await crashAt(t, `fork:${point}`, 'fork', sb.id, target.id);

      const added = ls.list().filter((s) => !sandboxesBefore.includes(s.id));
      if (point === 'committed') {
        t.deepEqual(ls.reaped?.operations, []);
        t.is(added.length, 1, 'one complete fork');
        const fork = ls.get(added[0]!.id);
        t.teardown(() => ls.remove(fork.id).catch(() => undefined));
        t.like(fork.info(), { state: 'running', forkedFrom: target.id, lineageId: before.lineageId });
        t.is(await tagInMemory(ls, fork.id), 'T');
        t.false(await fork.files.exists('/workspace/after-T'));
        t.true((await waitCounter(ls, fork.id, (v) => v > atTarget)) > atTarget);
        await assertRunning(t, fork);
      } else {
        t.deepEqual(added, [], 'no fork');
        t.is(ls.reaped?.operations.length, 1);
        const [reaped] = ls.reaped!.operations;
        t.regex(reaped!, /^fork:started:sbx_/);
        t.is(
          ls.engine.catalog.sandbox(reaped!.split(':')[2]!),
          undefined,
          'the half-made fork is gone from the catalog',
        );
      }
      assertConsistent(t);
      // The parent is untouched either way.
      t.like(sb.info(), { headCheckpointId: before.headCheckpointId, branchId: before.branchId, pid: before.pid });
      t.is(await tagInMemory(ls, sb.id), tag);
      await assertRunning(t, sb);
    },
    title: (_p, point) =>
      `kill -9 at fork:${point} leaves ${point === 'committed' ? 'one complete running fork' : 'no fork and no orphans'}`,
  });
  for (const point of FAULT_POINTS.fork) test.serial(forkCrash, point);

  // Snapshots: making one writes no file (one transaction); deleting one drops the row before
  // the files; an import is journalled and commits in one transaction after it verified.
  const snapshotCrash = test.macro({
    async exec(t, point: string) {
      await crashAt(t, `snapshot:${point}`, 'snapshot', sb.id, target.id);
      assertConsistent(t);
      const made = ls.snapshots.list();
      if (point === 'committed') {
        t.is(made.length, 1, 'the snapshot exists whole');
        t.like(made[0], { name: 'crash', sourceCheckpointId: target.id });
        const started = await ls.create({ fromSnapshot: made[0]!.id });
        t.teardown(() => ls.remove(started.id).catch(() => undefined));
        t.is(await tagInMemory(ls, started.id), 'T', 'and starts sandboxes');
        await ls.remove(started.id);
        await ls.snapshots.delete(made[0]!.id);
      } else t.deepEqual(made, [], 'no snapshot, nothing of one');
      await assertRunning(t, sb);
    },
    title: (_p, point) =>
      `kill -9 at snapshot:${point} leaves the snapshot ${point === 'committed' ? 'complete' : 'absent'}`,
  });
  for (const point of FAULT_POINTS.snapshot) test.serial(snapshotCrash, point);

  test.serial(
    'kill -9 at deleteSnapshot:committed: the snapshot is gone, the files its checkpoint holds stay',
    async (t) => {
      const snap = await ls.snapshots.create(target.id);
      await crashAt(t, 'deleteSnapshot:committed', 'delete-snapshot', sb.id, snap.id);
      t.deepEqual(ls.snapshots.list(), []);
      assertConsistent(t);
      t.true(fs.existsSync(ls.engine.paths.layer(target.layerId)), "the checkpoint's layer stays");
      t.true(fs.existsSync(ls.engine.paths.processImage(target.id)), "the checkpoint's image stays");
    },
  );

  const importCrash = test.macro({
    async exec(t, point: string) {
      const snap = await ls.snapshots.create(target.id, { name: `export-${point}` });
      const file = path.join(path.dirname(home), `crash-bundle-${process.pid}-${point}`);
      t.teardown(() => fs.rmSync(file, { force: true }));
      await pipeline(ls.snapshots.export(snap.id), fs.createWriteStream(file));
      await ls.snapshots.delete(snap.id);
      await crashAt(t, `importSnapshot:${point}`, 'import-snapshot', sb.id, file);
      if (point === 'committed') t.deepEqual(ls.reaped?.operations, []);
      else {
        t.is(ls.reaped?.operations.length, 1);
        t.regex(ls.reaped!.operations[0]!, /^snapshot-import:receiving:snap_/, 'the journal named the import');
      }
      assertConsistent(t);
      const made = ls.snapshots.list();
      if (point === 'committed') {
        t.is(made.length, 1);
        t.is(made[0]!.name, 'crash-import');
        const started = await ls.create({ fromSnapshot: made[0]!.id });
        t.teardown(() => ls.remove(started.id).catch(() => undefined));
        t.is(await tagInMemory(ls, started.id), 'T');
        await ls.remove(started.id);
        await ls.snapshots.delete(made[0]!.id);
      } else t.deepEqual(made, [], 'nothing half-imported');
    },
    title: (_p, point) =>
      `kill -9 at importSnapshot:${point} leaves ${point === 'committed' ? 'the imported snapshot' : 'nothing of the import'}`,
  });
  for (const point of FAULT_POINTS.importSnapshot) test.serial(importCrash, point);
});
