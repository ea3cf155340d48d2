/**
 * Fault: the layer store runs out of room (issue 9 §4). The test gives its
 * state directory a 256 MiB store and fills it from the host; a checkpoint
 * (CRIU cannot write the image), a file write and a fork (btrfs cannot make
 * the snapshot) each fail with DISK_FULL, leave nothing half-made (catalog
 * rows, subvolumes, process images, mounts, cgroups, temporary files), the
 * sandbox's processes run on, and the same operations work once the room
 * is freed.
 */
import fs from 'node:fs';
import path from 'node:path';
import test from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { hostState, sameProcessAlive } from '../fixtures/host-state.js';
import { counterValue, startCounter, waitCounter } from '../fixtures/stub-workloads.js';

integration(test, () => {
  let ls: Lockstep;
  let sb: Sandbox;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    const previous = process.env.LOCKSTEP_STORE_GIB;
    process.env.LOCKSTEP_STORE_GIB = '0.25'; // read when the store image is made, at open
    try {
      ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
    } finally {
      if (previous === undefined) delete process.env.LOCKSTEP_STORE_GIB;
      else process.env.LOCKSTEP_STORE_GIB = previous;
    }
    sb = await ls.create({ image: 'base' });
    await startCounter(sb, ls);
  });
  test.after.always(async () => {
    freeRoom();
    for (const fn of teardowns.reverse()) await fn();
  });

  const fillers = () => path.join(ls.engine.paths.store, 'test-filler');

  /** Fills the store's data space (and, with `metadata`, its metadata space too) from the host. */
  function fillStore(metadata = false): void {
    const dir = fillers();
    fs.mkdirSync(dir, { recursive: true });
    const fd = fs.openSync(path.join(dir, 'data'), 'w');
    const chunk = Buffer.alloc(1 << 20, 0x5a);
    try {
      for (;;) fs.writeSync(fd, chunk);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
    } finally {
      fs.closeSync(fd);
    }
    if (!metadata) return;
    // A symlink's target is stored inline in the metadata trees and needs no
    // data space: make long ones until those trees are full too.
    const target = 'x'.repeat(3000);
    for (let i = 0; ; i++) {
      try {
        fs.symlinkSync(target, path.join(dir, `m${i}`));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
        break;
      }
    }
  }

  function freeRoom(): void {
    fs.rmSync(fillers(), { recursive: true, force: true });
  }

  async function freeRoomAndCommit(): Promise<void> {
    freeRoom();
    await ls.engine.layers.sync(); // btrfs gives deleted extents back at the commit
  }

  /** The same init, thawed, whose in-memory counter went on past `from` while the store was full. */
  async function assertRanOn(t: import('ava').ExecutionContext, pid: number | null, from: number): Promise<void> {
    const row = ls.engine.catalog.sandbox(sb.id)!;
    t.is(row.init_pid, pid);
    t.true(sameProcessAlive(row.init_pid!, row.init_start));
    t.false(ls.engine.cgroups.isFrozen(ls.engine.runtime.cgroupName(row.instance)), 'thawed');
    await waitCounter(ls, sb.id, (v) => v > from + 2);
  }

  test.serial(
    'a checkpoint into a full store fails with DISK_FULL, leaves nothing, and works again once room is freed',
    async (t) => {
      await sb.settled();
      const before = hostState(ls);
      const checkpointsBefore = sb.checkpoints();
      const pid = sb.info().pid;
      const counter = await counterValue(ls, sb.id);
      fillStore();
      t.teardown(freeRoom);

      const err = await t.throwsAsync(sb.checkpoint({ label: 'full' }), { code: 'DISK_FULL' });
      t.like((err as { cause?: { code?: string } }).cause, { code: 'CRIU_DUMP_FAILED' });
      t.deepEqual(hostState(ls), before, 'no layer, process image, catalog row or scratch left');
      t.deepEqual(sb.checkpoints(), checkpointsBefore);
      t.deepEqual(ls.engine.catalog.operations(), []);

      await freeRoomAndCommit();
      await assertRanOn(t, pid, counter);
      await sb.files.write('/workspace/f', 'at the checkpoint\n');
      const ckpt = await sb.checkpoint({ label: 'after room was freed' });
      t.is(sb.checkpoints().length, checkpointsBefore.length + 1);
      await sb.files.write('/workspace/f', 'after\n');
      await sb.rollback(ckpt.id);
      t.is((await sb.commands.run('cat /workspace/f')).stdout, 'at the checkpoint\n');
    },
  );

  test.serial(
    'a file write into a full store fails with DISK_FULL and leaves the old file whole, no temporary file',
    async (t) => {
      await sb.files.write('/workspace/w', 'old content\n');
      const pid = sb.info().pid;
      const counter = await counterValue(ls, sb.id);
      fillStore();
      t.teardown(freeRoom);

      await t.throwsAsync(sb.files.write('/workspace/w', Buffer.alloc(8 << 20, 0x41)), { code: 'DISK_FULL' });
      // Inside the sandbox too, the kernel's own answer.
      const dd = await sb.commands.run(
        'dd if=/dev/zero of=/workspace/dd bs=1M count=8 2>&1; echo "exit $?"; rm -f /workspace/dd',
      );
      t.regex(dd.stdout, /No space left on device[\s\S]*exit 1\n$/);

      await freeRoomAndCommit();
      t.is((await sb.commands.run('cat /workspace/w')).stdout, 'old content\n');
      t.notRegex((await sb.commands.run('ls -A /workspace')).stdout, /lockstep-write/, 'no temporary file left');
      await assertRanOn(t, pid, counter);
      await sb.files.write('/workspace/w', 'new content\n');
      t.is((await sb.commands.run('cat /workspace/w')).stdout, 'new content\n');
    },
  );

  test.serial(
    'a fork from a full store fails with DISK_FULL, leaves no sandbox behind, and works again once room is freed',
    async (t) => {
      await sb.files.write('/workspace/f', 'fork point\n');
      const ckpt = await sb.checkpoint({ label: 'fork point' });
      await sb.settled();
      const before = hostState(ls);
      const pid = sb.info().pid;
      const counter = await counterValue(ls, sb.id);
      fillStore(true);
      t.teardown(freeRoom);

      const results = await sb.fork(ckpt.id, { count: 2 });
      t.is(results.length, 2);
      for (const r of results) t.like(r, { ok: false, error: { code: 'DISK_FULL' } }, JSON.stringify(r));
      t.deepEqual(hostState(ls), before, 'no sandbox row, upper, run folder, mount or cgroup left');

      await freeRoomAndCommit();
      await assertRanOn(t, pid, counter);
      const [fork] = await sb.fork(ckpt.id, { count: 1 });
      t.true(fork!.ok);
      if (!fork!.ok) return;
      t.teardown(() => ls.remove(fork.id).catch(() => undefined));
      const child = ls.get(fork.id);
      t.is((await child.commands.run('cat /workspace/f')).stdout, 'fork point\n');
      const c = await counterValue(ls, child.id);
      await waitCounter(ls, child.id, (v) => v > c);
    },
  );
});
