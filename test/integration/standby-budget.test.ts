/**
 * The standby policy on the real host: warm standbys of all sandboxes share
 * one memory budget (LockstepConfig.standbyBudgetBytes). With room for two
 * standbys and three sandboxes checkpointed in turn, the least recently
 * made standby is evicted (its processes gone), the memory the remaining
 * standbys' cgroups are charged stays within the budget, and the sandbox
 * whose standby was evicted still rolls back, through a CRIU restore, to
 * exactly its checkpoint's memory and files.
 */
import fs from 'node:fs';
import path from 'node:path';
import test from 'ava';
import type { Lockstep, Sandbox, CheckpointInfo } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { setTag, startMemo, tagInMemory } from '../fixtures/stub-workloads.js';

/** Anonymous + shared bytes charged to a cgroup, read from its memory.stat file (v1 or v2). */
function cgroupMemory(ls: Lockstep, instance: string): number {
  const { cgroups, runtime } = ls.engine;
  const name = runtime.cgroupName(instance);
  const file =
    cgroups.version === 2
      ? path.join('/sys/fs/cgroup/unified', name, 'memory.stat')
      : path.join('/sys/fs/cgroup/memory', name, 'memory.stat');
  const fields = cgroups.version === 2 ? ['anon', 'shmem'] : ['rss', 'shmem'];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .filter(([k]) => fields.includes(k!))
    .reduce((n, [, v]) => n + Number(v), 0);
}

integration(test, () => {
  test.serial('standbys stay within the memory budget; an evicted one still rolls back through CRIU', async (t) => {
    const ls = await openTestLockstep(t, { images: ['base'] });
    const sbs: Sandbox[] = [];
    for (const name of ['A', 'B', 'C']) {
      const sb = await ls.create({ image: 'base' });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      await startMemo(sb, ls);
      await setTag(ls, sb.id, `${name}0`);
      await sb.files.write('/workspace/name', `${name}0\n`);
      sbs.push(sb);
    }
    // Room for two standbys of the largest sandbox, not three.
    const largest = Math.max(...sbs.map((sb) => cgroupMemory(ls, ls.engine.catalog.sandbox(sb.id)!.instance)));
    t.true(largest > 0, 'the sandboxes hold memory');
    const budget = Math.floor(2.5 * largest);
    ls.engine.config = { ...ls.engine.config, standbyBudgetBytes: budget };

    const ckpts: CheckpointInfo[] = [];
    for (const sb of sbs) {
      ckpts.push(await sb.checkpoint());
      await sb.settled();
      // Each standby must be made at a distinct millisecond for the LRU order to be certain.
      await new Promise((r) => setTimeout(r, 5));
    }
    for (const sb of sbs) await sb.settled(); // evictions finish behind each victim's lock
    const rows = sbs.map((sb) => ls.engine.catalog.standby(sb.id));
    t.is(rows[0]?.instance ?? null, null, "A's standby, the least recently made, was evicted");
    t.is(rows[1]?.checkpoint, ckpts[1]!.id);
    t.is(rows[2]?.checkpoint, ckpts[2]!.id);
    const held = rows.filter((r) => r !== undefined).map((r) => cgroupMemory(ls, r.instance));
    t.true(held.reduce((a, b) => a + b, 0) <= budget, `standbys hold ${held.join(' + ')} bytes, budget ${budget}`);
    const group = path.join(
      ls.engine.cgroups.version === 2 ? '/sys/fs/cgroup/unified' : '/sys/fs/cgroup/memory',
      ls.engine.runtime.cgroupGroup,
    );
    t.deepEqual(
      fs.readdirSync(group).filter((k) => k.startsWith(`${sbs[0]!.id}.`)),
      [],
      "the evicted standby's processes and cgroup are gone",
    );

    // A moves on, then rolls back: no standby, so a CRIU restore, to exactly A0.
    const a = sbs[0]!;
    await setTag(ls, a.id, 'A1');
    await a.files.write('/workspace/name', 'A1\n');
    const report = await a.rollback(ckpts[0]!.id);
    t.is(report.path, 'restore');
    t.is(await tagInMemory(ls, a.id), 'A0');
    t.is((await a.files.read('/workspace/name')).content.toString(), 'A0\n');
    // A's rollback made A the most recent: its new standby evicts B's (now the least recent), not C's.
    await a.settled();
    await sbs[1]!.settled();
    const after = sbs.map((sb) => ls.engine.catalog.standby(sb.id));
    t.is(after[0]?.checkpoint, ckpts[0]!.id);
    t.is(after[1]?.instance ?? null, null);
    t.is(after[2]?.checkpoint, ckpts[2]!.id);
    const heldAfter = after.filter((r) => r !== undefined).map((r) => cgroupMemory(ls, r.instance));
    t.true(heldAfter.reduce((x, y) => x + y, 0) <= budget, `standbys hold ${heldAfter.join(' + ')} bytes`);
    // C's rollback is still a swap.
    await setTag(ls, sbs[2]!.id, 'C1');
    const rc = await sbs[2]!.rollback(ckpts[2]!.id);
    t.is(rc.path, 'standby');
    t.is(await tagInMemory(ls, sbs[2]!.id), 'C0');
  });
});
