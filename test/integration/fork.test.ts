/**
 * Fork on real sandboxes: forks start from a checkpoint's files and
 * processes and then diverge independently of each other and of their
 * parent; a fork that fails leaves nothing behind and does not sink the
 * others; forks can be forked again.
 */
import fs from 'node:fs';
import path from 'node:path';
import test, { type ExecutionContext } from 'ava';
import type { ForkResult, Lockstep, Sandbox } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { hostState, listDir, mountPointsUnder } from '../fixtures/host-state.js';
import {
  counterInLayer,
  counterValue,
  setTag,
  startCounter,
  startMemo,
  tagInMemory,
  waitCounter,
} from '../fixtures/stub-workloads.js';

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function parentSandbox(t: ExecutionContext, tag: string): Promise<Sandbox> {
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    await startCounter(sb, ls);
    await startMemo(sb, ls);
    await setTag(ls, sb.id, tag);
    return sb;
  }

  /** The sandboxes of successful results, each removed after the test. */
  function forksOf(t: ExecutionContext, results: ForkResult[]): Sandbox[] {
    const ok = results.filter((r): r is Extract<ForkResult, { ok: true }> => r.ok);
    for (const r of ok) t.teardown(() => ls.remove(r.id).catch(() => undefined));
    return ok.map((r) => ls.get(r.id));
  }

  /** Everything on the host and in the catalog, once background work (warm standbys) has settled. */
  async function settledState(...sbs: Sandbox[]) {
    for (const sb of sbs) await sb.settled();
    return hostState(ls);
  }

  test.serial('forks diverge independently of each other and of their parent', async (t) => {
    const parent = await parentSandbox(t, 'parent');
    await parent.files.write('/workspace/shared.txt', 'from the parent');
    await waitCounter(ls, parent.id, (v) => v >= 5);
    const ckpt = await parent.checkpoint({ label: 'fork point' });
    const atCheckpoint = await counterInLayer(ls, ckpt);
    const parentBefore = await waitCounter(ls, parent.id, (v) => v >= atCheckpoint + 40);
    const parentInfo = parent.info();

    const results = await parent.fork(ckpt.id, { count: 3 });
    t.is(results.length, 3);
    t.true(
      results.every((r) => r.ok),
      JSON.stringify(results),
    );
    const forks = forksOf(t, results);
    t.is(new Set(forks.map((f) => f.id)).size, 3);

    // Each fork's counter continues from the checkpoint's value, not from the parent's current one.
    for (const [i, f] of forks.entries()) {
      const v = await waitCounter(ls, f.id, (x) => x > atCheckpoint);
      t.true(v < parentBefore, `fork ${i} counter ${v} continues from ${atCheckpoint}, not ${parentBefore}`);
    }
    for (const f of forks) {
      const info = f.info();
      t.is(info.state, 'running');
      t.is(info.forkedFrom, ckpt.id);
      t.is(info.lineageId, parentInfo.lineageId);
      t.not(info.branchId, parentInfo.branchId);
      t.is(await tagInMemory(ls, f.id), 'parent');
      t.is((await f.files.read('/workspace/shared.txt')).content.toString(), 'from the parent');
    }
    // Diverge: each fork gets its own file and its own in-memory tag.
    for (const [i, f] of forks.entries()) {
      await f.files.write(`/workspace/fork-${i}.txt`, `fork ${i}`);
      await setTag(ls, f.id, `fork-${i}`);
    }
    for (const [i, f] of forks.entries()) {
      const names = (await f.commands.run('ls /workspace')).stdout.split('\n').filter(Boolean);
      t.deepEqual(names, [`fork-${i}.txt`, 'shared.txt'], `fork ${i} sees only its own file`);
      t.is(await tagInMemory(ls, f.id), `fork-${i}`);
    }
    // The parent is unaffected: same files, same memory, same timeline, counter never reset.
    t.deepEqual((await parent.commands.run('ls /workspace')).stdout, 'shared.txt\n');
    t.is(await tagInMemory(ls, parent.id), 'parent');
    t.true((await counterValue(ls, parent.id)) >= parentBefore);
    t.like(parent.info(), {
      headCheckpointId: ckpt.id,
      branchId: parentInfo.branchId,
      pid: parentInfo.pid,
      state: 'running',
    });

    // Removing one fork leaves the others and the parent running as they were.
    const [gone, ...kept] = forks as [Sandbox, ...Sandbox[]];
    const goneInstance = ls.engine.catalog.sandbox(gone.id)!.instance;
    await ls.remove(gone.id);
    t.throws(() => ls.get(gone.id), { code: 'SANDBOX_NOT_FOUND' });
    t.false(fs.existsSync(ls.engine.paths.upper(goneInstance)));
    t.false(fs.existsSync(ls.engine.paths.sandboxRun(goneInstance)));
    t.deepEqual(mountPointsUnder(ls.engine.paths.sandboxRun(goneInstance)), []);
    for (const [j, f] of kept.entries()) {
      const i = j + 1;
      const now = await counterValue(ls, f.id);
      t.true((await waitCounter(ls, f.id, (x) => x > now)) > now, `fork ${i} still counts`);
      t.is(await tagInMemory(ls, f.id), `fork-${i}`);
      t.is((await f.files.read(`/workspace/fork-${i}.txt`)).content.toString(), `fork ${i}`);
    }
    const now = await counterValue(ls, parent.id);
    t.true((await waitCounter(ls, parent.id, (x) => x > now)) > now, 'the parent still counts');
    const listed = new Set(ls.list().map((s) => s.id));
    t.deepEqual(
      forks.map((f) => f.id).filter((id) => listed.has(id)),
      kept.map((k) => k.id),
    );
  });

  const refusedCount = test.macro({
    async exec(t, count: unknown) {
      const parent = await parentSandbox(t, 'p');
      const ckpt = await parent.checkpoint();
      const before = await settledState(parent);
      await t.throwsAsync(parent.fork(ckpt.id, { count: count as number }), { code: 'INVALID_ARGUMENT' });
      t.deepEqual(hostState(ls), before, 'nothing was created');
    },
    title: (_provided, count) => `fork count ${JSON.stringify(count)} is rejected up front with INVALID_ARGUMENT`,
  });
  for (const count of [0, 65, 2.5, '3']) test.serial(refusedCount, count);

  test.serial(
    'forks from a damaged process image are refused up front with CHECKPOINT_CORRUPT and leave nothing behind',
    async (t) => {
      const parent = await parentSandbox(t, 'damaged');
      const ckpt = await parent.checkpoint();
      const pstree = path.join(ls.engine.paths.processImage(ckpt.id), 'pstree.img');
      const before = await settledState(parent);
      fs.renameSync(pstree, pstree + '.away');
      t.teardown(() => (fs.existsSync(pstree + '.away') ? fs.renameSync(pstree + '.away', pstree) : undefined));

      // The checksums recorded at checkpoint time catch it before any fork starts.
      const err = await t.throwsAsync(parent.fork(ckpt.id, { count: 3 }), { code: 'CHECKPOINT_CORRUPT' });
      t.like((err as unknown as { details: object }).details, {
        checkpointId: ckpt.id,
        file: 'process image file pstree.img.away',
      });
      t.deepEqual(hostState(ls), before, 'no sandboxes, mounts, cgroups, layers or scratch left');
      t.is(ls.list().length, before.catalogRows.length);

      // The checkpoint itself is fine once its image is whole again.
      fs.renameSync(pstree + '.away', pstree);
      const [again] = forksOf(t, await parent.fork(ckpt.id));
      t.is(await tagInMemory(ls, again!.id), 'damaged');
    },
  );

  test.serial('a fork from a checkpoint whose process image is gone is refused with CHECKPOINT_DAMAGED', async (t) => {
    const parent = await parentSandbox(t, 'gone');
    const ckpt = await parent.checkpoint();
    const before = await settledState(parent);
    const dir = ls.engine.paths.processImage(ckpt.id);
    fs.renameSync(dir, dir + '.away');
    t.teardown(() => (fs.existsSync(dir + '.away') ? fs.renameSync(dir + '.away', dir) : undefined));
    await t.throwsAsync(parent.fork(ckpt.id, { count: 2 }), { code: 'CHECKPOINT_DAMAGED' });
    fs.renameSync(dir + '.away', dir);
    t.deepEqual(hostState(ls), before);
  });

  test.serial('a failed fork does not sink the others started with it', async (t) => {
    const parent = await parentSandbox(t, 'mixed');
    const ckpt = await parent.checkpoint();
    const pstree = path.join(ls.engine.paths.processImage(ckpt.id), 'pstree.img');
    const before = await settledState(parent);
    t.teardown(() => (fs.existsSync(pstree + '.away') ? fs.renameSync(pstree + '.away', pstree) : undefined));

    // Forks run four at a time; the image breaks as soon as the first one is
    // done, so forks 5 and 6 (started after that) certainly fail, the first
    // to finish certainly succeeded, and forks 2-4 go either way.
    const results = await parent.fork(ckpt.id, {
      count: 6,
      onProgress: (done) => {
        if (done === 1) fs.renameSync(pstree, pstree + '.away');
      },
    });
    t.is(results.length, 6);
    const forks = forksOf(t, results);
    t.true(forks.length >= 1);
    t.like(results[4], { ok: false, error: { code: 'CRIU_RESTORE_FAILED' } });
    t.like(results[5], { ok: false, error: { code: 'CRIU_RESTORE_FAILED' } });
    for (const r of results) if (!r.ok) t.is(typeof r.error.message, 'string');
    for (const f of forks) {
      t.is(f.info().state, 'running');
      t.is(await tagInMemory(ls, f.id), 'mixed');
    }
    // Exactly the successful forks were added; the failed ones left nothing.
    const after = hostState(ls);
    const okIds = forks.map((f) => f.id).sort();
    t.deepEqual(after.catalogRows, [...before.catalogRows, ...okIds.map((id) => `${id}:running`)].sort());
    t.deepEqual(after.uppers, [...before.uppers, ...okIds].sort());
    t.deepEqual(after.runFolders, [...before.runFolders, ...okIds].sort());
    t.deepEqual(
      after.cgroups,
      [...before.cgroups, ...okIds.flatMap((id) => ['freezer', 'memory', 'pids'].map((c) => `${c}:${id}`))].sort(),
    );
    t.deepEqual(after.layers, before.layers);
    t.deepEqual(after.processImages, before.processImages);
    t.deepEqual(after.scratch, []);
  });

  test.serial(
    'forks of a fork inherit its state; removing the middle generation leaves the last one running',
    async (t) => {
      const parent = await parentSandbox(t, 'gen0');
      const c0 = await parent.checkpoint({ label: 'gen0' });
      const [a] = forksOf(t, await parent.fork(c0.id));
      await a!.files.write('/workspace/a.txt', 'written in fork A\n');
      await setTag(ls, a!.id, 'gen1');
      const cA = await a!.checkpoint({ label: 'gen1' });
      const atCA = await counterInLayer(ls, cA);
      const grandchildren = forksOf(t, await a!.fork(cA.id, { count: 2 }));
      t.is(grandchildren.length, 2);

      for (const g of grandchildren) {
        t.like(g.info(), { forkedFrom: cA.id, lineageId: parent.info().lineageId, state: 'running' });
        t.is(await tagInMemory(ls, g.id), 'gen1');
        t.is((await g.files.read('/workspace/a.txt')).content.toString(), 'written in fork A\n');
        t.true((await waitCounter(ls, g.id, (x) => x > atCA)) > atCA);
      }
      t.false(await parent.files.exists('/workspace/a.txt'));
      t.is(await tagInMemory(ls, parent.id), 'gen0');
      t.deepEqual(
        parent.checkpoints().map((c) => c.id),
        [c0.id],
      );
      t.deepEqual(
        a!.checkpoints().map((c) => c.id),
        [cA.id],
      );

      // Removing fork A (and with it the checkpoint the grandchildren came from) does not touch them.
      await ls.remove(a!.id);
      t.false(fs.existsSync(ls.engine.paths.layer(cA.layerId)));
      for (const [i, g] of grandchildren.entries()) {
        await g.files.write('/workspace/g.txt', `grandchild ${i}\n`);
        const r = await g.commands.run('cat /workspace/a.txt /workspace/g.txt');
        t.is(r.stdout, `written in fork A\ngrandchild ${i}\n`);
        t.is(await tagInMemory(ls, g.id), 'gen1');
        const now = await counterValue(ls, g.id);
        t.true((await waitCounter(ls, g.id, (x) => x > now)) > now);
      }
      t.deepEqual(
        listDir(ls.engine.paths.uppers).filter((u) => u.startsWith(a!.id)),
        [],
      );
    },
  );
});
