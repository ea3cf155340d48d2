/**
 * The reaper's choice for each journal phase and each kind of leftover, on
 * the fake host (no root). Each test leaves the state directory as a crash
 * at that point leaves it (the journal entry, frozen cgroups, half-made
 * layers and folders), then opens a new manager, whose open() reaps.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { newId } from '../../src/catalog/catalog.js';
import { openFake, type FakeManager } from '../fakes/manager.js';

/** Closes the manager as a crash would leave things, and opens a new one on the same host and state directory. */
async function reopen(t: ExecutionContext, m: FakeManager): Promise<FakeManager> {
  await m.ls.close();
  return openFake(t, { home: m.home, host: m.host, open: { config: { standby: false } } });
}

/** A sandbox at (files-v1, counter=1) checkpointed, then changed to (files-v2, counter=2). */
async function checkpointedSandbox(t: ExecutionContext, standby = false) {
  const m = await openFake(t, { open: { config: { standby } } });
  const sb = await m.ls.create();
  const pid = m.row(sb.id).init_pid!;
  m.host.uppers.set(sb.id, 'files-v1');
  m.host.processes.get(pid)!.memory = 'counter=1';
  const ckpt = await sb.checkpoint();
  await sb.settled();
  m.host.uppers.set(sb.id, 'files-v2');
  m.host.processes.get(pid)!.memory = 'counter=2';
  return { m, id: sb.id, pid, ckpt };
}

test('an unfinished checkpoint is discarded and its sandbox thawed', async (t) => {
  const { m, id, pid } = await checkpointedSandbox(t);
  // A crash between "snapshotted" and "committed": frozen, a layer and an image without a record.
  const checkpointId = newId('ckpt');
  const layerId = newId('lyr');
  const cg = m.engine.runtime.cgroupName(id);
  await m.host.cgroupDriver.freeze(cg);
  m.host.layers.set(layerId, 'files-v2');
  fs.mkdirSync(m.engine.paths.processImage(checkpointId));
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'checkpoint',
    sandbox_id: id,
    phase: 'started',
    payload: JSON.stringify({ checkpointId, layerId }),
  });

  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped!.operations, [`checkpoint:started:${id}`]);
  t.false(r.host.layers.has(layerId));
  t.false(fs.existsSync(r.engine.paths.processImage(checkpointId)));
  t.false(r.host.cgroupDriver.isFrozen(cg));
  t.like(r.row(id), { state: 'running', init_pid: pid });
  t.is(r.host.processes.get(pid)!.memory, 'counter=2');
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('a rollback journalled "prepared" had changed nothing: the entry is closed, the sandbox left as it is', async (t) => {
  const { m, id, pid, ckpt } = await checkpointedSandbox(t);
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'rollback',
    sandbox_id: id,
    phase: 'prepared',
    payload: JSON.stringify({ checkpointId: ckpt.id, branchId: newId('br'), standby: null }),
  });
  const mark = m.host.calls.length;
  const r = await reopen(t, m);
  t.false(r.host.since(mark).some((c) => c.startsWith('cgroups.kill') || c.startsWith('criu.restore')));
  t.like(r.row(id), { state: 'running', init_pid: pid });
  t.is(r.host.uppers.get(id), 'files-v2');
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('a rollback journalled "killing" is rolled forward to the checkpoint by a CRIU restore', async (t) => {
  const { m, id, pid, ckpt } = await checkpointedSandbox(t);
  const branchId = newId('br');
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'rollback',
    sandbox_id: id,
    phase: 'killing',
    payload: JSON.stringify({ checkpointId: ckpt.id, branchId, standby: null }),
  });
  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped!.operations, [`rollback:killing:${id}`]);
  const row = r.row(id);
  t.like(row, { state: 'running', head_checkpoint_id: ckpt.id, branch_id: branchId });
  t.false(r.host.proc.isAlive(pid));
  t.is(r.host.processes.get(row.init_pid!)!.memory, 'counter=1');
  t.is(r.host.uppers.get(id), 'files-v1');
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('a roll-forward that fails leaves the sandbox stopped at the checkpoint, on the journalled branch', async (t) => {
  const { m, id, pid, ckpt } = await checkpointedSandbox(t);
  const branchId = newId('br');
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'rollback',
    sandbox_id: id,
    phase: 'killing',
    payload: JSON.stringify({ checkpointId: ckpt.id, branchId, standby: null }),
  });
  m.host.failAt('criu.restore');
  const r = await reopen(t, m);
  t.like(r.row(id), { state: 'stopped', init_pid: null, head_checkpoint_id: ckpt.id, branch_id: branchId });
  t.false(r.host.proc.isAlive(pid));
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('a rollback journalled "killing" with a live standby swaps the standby in', async (t) => {
  const { m, id, pid, ckpt } = await checkpointedSandbox(t, true);
  const standby = m.standby(id)!.instance!;
  t.truthy(standby);
  const branchId = newId('br');
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'rollback',
    sandbox_id: id,
    phase: 'killing',
    payload: JSON.stringify({ checkpointId: ckpt.id, branchId, standby }),
  });
  const mark = m.host.calls.length;
  const r = await reopen(t, m);
  t.false(r.host.since(mark).some((c) => c.startsWith('criu.restore')));
  const row = r.row(id);
  t.like(row, {
    state: 'running',
    instance: standby,
    head_checkpoint_id: ckpt.id,
    branch_id: branchId,
  });
  t.is(r.standby(id), undefined);
  t.is(r.host.processes.get(row.init_pid!)!.memory, 'counter=1');
  t.false(r.host.proc.isAlive(pid), 'the old instance was removed');
  t.false(r.host.uppers.has(id));
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('a rollback whose swap had committed only has its journal entry closed', async (t) => {
  const { m, id, ckpt } = await checkpointedSandbox(t, true);
  const standby = m.standby(id)!.instance!;
  const report = await m.ls.get(id).rollback(ckpt.id);
  await m.ls.get(id).settled();
  // The crash came between the commit and the end of the journal entry.
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'rollback',
    sandbox_id: id,
    phase: 'killing',
    payload: JSON.stringify({ checkpointId: ckpt.id, branchId: report.branchId, standby }),
  });
  const mark = m.host.calls.length;
  const r = await reopen(t, m);
  t.false(r.host.since(mark).some((c) => /^(criu\.restore|cgroups\.kill|cgroups\.freeze)/.test(c)));
  t.like(r.row(id), { state: 'running', instance: standby, init_pid: report.pid, branch_id: report.branchId });
  t.deepEqual(r.engine.catalog.operations(), []);
});

test('an unfinished fork is removed whole', async (t) => {
  const { m, id, ckpt } = await checkpointedSandbox(t);
  const parent = m.row(id);
  const child = newId('sbx');
  m.engine.catalog.insertSandbox({
    ...parent,
    id: child,
    instance: child,
    state: 'creating',
    init_pid: null,
    init_start: null,
    forked_from: ckpt.id,
    head_checkpoint_id: null,
  });
  m.engine.catalog.beginOperation({
    id: newId('op'),
    kind: 'fork',
    sandbox_id: child,
    phase: 'started',
    payload: JSON.stringify({ parent: id, checkpointId: ckpt.id }),
  });
  m.host.cgroupDriver.create(m.engine.runtime.cgroupName(child), {});
  m.host.uppers.set(child, 'files-v1');
  m.host.spawn(m.engine.runtime.cgroupName(child), 'restored');
  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped!.operations, [`fork:started:${child}`]);
  t.is(r.engine.catalog.sandbox(child), undefined);
  t.false(r.host.uppers.has(child));
  t.false(r.host.cgroups.has(r.engine.runtime.cgroupName(child)));
  t.like(r.row(id), { state: 'running', init_pid: parent.init_pid });
});

for (const state of ['creating', 'removing'] as const) {
  test(`a sandbox left "${state}" is removed`, async (t) => {
    const { m, id } = await checkpointedSandbox(t);
    m.engine.catalog.updateSandbox(id, { state });
    const r = await reopen(t, m);
    t.deepEqual(r.ls.reaped!.sandboxes, [id]);
    t.is(r.engine.catalog.sandbox(id), undefined);
    t.deepEqual(r.engine.catalog.allCheckpoints(), []);
    t.deepEqual([...r.host.layers.keys()], []);
    t.deepEqual([...r.host.uppers.keys()], []);
    t.deepEqual(r.host.cgroupDriver.children(r.engine.runtime.cgroupGroup), []);
  });
}

test('a running sandbox whose init died is marked stopped; a frozen one is thawed', async (t) => {
  const m = await openFake(t, { open: { config: { standby: false } } });
  const dead = await m.ls.create();
  const frozen = await m.ls.create();
  const deadPid = m.row(dead.id).init_pid!;
  await m.ls.close();
  m.host.exit(deadPid);
  await m.host.cgroupDriver.freeze(m.engine.runtime.cgroupName(frozen.id));
  const r = await openFake(t, { home: m.home, host: m.host });
  t.like(r.row(dead.id), { state: 'stopped', init_pid: null });
  t.like(r.row(frozen.id), { state: 'running' });
  t.false(r.host.cgroupDriver.isFrozen(r.engine.runtime.cgroupName(frozen.id)));
});

test('a standby whose process died is dropped', async (t) => {
  const { m, id } = await checkpointedSandbox(t, true);
  const { instance: standby, pid: standbyPid } = m.standby(id)!;
  await m.ls.close();
  m.host.exit(standbyPid!);
  const r = await openFake(t, { home: m.home, host: m.host });
  t.like(r.row(id), { state: 'running' });
  t.is(r.standby(id), undefined);
  t.false(r.host.cgroups.has(r.engine.runtime.cgroupName(standby!)));
  t.false(r.host.uppers.has(standby!));
});

test('each kind of leftover the catalog does not know is removed and reported', async (t) => {
  const { m, id, ckpt } = await checkpointedSandbox(t);
  const ghost = 'sbx_ghost';
  const p = m.engine.paths;
  fs.mkdirSync(p.sandboxRoot(ghost), { recursive: true });
  m.host.mounts.add(p.sandboxRoot(ghost));
  m.host.cgroupDriver.create(m.engine.runtime.cgroupName('sbx_lost'), {});
  m.host.uppers.set('sbx_upper', 'x');
  m.host.layers.set('lyr_orphan', 'x');
  fs.mkdirSync(p.processImage('ckpt_orphan'));
  fs.mkdirSync(path.join(p.images, '.tmp-half'), { recursive: true });
  fs.writeFileSync(path.join(p.scratch, 'restore-x'), '');
  const r = await reopen(t, m);
  t.deepEqual(
    r.ls.reaped!.orphans.sort(),
    [
      'cgroup:sbx_lost',
      'image-tmp:.tmp-half',
      'layer:lyr_orphan',
      'process-image:ckpt_orphan',
      `run:${ghost}`,
      'upper:sbx_upper',
    ].sort(),
  );
  t.false(r.host.mounts.has(p.sandboxRoot(ghost)));
  t.false(fs.existsSync(p.sandboxRun(ghost)));
  t.false(r.host.cgroups.has(r.engine.runtime.cgroupName('sbx_lost')));
  t.deepEqual(fs.readdirSync(p.scratch), []);
  // What the catalog knows stays.
  t.true(r.host.layers.has(ckpt.layerId));
  t.true(fs.existsSync(p.processImage(ckpt.id)));
  t.like(r.row(id), { state: 'running' });
});

/** Makes a committed checkpoint look as a crash before its background durability step leaves it. */
function leavePending(m: FakeManager, checkpointId: string, bootId: string): void {
  m.engine.catalog.db
    .prepare('UPDATE checkpoints SET durable_at = NULL, checksums = NULL, boot_id = ? WHERE id = ?')
    .run(bootId, checkpointId);
}

test('a checkpoint left pending in this boot is synced, checksummed and recorded durable', async (t) => {
  const { m, ckpt } = await checkpointedSandbox(t);
  leavePending(m, ckpt.id, m.host.bootId);
  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped?.checkpoints, [`durable:${ckpt.id}`]);
  const row = r.engine.catalog.checkpoint(ckpt.id)!;
  t.not(row.durable_at, null);
  t.deepEqual(Object.keys((JSON.parse(row.checksums!) as { images: object }).images), ['memory']);
});

test('a checkpoint left pending by an earlier boot is dropped with its pending descendants; the last durable one is head again', async (t) => {
  const { m, id, ckpt } = await checkpointedSandbox(t);
  const sb = m.ls.get(id);
  const second = await sb.checkpoint();
  const third = await sb.checkpoint();
  await sb.settled();
  leavePending(m, second.id, 'an-earlier-boot');
  leavePending(m, third.id, 'an-earlier-boot');
  m.host.bootId = 'fake-boot-2';
  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped?.checkpoints, [`dropped:${third.id}`, `dropped:${second.id}`]);
  t.deepEqual(
    r.engine.catalog.checkpointsOf(id).map((c) => c.id),
    [ckpt.id],
  );
  t.is(r.row(id).head_checkpoint_id, ckpt.id);
  t.false(fs.existsSync(r.engine.paths.processImage(second.id)));
  t.false(fs.existsSync(r.engine.paths.processImage(third.id)));
  t.false(m.host.layers.has(second.layerId));
  t.false(m.host.layers.has(third.layerId));
});

test('a pending checkpoint of this boot stays pending when the sync fails, and is dropped when its image is gone', async (t) => {
  const { m, id, ckpt } = await checkpointedSandbox(t);
  const second = await m.ls.get(id).checkpoint();
  await m.ls.get(id).settled();
  leavePending(m, ckpt.id, m.host.bootId);
  leavePending(m, second.id, m.host.bootId);
  fs.rmSync(m.engine.paths.processImage(second.id), { recursive: true, force: true });
  m.host.failAt('layers.sync');
  const r = await reopen(t, m);
  t.deepEqual(r.ls.reaped?.checkpoints, [`dropped:${second.id}`]);
  t.is(r.engine.catalog.checkpoint(ckpt.id)!.durable_at, null, 'whole files: still pending, not thrown away');
  t.is(r.row(id).head_checkpoint_id, ckpt.id);
});
