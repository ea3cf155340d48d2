/**
 * Fault: a corrupted checkpoint (issue 9 §4). A flipped byte in a process
 * image, a truncated page file, a missing image file or a layer changed
 * behind Lockstep's back is found from the checksums recorded at checkpoint
 * time before CRIU or the layer swap runs: rollback and fork are refused
 * with CHECKPOINT_CORRUPT naming the checkpoint and the file, and so is a
 * checkpoint whose incremental image takes pages from it; the sandbox is
 * untouched (same processes, same files, counter still advancing), and a
 * checkpoint that takes nothing from it still rolls back.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import test, { type ExecutionContext } from 'ava';
import type { CheckpointInfo, Lockstep, Sandbox } from '../../src/index.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { parentOf } from '../../src/checkpoints/page-delta.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { counterInLayer, counterValue, startCounter, waitCounter } from '../fixtures/stub-workloads.js';

/** The name of the process image file holding the most memory pages (CRIU: pages-<n>.img). */
function biggestPagesFile(dir: string): string {
  const pages = fs.readdirSync(dir).filter((n) => /^pages-\d+\.img$/.test(n));
  return pages.sort((a, b) => fs.statSync(path.join(dir, b)).size - fs.statSync(path.join(dir, a)).size)[0]!;
}

interface Damage {
  /** Damages the checkpoint's files; returns the `file` the error must name. */
  apply(ls: Lockstep, ckpt: CheckpointInfo): string;
}

const DAMAGES: Record<string, Damage> = {
  'a flipped byte in a page file': {
    apply(ls, ckpt) {
      const dir = ls.engine.paths.processImage(ckpt.id);
      const name = biggestPagesFile(dir);
      const file = path.join(dir, name);
      const fd = fs.openSync(file, 'r+');
      try {
        const at = Math.floor(fs.fstatSync(fd).size / 2);
        const b = Buffer.alloc(1);
        fs.readSync(fd, b, 0, 1, at);
        b[0] = b[0]! ^ 0x01;
        fs.writeSync(fd, b, 0, 1, at);
      } finally {
        fs.closeSync(fd);
      }
      return `process image file ${name}`;
    },
  },
  'a truncated page file': {
    apply(ls, ckpt) {
      const dir = ls.engine.paths.processImage(ckpt.id);
      const name = biggestPagesFile(dir);
      const file = path.join(dir, name);
      fs.truncateSync(file, Math.floor(fs.statSync(file).size / 2));
      return `process image file ${name}`;
    },
  },
  'a missing core image': {
    apply(ls, ckpt) {
      const dir = ls.engine.paths.processImage(ckpt.id);
      const name = fs.readdirSync(dir).find((n) => /^core-\d+\.img$/.test(n))!;
      fs.rmSync(path.join(dir, name));
      return `process image file ${name}`;
    },
  },
  'a file changed in the read-only layer': {
    apply(ls, ckpt) {
      // What an administrator (or a stray tool) would have to do to write into it.
      const layer = ls.engine.paths.layer(ckpt.layerId);
      execFileSync('btrfs', ['property', 'set', '-ts', layer, 'ro', 'false']);
      fs.writeFileSync(path.join(layer, 'upper/workspace/f'), 'tampered\n');
      execFileSync('btrfs', ['property', 'set', '-ts', layer, 'ro', 'true']);
      return `layer ${ckpt.layerId}`;
    },
  },
};

integration(test, () => {
  let ls: Lockstep;
  let sb: Sandbox;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
    sb = await ls.create({ image: 'base' });
    await startCounter(sb, ls);
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function cat(s: Sandbox, p: string): Promise<string> {
    const r = await s.commands.run(['cat', p]);
    return r.stdout;
  }

  const corrupted = test.macro({
    async exec(t: ExecutionContext, kind: string) {
      await sb.files.write('/workspace/f', `good ${kind}\n`);
      const good = await sb.checkpoint({ label: `good ${kind}` });
      await sb.files.write('/workspace/f', `victim ${kind}\n`);
      const victim = await sb.checkpoint({ label: `victim ${kind}` });
      await sb.files.write('/workspace/f', `child ${kind}\n`);
      const child = await sb.checkpoint({ label: `child ${kind}` });
      await sb.settled();
      // Tracked dumps (native/criu): the victim's image takes pages from good's, and the
      // child's from the victim's.
      t.is(parentOf(ls.engine.paths.processImage(child.id)), victim.id, 'the child takes pages from the victim');
      // No standby of either: both rollbacks below take the path that reads the files.
      await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      await sb.files.write('/workspace/f', 'moved on\n');
      const file = DAMAGES[kind]!.apply(ls, victim);
      const before = sb.info();
      const sandboxesBefore = ls
        .list()
        .map((s) => s.id)
        .sort();

      const err = await t.throwsAsync(sb.rollback(victim.id), { code: 'CHECKPOINT_CORRUPT' });
      t.like((err as unknown as { details: object }).details, { checkpointId: victim.id, file });
      t.true(err!.message.includes(victim.id) && err!.message.includes(file), err!.message);
      await t.throwsAsync(sb.fork(victim.id, { count: 2 }), { code: 'CHECKPOINT_CORRUPT' });
      if (file.startsWith('process image')) {
        // What the child restores includes the victim's pages: refused too, naming them.
        const e = await t.throwsAsync(sb.rollback(child.id), { code: 'CHECKPOINT_CORRUPT' });
        t.like((e as unknown as { details: object }).details, {
          checkpointId: child.id,
          damagedCheckpointId: victim.id,
        });
        t.true(e!.message.includes(victim.id) && e!.message.includes(file.replace('process image ', '')), e!.message);
      }

      // Untouched: the same processes, the same files, the same timeline, nothing journalled or added.
      t.like(sb.info(), { state: 'running', pid: before.pid, headCheckpointId: child.id, branchId: before.branchId });
      t.deepEqual(ls.engine.catalog.operations(), []);
      t.deepEqual(
        ls
          .list()
          .map((s) => s.id)
          .sort(),
        sandboxesBefore,
      );
      t.is(await cat(sb, '/workspace/f'), 'moved on\n');
      const now = await counterValue(ls, sb.id);
      await waitCounter(ls, sb.id, (v) => v > now);

      // A checkpoint that takes nothing from the victim is whole: rolling back to it restores its files and its counter.
      const atGood = await counterInLayer(ls, good);
      // Well past the checkpoint first (10 steps of 50 ms): under load the
      // counter may have moved only one step since it, and the first value
      // seen after the rollback must be told apart from the one before it.
      const pastGood = await waitCounter(ls, sb.id, (v) => v > atGood + 10);
      const report = await sb.rollback(good.id);
      t.like(report, { checkpointId: good.id, path: 'restore' });
      t.is(await cat(sb, '/workspace/f'), `good ${kind}\n`);
      const resumed = await waitCounter(ls, sb.id, (v) => v > atGood);
      t.true(resumed < pastGood, `the counter went on from ${atGood} (the checkpoint), not from ${pastGood}`);
    },
    title: (_p, kind: string) =>
      `${kind} is refused with CHECKPOINT_CORRUPT before anything is restored, with the checkpoints that take pages from it; the others still roll back`,
  });
  for (const kind of Object.keys(DAMAGES)) test.serial(corrupted, kind);

  test.serial(
    'the standby path reads no image: a standby made before the damage still swaps in, and no new standby or CRIU restore is made from the damaged files',
    async (t) => {
      await sb.files.write('/workspace/f', 'standby\n');
      const ckpt = await sb.checkpoint({ label: 'standby' });
      await sb.settled();
      t.is(ls.engine.catalog.standby(sb.id)?.checkpoint ?? null, ckpt.id, 'a warm standby of the checkpoint is ready');
      await sb.files.write('/workspace/f', 'moved on\n');
      const file = DAMAGES['a flipped byte in a page file']!.apply(ls, ckpt);

      // The standby was restored from verified files and is what the swap checks (pid, start time, frozen cgroup).
      t.like(await sb.rollback(ckpt.id), { path: 'standby' });
      t.is(await cat(sb, '/workspace/f'), 'standby\n');
      await sb.settled();
      t.is(ls.engine.catalog.standby(sb.id)?.checkpoint ?? null, null, 'no new standby from the damaged files');

      await sb.files.write('/workspace/f', 'moved on again\n');
      const err = await t.throwsAsync(sb.rollback(ckpt.id), { code: 'CHECKPOINT_CORRUPT' });
      t.like((err as unknown as { details: object }).details, { checkpointId: ckpt.id, file });
      t.is(await cat(sb, '/workspace/f'), 'moved on again\n');
    },
  );

  test.serial(
    'a verified checkpoint damaged later, with its mtime put back to the nanosecond, is still refused (the verdict cache keys on ctime)',
    async (t) => {
      // A sandbox of its own: the shared one's next checkpoint would take pages from the damaged ones above.
      const s = await ls.create({ image: 'base' });
      t.teardown(() => ls.remove(s.id).catch(() => undefined));
      await s.files.write('/workspace/f', 'cached\n');
      const ckpt = await s.checkpoint({ label: 'cached' });
      await s.settled();
      // Past the settling window, so that the first verification is remembered.
      await new Promise((r) => setTimeout(r, 1200));
      const [first] = await s.fork(ckpt.id, { count: 1 });
      t.true(first!.ok, JSON.stringify(first));
      if (first!.ok) await ls.remove(first.id);

      const dir = ls.engine.paths.processImage(ckpt.id);
      const name = biggestPagesFile(dir);
      const before = fs.statSync(path.join(dir, name), { bigint: true });
      const file = DAMAGES['a flipped byte in a page file']!.apply(ls, ckpt);
      const ns = (v: bigint) => `@${v / 1_000_000_000n}.${String(v % 1_000_000_000n).padStart(9, '0')}`;
      execFileSync('touch', ['-m', '-d', ns(before.mtimeNs), path.join(dir, name)]);
      const after = fs.statSync(path.join(dir, name), { bigint: true });
      t.is(after.mtimeNs, before.mtimeNs, 'the mtime is back to what it was');
      t.is(after.size, before.size);
      await new Promise((r) => setTimeout(r, 1200));

      const err = await t.throwsAsync(s.fork(ckpt.id, { count: 1 }), { code: 'CHECKPOINT_CORRUPT' });
      t.like((err as unknown as { details: object }).details, { checkpointId: ckpt.id, file });
    },
  );

  test.serial(
    'a checkpoint that was not damaged verifies and restores after being restored from many times',
    async (t) => {
      // A sandbox of its own: the shared one's next checkpoint would take pages from the damaged ones above.
      const s = await ls.create({ image: 'base' });
      t.teardown(() => ls.remove(s.id).catch(() => undefined));
      await s.files.write('/workspace/f', 'stable\n');
      const ckpt = await s.checkpoint({ label: 'stable' });
      const [forked] = await s.fork(ckpt.id, { count: 1 });
      t.true(forked!.ok);
      if (forked!.ok) t.teardown(() => ls.remove(forked.id).catch(() => undefined));
      for (let i = 0; i < 2; i++) {
        await s.settled();
        await ls.engine.withSandboxLock(s.id, () => dropStandby(ls.engine, s.id));
        await s.files.write('/workspace/f', `changed ${i}\n`);
        t.like(await s.rollback(ckpt.id), { path: 'restore' });
        t.is(await cat(s, '/workspace/f'), 'stable\n');
      }
    },
  );
});
