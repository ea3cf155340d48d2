/**
 * Fork's decisions, on the fake host (no root): each child is built in
 * order (cgroup, /dev, a writable copy of the checkpoint's layer, the root,
 * CRIU), one failed child is removed whole without sinking the others, and
 * an abort stops the children that have not started.
 */
import test from 'ava';
import { openFake } from '../fakes/manager.js';
import { systemError } from '../fakes/host.js';
import { forkSandbox } from '../../src/checkpoints/fork.js';

async function checkpointed(t: Parameters<typeof openFake>[0]) {
  const m = await openFake(t, { open: { config: { standby: false } } });
  const parent = await m.ls.create();
  m.host.uppers.set(m.row(parent.id).instance, 'files-at-ckpt');
  m.host.processes.get(m.row(parent.id).init_pid!)!.memory = 'counter=5';
  const ckpt = await parent.checkpoint();
  return { ...m, parent, ckpt };
}

test('each child is built in order and starts from the checkpoint; the parent is untouched', async (t) => {
  const m = await checkpointed(t);
  const parentBefore = m.row(m.parent.id);
  const mark = m.host.calls.length;
  const results = await m.parent.fork(m.ckpt.id, { count: 2 });
  t.is(results.length, 2);
  for (const r of results) {
    if (!r.ok) return t.fail(r.error.message);
    const child = m.row(r.id);
    const cg = m.engine.runtime.cgroupName(r.id);
    t.deepEqual(
      m.host.since(mark).filter((c) => c.includes(r.id)),
      [
        `cgroups.create ${cg}`,
        `native.makeDevFolder ${m.engine.paths.sandboxDev(r.id)}`,
        `layers.resetUpperTo ${r.id} ${m.ckpt.layerId}`,
        `native.mountOverlay ${m.engine.paths.sandboxRoot(r.id)}`,
      ],
    );
    t.like(child, { state: 'running', init_pid: r.pid, forked_from: m.ckpt.id, head_checkpoint_id: null });
    t.not(child.branch_id, parentBefore.branch_id);
    t.is(m.host.processes.get(r.pid)!.memory, 'counter=5');
    t.is(m.host.uppers.get(r.id), 'files-at-ckpt');
    t.deepEqual(m.host.cgroupDriver.pids(cg), [r.pid]);
  }
  t.is(m.host.only('criu.restore').length, 2);
  t.is(m.host.only('native.makeDevFolder').length, 2);
  t.like(m.row(m.parent.id), { state: 'running', init_pid: parentBefore.init_pid, branch_id: parentBefore.branch_id });
  t.deepEqual(m.engine.catalog.operations(), []);
});

test('a failed child is removed whole and reported; the others are made', async (t) => {
  const m = await checkpointed(t);
  m.host.failAt('criu.restore', systemError('EIO', 'criu restore'));
  const sandboxesBefore = m.engine.catalog.allSandboxes().length;
  const results = await m.parent.fork(m.ckpt.id, { count: 3 });
  const failed = results.filter((r) => !r.ok);
  t.is(failed.length, 1);
  t.deepEqual(failed[0], { ok: false, error: { code: 'FORK_FAILED', message: 'criu restore: EIO' } });
  t.is(results.filter((r) => r.ok).length, 2);
  t.is(m.engine.catalog.allSandboxes().length, sandboxesBefore + 2);
  // Nothing of the failed child is left: no cgroup, no layer, no mount beyond the live sandboxes'.
  const live = new Set(m.engine.catalog.instanceKeys());
  t.deepEqual(
    [...m.host.uppers.keys()].filter((k) => !live.has(k)),
    [],
  );
  t.deepEqual(
    m.host.cgroupDriver.children(m.engine.runtime.cgroupGroup).filter((k) => !live.has(k)),
    [],
  );
  t.deepEqual(
    [...m.host.mounts].filter(
      (p) => p.includes('/sandboxes/') && ![...live].some((k) => p.includes(`/sandboxes/${k}/`)),
    ),
    [],
  );
  t.deepEqual(m.engine.catalog.operations(), []);
});

test('an abort stops the forks that have not started; the one running finishes whole', async (t) => {
  const m = await checkpointed(t);
  const controller = new AbortController();
  const ckpt = m.engine.catalog.checkpoint(m.ckpt.id)!;
  const results = await forkSandbox(m.engine, m.row(m.parent.id), ckpt, 3, {
    concurrency: 1,
    signal: controller.signal,
    onProgress: () => controller.abort(),
  });
  t.deepEqual(
    results.map((r) => (r.ok ? 'ok' : r.error.code)),
    ['ok', 'FORK_ABORTED', 'FORK_ABORTED'],
  );
  t.is(m.host.only('criu.restore').length, 1);
});

test('the count is checked before anything is made', async (t) => {
  const m = await checkpointed(t);
  const mark = m.host.calls.length;
  await t.throwsAsync(m.parent.fork(m.ckpt.id, { count: 65 }), { code: 'INVALID_ARGUMENT' });
  t.deepEqual(m.host.since(mark), []);
});

test("a fork past the tenant's quota on sandboxes is refused whole: no child, no host call, no journal entry", async (t) => {
  const m = await openFake(t, { open: { config: { standby: false } } });
  const { addTenant } = await import('../../src/tenants/tenants.js');
  const { tenant } = addTenant(m.engine.catalog.db, 'acme', { maxSandboxes: 3 });
  const parent = await m.ls.create({ tenant: tenant.id });
  const ckpt = await parent.checkpoint();
  await parent.settled();
  const mark = m.host.calls.length;
  // Room for two more: a fork of three makes none.
  const e = await t.throwsAsync(parent.fork(ckpt.id, { count: 3 }), { code: 'QUOTA_EXCEEDED' });
  t.like((e as unknown as { details: object }).details, { quota: 'maxSandboxes', limit: 3, used: 1, requested: 3 });
  t.deepEqual(m.host.since(mark), []);
  t.is(m.engine.catalog.allSandboxes().length, 1);
  t.deepEqual(m.engine.catalog.operations(), []);
  // The verb itself refuses (the SDK handle is not what checks): so does a fork of two once the room is taken.
  const row = m.row(parent.id);
  const results = await forkSandbox(m.engine, row, m.engine.catalog.checkpoint(ckpt.id)!, 2);
  t.true(results.every((r) => r.ok));
  await t.throwsAsync(forkSandbox(m.engine, row, m.engine.catalog.checkpoint(ckpt.id)!, 1), {
    code: 'QUOTA_EXCEEDED',
  });
  t.is(m.engine.catalog.allSandboxes().length, 3);
});
