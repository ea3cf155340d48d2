/**
 * Rollback's decisions, on the fake host (no root): both paths (CRIU
 * restore, warm-standby swap), their order of steps, the point of no return
 * (the old tree is killed only after the journal says "killing"), and what
 * each failure leaves: before that point, the sandbox as it was; after it,
 * the checkpoint's files with no processes, recorded as "stopped".
 */
import test, { type ExecutionContext } from 'ava';
import { openFake, type FakeManager } from '../fakes/manager.js';
import { systemError } from '../fakes/host.js';
import type { CheckpointInfo } from '../../src/checkpoints/checkpoint.js';
import type { FaultPoint } from '../../src/faults.js';

interface Setup extends FakeManager {
  id: string;
  ckpt: CheckpointInfo;
  oldPid: number;
  oldBranch: string;
}

/** A sandbox checkpointed at (files-v1, counter=1), then changed to (files-v2, counter=2). */
async function changedAfterCheckpoint(
  t: ExecutionContext,
  opts: { standby: boolean; fault?: (p: FaultPoint) => void },
): Promise<Setup> {
  const m = await openFake(t, {
    open: { config: { standby: opts.standby }, ...(opts.fault ? { fault: opts.fault } : {}) },
  });
  const sb = await m.ls.create();
  const pid = m.row(sb.id).init_pid!;
  m.host.uppers.set(m.row(sb.id).instance, 'files-v1');
  m.host.processes.get(pid)!.memory = 'counter=1';
  const ckpt = await sb.checkpoint();
  await sb.settled(); // the warm standby, when on
  m.host.uppers.set(m.row(sb.id).instance, 'files-v2');
  m.host.processes.get(pid)!.memory = 'counter=2';
  return { ...m, id: sb.id, ckpt, oldPid: pid, oldBranch: m.row(sb.id).branch_id };
}

test('restore path: kill, reset the layer, mount, restore, in that order; the sandbox is at the checkpoint', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: false });
  const instance = s.row(s.id).instance;
  const cg = s.engine.runtime.cgroupName(instance);
  const root = s.engine.paths.sandboxRoot(instance);
  const mark = s.host.calls.length;
  const report = await s.ls.get(s.id).rollback(s.ckpt.id);
  t.deepEqual(s.host.since(mark), [
    'criu.ensureRunning',
    `cgroups.kill ${cg}`,
    `native.unmount ${root}`,
    `layers.resetUpperTo ${instance} ${s.ckpt.layerId}`,
    `native.mountOverlay ${root}`,
    `criu.restore ${s.ckpt.id}`,
  ]);
  t.is(report.path, 'restore');
  t.false(s.host.proc.isAlive(s.oldPid));
  t.is(s.host.processes.get(report.pid)!.memory, 'counter=1');
  t.is(s.host.uppers.get(instance), 'files-v1');
  t.like(s.row(s.id), {
    state: 'running',
    init_pid: report.pid,
    head_checkpoint_id: s.ckpt.id,
    branch_id: report.branchId,
  });
  t.not(report.branchId, s.oldBranch);
  t.is(report.previousBranchId, s.oldBranch);
  t.deepEqual(s.engine.catalog.operations(), []);
});

test('a failure before the point of no return changes nothing', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: false });
  s.host.failAt('criu.ensureRunning', systemError('ECONNREFUSED', 'criu'));
  const mark = s.host.calls.length;
  await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id), { message: /ECONNREFUSED/ });
  t.false(s.host.since(mark).some((c) => c.startsWith('cgroups.kill')));
  t.like(s.row(s.id), { state: 'running', init_pid: s.oldPid, branch_id: s.oldBranch });
  t.is(s.host.processes.get(s.oldPid)!.memory, 'counter=2');
  t.is(s.host.uppers.get(s.row(s.id).instance), 'files-v2');
  t.deepEqual(s.engine.catalog.operations(), []);
});

test("refused input (another sandbox's checkpoint, a damaged one) changes nothing", async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: false });
  const other = await s.ls.create();
  await t.throwsAsync(s.ls.get(other.id).rollback(s.ckpt.id), { code: 'CHECKPOINT_NOT_FOUND' });
  s.host.layers.delete(s.ckpt.layerId);
  const mark = s.host.calls.length;
  await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id), { code: 'CHECKPOINT_DAMAGED' });
  t.deepEqual(s.host.since(mark), []);
  t.like(s.row(s.id), { state: 'running', init_pid: s.oldPid });
});

for (const at of ['layers.resetUpperTo', 'native.mountOverlay', 'criu.restore']) {
  test(`past the point of no return, a failure at ${at} leaves the sandbox stopped at the checkpoint`, async (t) => {
    const s = await changedAfterCheckpoint(t, { standby: false });
    s.host.failAt(at);
    await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id));
    const row = s.row(s.id);
    t.like(row, { state: 'stopped', init_pid: null, head_checkpoint_id: s.ckpt.id });
    t.not(row.branch_id, s.oldBranch, 'the old timeline is gone: a new branch');
    t.false(s.host.proc.isAlive(s.oldPid));
    t.deepEqual(s.host.cgroupDriver.pids(s.engine.runtime.cgroupName(row.instance)), []);
    t.deepEqual(s.engine.catalog.operations(), []);
  });
}

test('a restored tree that cannot be recorded is killed, and the sandbox is stopped', async (t) => {
  let armed = false;
  const s = await changedAfterCheckpoint(t, {
    standby: false,
    fault: (p) => {
      if (armed && p === 'rollback:commit') throw new Error('commit failed');
    },
  });
  armed = true;
  const cg = s.engine.runtime.cgroupName(s.row(s.id).instance);
  await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id), { message: 'commit failed' });
  t.like(s.row(s.id), { state: 'stopped', init_pid: null, head_checkpoint_id: s.ckpt.id });
  t.deepEqual(s.host.cgroupDriver.pids(cg), [], 'the restored process was killed');
});

test('standby path: freeze the current tree, swap the standby in, thaw it; no CRIU restore', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: true });
  const before = s.row(s.id);
  const standby = s.standby(s.id)!;
  t.is(standby.checkpoint, s.ckpt.id);
  const standbyKey = standby.instance;
  const standbyPid = standby.pid!;
  const mark = s.host.calls.length;
  const report = await s.ls.get(s.id).rollback(s.ckpt.id);
  const answered = s.host.since(mark);
  t.deepEqual(answered.slice(0, 3), [
    'criu.ensureRunning',
    `cgroups.freeze ${s.engine.runtime.cgroupName(before.instance)}`,
    `cgroups.thaw ${s.engine.runtime.cgroupName(standbyKey)}`,
  ]);
  t.false(answered.some((c) => c.startsWith('criu.restore')));
  t.is(report.path, 'standby');
  t.is(report.pid, standbyPid);
  t.is(s.host.processes.get(standbyPid)!.memory, 'counter=1');
  t.is(s.host.uppers.get(standbyKey), 'files-v1');
  t.like(s.row(s.id), {
    state: 'running',
    instance: standbyKey,
    init_pid: standbyPid,
    head_checkpoint_id: s.ckpt.id,
  });
  t.is(s.standby(s.id), undefined);
  // The old instance goes after the answer, behind the sandbox's lock.
  await s.ls.get(s.id).settled();
  t.false(s.host.proc.isAlive(s.oldPid));
  t.false(s.host.uppers.has(before.instance));
  t.false(s.host.cgroups.has(s.engine.runtime.cgroupName(before.instance)));
  t.deepEqual(s.engine.catalog.operations(), []);
});

test('standby path: a failure to freeze the current tree abandons the swap; the sandbox and the standby stay', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: true });
  const before = s.row(s.id);
  const standbyBefore = s.standby(s.id);
  s.host.failAt(`cgroups.freeze ${s.engine.runtime.cgroupName(before.instance)}`);
  await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id));
  t.like(s.row(s.id), {
    state: 'running',
    instance: before.instance,
    init_pid: s.oldPid,
    branch_id: s.oldBranch,
  });
  t.is(s.standby(s.id)?.instance, standbyBefore?.instance);
  t.false(s.host.cgroupDriver.isFrozen(s.engine.runtime.cgroupName(before.instance)));
  t.deepEqual(s.engine.catalog.operations(), []);
  // The standby is still good for another try.
  const report = await s.ls.get(s.id).rollback(s.ckpt.id);
  t.is(report.path, 'standby');
});

test('standby path: a swapped-in tree that cannot be thawed is killed and the sandbox recorded stopped', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: true });
  const standbyKey = s.standby(s.id)!.instance!;
  s.host.failAt(`cgroups.thaw ${s.engine.runtime.cgroupName(standbyKey)}`);
  await t.throwsAsync(s.ls.get(s.id).rollback(s.ckpt.id));
  t.like(s.row(s.id), { state: 'stopped', init_pid: null, instance: standbyKey });
  t.deepEqual(s.host.cgroupDriver.pids(s.engine.runtime.cgroupName(standbyKey)), []);
});

test('a standby whose pid now names another process is not used: the rollback restores with CRIU', async (t) => {
  const s = await changedAfterCheckpoint(t, { standby: true });
  const stale = s.standby(s.id)!.instance!;
  s.host.processes.get(s.standby(s.id)!.pid!)!.start += 1;
  const report = await s.ls.get(s.id).rollback(s.ckpt.id);
  t.is(report.path, 'restore');
  t.is(s.host.processes.get(report.pid)!.memory, 'counter=1');
  t.is(s.standby(s.id)?.instance ?? null, null);
  await s.ls.get(s.id).settled();
  t.false(s.host.cgroups.has(s.engine.runtime.cgroupName(stale)), 'the stale standby was removed after the answer');
});

for (const standby of [false, true]) {
  test(`${standby ? 'standby' : 'restore'} path: verdicts are judged against the restored files`, async (t) => {
    const m = await openFake(t, { open: { config: { standby } } });
    const file = '/app/pkg.tgz';
    m.host.files.set('files-v1', { [file]: 'the scanned package' });
    m.host.files.set('files-v2', { [file]: 'a package nobody scanned' });
    const sb = await m.ls.create();
    m.host.uppers.set(m.row(sb.id).instance, 'files-v1');
    const kept = await sb.verdicts.record({ path: file, verdict: 'malware-scan:clean' });
    const ckpt = await sb.checkpoint();
    await sb.settled();
    m.host.uppers.set(m.row(sb.id).instance, 'files-v2');
    const dropped = await sb.verdicts.record({ path: file, verdict: 'tests:pass' });
    t.not(dropped.contentHash, kept.contentHash);

    const report = await sb.rollback(ckpt.id);
    t.is(report.path, standby ? 'standby' : 'restore');
    t.is(m.host.uppers.get(m.row(sb.id).instance), 'files-v1');
    // The verdict made on the restored bytes holds; the one made on the replaced bytes is reported, with what the file holds now.
    t.deepEqual(
      report.staleVerdicts.map((v) => [v.id, v.verdict, v.contentHash, v.currentHash]),
      [[dropped.id, 'tests:pass', dropped.contentHash, kept.contentHash]],
    );
    t.deepEqual(
      (await sb.verdicts.stale()).map((v) => v.id),
      [dropped.id],
    );
  });
}
