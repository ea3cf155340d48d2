/**
 * The warm standby's decisions, on the fake host (no root): after a
 * checkpoint a frozen copy of the sandbox restored from it is kept, or none
 * when the configuration, the tenant's memory or a failure says so; a
 * failure costs only the fast path, and leaves nothing behind.
 */
import test from 'ava';
import { openFake } from '../fakes/manager.js';
import { STANDBY_HISTORY, standbyWanted } from '../../src/checkpoints/standby-policy.js';

test('after a checkpoint, a frozen standby restored from it is kept', async (t) => {
  const m = await openFake(t);
  const sb = await m.ls.create();
  m.host.processes.get(m.row(sb.id).init_pid!)!.memory = 'counter=3';
  const ckpt = await sb.checkpoint();
  await sb.settled();
  const standby = m.standby(sb.id)!;
  t.is(standby.checkpoint, ckpt.id);
  const key = standby.instance;
  t.true(key.startsWith(`${sb.id}.`));
  const cg = m.engine.runtime.cgroupName(key);
  t.true(m.host.cgroupDriver.isFrozen(cg));
  t.deepEqual(m.host.cgroupDriver.pids(cg), [standby.pid]);
  t.is(m.host.processes.get(standby.pid!)!.memory, 'counter=3');
  t.is(m.host.processes.get(standby.pid!)!.start, standby.start!);
});

test('the standby is a setting of each manager: two managers in one process differ', async (t) => {
  const on = await openFake(t, { open: { config: { standby: true } } });
  const off = await openFake(t, { open: { config: { standby: false } } });
  for (const m of [on, off]) {
    const sb = await m.ls.create();
    await sb.checkpoint();
    await sb.settled();
  }
  t.is(on.host.only('criu.restore').length, 1);
  t.is(off.host.only('criu.restore').length, 0);
  t.is(off.engine.catalog.standby(off.engine.catalog.allSandboxes()[0]!.id)?.instance ?? null, null);
});

test('a standby that fails to restore leaves nothing, and the sandbox runs on', async (t) => {
  const m = await openFake(t);
  const sb = await m.ls.create();
  m.host.failAt('criu.restore');
  await sb.checkpoint();
  await sb.settled();
  const row = m.row(sb.id);
  t.is(m.standby(sb.id)?.instance ?? null, null);
  t.is(row.state, 'running');
  t.deepEqual(m.host.cgroupDriver.children(m.engine.runtime.cgroupGroup), [sb.id]);
  t.deepEqual([...m.host.uppers.keys()], [sb.id]);
});

test('a newer checkpoint replaces the standby; the old one is removed', async (t) => {
  const m = await openFake(t);
  const sb = await m.ls.create();
  await sb.checkpoint();
  await sb.settled();
  const first = m.standby(sb.id)!.instance!;
  const second = await sb.checkpoint();
  await sb.settled();
  t.is(m.standby(sb.id)?.checkpoint ?? null, second.id);
  t.not(m.standby(sb.id)?.instance ?? null, first);
  t.false(m.host.cgroups.has(m.engine.runtime.cgroupName(first)));
  t.false(m.host.uppers.has(first));
});

test('no standby when it would take the tenant past its memory quota', async (t) => {
  const m = await openFake(t);
  const { addTenant } = await import('../../src/tenants/tenants.js');
  const { tenant } = addTenant(m.engine.catalog.db, 'acme', { maxMemoryMb: 600 });
  const sb = await m.ls.create({ tenant: tenant.id, memoryMb: 512 });
  await sb.checkpoint();
  await sb.settled();
  t.is(m.standby(sb.id)?.instance ?? null, null);
  t.is(m.host.only('criu.restore').length, 0);
});

test('standbys share one memory budget: the least recently made is evicted for a newer one, and its sandbox rolls back with CRIU', async (t) => {
  const MiB = 2 ** 20;
  // Room for two standbys of 100 MiB, not three.
  const m = await openFake(t, { open: { config: { standbyBudgetBytes: 250 * MiB } } });
  const sbs = [];
  for (const memory of ['a=1', 'b=1', 'c=1']) {
    const sb = await m.ls.create();
    m.host.memoryBytes.set(sb.id, 100 * MiB);
    m.host.processes.get(m.row(sb.id).init_pid!)!.memory = memory;
    sbs.push({ sb, ckpt: await sb.checkpoint() });
    await sb.settled();
    m.host.now += 1000; // the LRU order is the standbys' making times
  }
  const [a, b, c] = sbs.map((x) => m.standby(x.sb.id));
  const evicted = sbs[0]!.sb.id;
  t.is(a?.instance ?? null, null, 'the oldest standby was evicted');
  t.is(b?.checkpoint, sbs[1]!.ckpt.id);
  t.is(c?.checkpoint, sbs[2]!.ckpt.id);
  await sbs[0]!.sb.settled();
  const group = m.engine.runtime.cgroupGroup;
  t.deepEqual(
    m.host.cgroupDriver.children(group).filter((k) => k.startsWith(`${evicted}.`)),
    [],
    'its processes are gone',
  );
  // The evicted sandbox still rolls back, through a CRIU restore, to its own state.
  const first = sbs[0]!;
  m.host.processes.get(m.row(first.sb.id).init_pid!)!.memory = 'a=2';
  const restores = m.host.only('criu.restore').length;
  await first.sb.rollback(first.ckpt.id);
  t.true(m.host.only('criu.restore').length > restores);
  t.is(m.host.processes.get(m.row(first.sb.id).init_pid!)!.memory, 'a=1');
});

test('a standby larger than the whole budget is not made, and evicts nothing', async (t) => {
  const MiB = 2 ** 20;
  const m = await openFake(t, { open: { config: { standbyBudgetBytes: 150 * MiB } } });
  const small = await m.ls.create();
  m.host.memoryBytes.set(small.id, 100 * MiB);
  await small.checkpoint();
  await small.settled();
  const big = await m.ls.create();
  m.host.memoryBytes.set(big.id, 200 * MiB);
  await big.checkpoint();
  await big.settled();
  t.is(m.standby(big.id)?.instance ?? null, null);
  t.not(m.standby(small.id)?.instance ?? null, null, 'the smaller standby stays');
});

test('with standbyAfterCheckpoint off, a checkpoint makes no standby and a rollback makes one', async (t) => {
  const m = await openFake(t, { open: { config: { standbyAfterCheckpoint: false } } });
  const sb = await m.ls.create();
  m.host.processes.get(m.row(sb.id).init_pid!)!.memory = 'counter=1';
  const ckpt = await sb.checkpoint();
  await sb.settled();
  t.is(m.standby(sb.id)?.instance ?? null, null);
  t.is(m.host.only('criu.restore').length, 0, 'no CRIU restore after the checkpoint');
  await sb.rollback(ckpt.id); // through a CRIU restore
  await sb.settled();
  t.is(m.standby(sb.id)?.checkpoint ?? null, ckpt.id, 'agents often fail the same step again');
  m.host.processes.get(m.row(sb.id).init_pid!)!.memory = 'counter=2';
  const report = await sb.rollback(ckpt.id);
  t.is(report.path, 'standby');
  t.is(m.host.processes.get(m.row(sb.id).init_pid!)!.memory, 'counter=1');
});

test('standbyWanted: on and off as before; auto follows where the recent rollbacks went', (t) => {
  t.true(standbyWanted(true, 'checkpoint', []));
  t.false(standbyWanted(false, 'checkpoint', [true, true]));
  t.true(standbyWanted(false, 'rollback', []));
  // auto, nothing known yet: after a rollback only
  t.false(standbyWanted('auto', 'checkpoint', []));
  t.true(standbyWanted('auto', 'rollback', []));
  // a tree search: rollbacks to older nodes, never to where the sandbox was
  t.false(standbyWanted('auto', 'rollback', [false, false, false]));
  t.false(standbyWanted('auto', 'checkpoint', [false, false, true]));
  // an agent that undoes its last step every other time
  t.true(standbyWanted('auto', 'checkpoint', [true, false, true, false]));
  // only the last STANDBY_HISTORY chances count
  t.false(standbyWanted('auto', 'checkpoint', [...Array(20).fill(true), ...Array(STANDBY_HISTORY).fill(false)]));
});

test('with standbyAfterCheckpoint auto, standbys follow the rollbacks that would have used them', async (t) => {
  const m = await openFake(t, { open: { config: { standbyAfterCheckpoint: 'auto' } } });
  const sb = await m.ls.create();
  const c1 = await sb.checkpoint();
  await sb.settled();
  t.is(m.standby(sb.id)?.instance ?? null, null, 'nothing known: no standby after a checkpoint');
  await sb.rollback(c1.id); // to where the checkpoint left it: a standby would have been used
  await sb.settled();
  t.is(m.standby(sb.id)?.checkpoint ?? null, c1.id);
  const report = await sb.rollback(c1.id); // the same step again: the standby is used
  t.is(report.path, 'standby');
  await sb.settled();
  const c2 = await sb.checkpoint(); // 2 of 2 chances used so far
  await sb.settled();
  t.is(m.standby(sb.id)?.checkpoint ?? null, c2.id, 'this sandbox undoes its steps: a standby after the checkpoint');
  // Now a tree search: rollbacks to older checkpoints only.
  for (let i = 0; i < 4; i++) {
    await sb.checkpoint();
    await sb.rollback(c1.id);
  }
  await sb.settled();
  const restoresBefore = m.host.only('criu.restore').length;
  await sb.checkpoint();
  await sb.settled();
  t.is(m.host.only('criu.restore').length, restoresBefore, 'no standby restore after a checkpoint any more');
});

test('the checkpoint and rollback verbs, called without the Sandbox handle, queue durability and the standby themselves', async (t) => {
  const m = await openFake(t, { open: { config: { standby: true, standbyAfterCheckpoint: true } } });
  const { checkpointSandbox } = await import('../../src/checkpoints/checkpoint.js');
  const { rollbackSandbox } = await import('../../src/checkpoints/rollback.js');
  const sb = await m.ls.create();
  const info = await m.engine.withSandboxLock(sb.id, () => checkpointSandbox(m.engine, m.row(sb.id)));
  await m.engine.drainLocks();
  t.not(m.engine.catalog.checkpoint(info.id)!.durable_at, null, 'made durable in the background');
  t.is(m.standby(sb.id)?.checkpoint, info.id, 'a standby of it was prepared');
  // A rollback swaps that standby in, then the verb queues a new one of the same checkpoint.
  const report = await m.engine.withSandboxLock(sb.id, () => rollbackSandbox(m.engine, m.row(sb.id), info.id));
  t.is(report.path, 'standby');
  await m.engine.drainLocks();
  t.is(m.standby(sb.id)?.checkpoint, info.id);
  t.not(m.standby(sb.id)?.instance, m.row(sb.id).instance);
});
