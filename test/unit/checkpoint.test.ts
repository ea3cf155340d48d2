/**
 * The checkpoint's decisions, on the fake host (no root): the order of its
 * steps, and that a failure at any step leaves no trace and the sandbox
 * running and thawed.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import { openFake } from '../fakes/manager.js';
import { systemError } from '../fakes/host.js';

async function sandboxWithFiles(t: ExecutionContext, content: string, durableLater = true) {
  const m = await openFake(t, { open: { config: { standby: false, durableLater } } });
  const sb = await m.ls.create();
  m.host.uppers.set(m.row(sb.id).instance, content);
  m.host.processes.get(m.row(sb.id).init_pid!)!.memory = 'counter=7';
  return { ...m, sb };
}

test('a checkpoint freezes, snapshots, dumps, thaws and commits; the sync and checksums follow behind the lock', async (t) => {
  const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'files-v1');
  const cg = engine.runtime.cgroupName(row(sb.id).instance);
  const mark = host.calls.length;
  const info = await ls.get(sb.id).checkpoint({ label: 'first' });
  t.deepEqual(host.since(mark), [
    'criu.ensureRunning',
    `cgroups.freeze ${cg}`,
    `layers.snapshotUpper ${sb.id} ${info.layerId}`,
    `criu.dump ${row(sb.id).init_pid}`,
    `cgroups.thaw ${cg}`,
  ]);
  // Runnable: recorded and head, not durable yet.
  t.is(info.durableAt, null);
  t.is(engine.catalog.checkpoint(info.id)!.checksums, null);
  t.is(engine.catalog.checkpoint(info.id)!.boot_id, host.bootId);
  const durable = await ls.get(sb.id).durable(info.id);
  t.deepEqual(host.since(mark).slice(5), ['layers.sync']);
  t.not(durable.durableAt, null);
  const checksums = JSON.parse(engine.catalog.checkpoint(info.id)!.checksums!) as { images: Record<string, unknown> };
  t.deepEqual(Object.keys(checksums.images), ['memory']);
  t.is(typeof durable.timings.toDurableMs, 'number');
  // What was taken: the layer's content and the process's memory, as they were.
  t.is(host.layers.get(info.layerId), 'files-v1');
  t.is(fs.readFileSync(`${engine.paths.processImage(info.id)}/memory`, 'utf8'), 'counter=7');
  t.is(row(sb.id).head_checkpoint_id, info.id);
  t.is(engine.catalog.checkpoint(info.id)!.label, 'first');
  t.deepEqual(engine.catalog.operations(), []);
  t.false(host.cgroupDriver.isFrozen(cg));
});

test('with durableLater off the sync comes before the commit, and the checkpoint returns durable', async (t) => {
  const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'files-v1', false);
  const cg = engine.runtime.cgroupName(row(sb.id).instance);
  const mark = host.calls.length;
  const info = await ls.get(sb.id).checkpoint();
  t.deepEqual(host.since(mark).slice(-2), [`cgroups.thaw ${cg}`, 'layers.sync']);
  t.not(info.durableAt, null);
  t.not(engine.catalog.checkpoint(info.id)!.checksums, null);
  await ls.get(sb.id).settled();
  t.deepEqual(host.since(mark).slice(-1), ['layers.sync'], 'no second sync in the background');
});

test('a background sync that fails leaves the checkpoint pending; a CRIU rollback makes it durable before it verifies', async (t) => {
  const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'files-v1');
  host.failAt('layers.sync', systemError('EIO', 'layers.sync'));
  const info = await ls.get(sb.id).checkpoint();
  await ls.get(sb.id).settled();
  t.is(engine.catalog.checkpoint(info.id)!.durable_at, null, 'still pending, still recorded');
  t.is(row(sb.id).head_checkpoint_id, info.id);
  host.uppers.set(row(sb.id).instance, 'files-v2');
  const mark = host.calls.length;
  await ls.get(sb.id).rollback(info.id);
  const calls = host.since(mark);
  t.true(
    calls.indexOf('layers.sync') >= 0 &&
      calls.indexOf('layers.sync') < calls.findIndex((c) => c.startsWith('criu.restore')),
  );
  t.not(engine.catalog.checkpoint(info.id)!.durable_at, null);
  t.is(host.uppers.get(row(sb.id).instance), 'files-v1');
});

const failures = [
  { at: 'cgroups.freeze', thawed: false, durableLater: true },
  { at: 'layers.snapshotUpper', thawed: true, durableLater: true },
  { at: 'criu.dump', thawed: true, durableLater: true },
  { at: 'layers.sync', thawed: true, durableLater: false },
];

for (const { at, thawed, durableLater } of failures) {
  test(`a failure at ${at} leaves no checkpoint, no layer, no image, and the sandbox running`, async (t) => {
    const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'files-v1', durableLater);
    const before = row(sb.id);
    const cg = engine.runtime.cgroupName(before.instance);
    const layersBefore = [...host.layers.keys()];
    host.failAt(at, systemError('EIO', at));
    const mark = host.calls.length;
    await t.throwsAsync(ls.get(sb.id).checkpoint(), { message: `${at}: EIO` });
    const calls = host.since(mark);
    t.is(calls.includes(`cgroups.thaw ${cg}`), thawed, 'thawed exactly when it had been frozen');
    // The layer is always deleted (idempotent), also when it was never made.
    t.true(calls.some((c) => c.startsWith('layers.deleteLayer ')));
    t.deepEqual([...host.layers.keys()], layersBefore);
    t.deepEqual(fs.readdirSync(engine.paths.processImages), []);
    t.deepEqual(engine.catalog.checkpointsOf(sb.id), []);
    t.deepEqual(engine.catalog.operations(), []);
    t.false(host.cgroupDriver.isFrozen(cg));
    t.like(row(sb.id), {
      state: 'running',
      init_pid: before.init_pid,
      head_checkpoint_id: null,
      branch_id: before.branch_id,
    });
    t.true(host.proc.isAlive(before.init_pid!));
  });
}

test('an init whose pid now names another process is not dumped: SANDBOX_NOT_RUNNING, and the tree is thawed', async (t) => {
  const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'files-v1');
  const cg = engine.runtime.cgroupName(row(sb.id).instance);
  // Same pid, another start time: the pid was reused by a process that is not the init.
  host.processes.get(row(sb.id).init_pid!)!.start += 1;
  const mark = host.calls.length;
  await t.throwsAsync(ls.get(sb.id).checkpoint(), { code: 'SANDBOX_NOT_RUNNING' });
  const calls = host.since(mark);
  t.false(calls.some((c) => c.startsWith('criu.dump')));
  t.false(calls.some((c) => c.startsWith('layers.snapshotUpper')));
  t.true(calls.includes(`cgroups.thaw ${cg}`));
  t.deepEqual(engine.catalog.operations(), []);
});

test('bad input is refused before anything is frozen', async (t) => {
  const { ls, host, sb } = await sandboxWithFiles(t, 'x');
  const mark = host.calls.length;
  await t.throwsAsync(ls.get(sb.id).checkpoint({ label: 'two\nlines' }), { code: 'INVALID_ARGUMENT' });
  t.deepEqual(host.since(mark), []);
});

test('the tenant quota is checked in the commit: over it, the files made are removed', async (t) => {
  const { ls, host, engine, row, sb } = await sandboxWithFiles(t, 'x');
  const { addTenant } = await import('../../src/tenants/tenants.js');
  const { tenant } = addTenant(engine.catalog.db, 'acme', { maxCheckpointMb: 1 });
  engine.catalog.updateSandbox(sb.id, { tenant: tenant.id });
  // A process image of 2 MiB does not fit in 1 MiB.
  host.processes.get(row(sb.id).init_pid!)!.memory = 'x'.repeat(2 * 1024 * 1024);
  const layersBefore = [...host.layers.keys()];
  await t.throwsAsync(ls.get(sb.id, tenant.id).checkpoint(), { code: 'QUOTA_EXCEEDED' });
  t.deepEqual([...host.layers.keys()], layersBefore);
  t.deepEqual(engine.catalog.checkpointsOf(sb.id), []);
  t.is(row(sb.id).state, 'running');
});

test('past the commit, a failure does not discard the checkpoint: its files stay with its record', async (t) => {
  let armed = false;
  const m = await openFake(t, {
    open: {
      config: { standby: false },
      fault: (p) => {
        if (armed && p === 'checkpoint:committed') throw new Error('after the commit');
      },
    },
  });
  const sb = await m.ls.create();
  armed = true;
  await t.throwsAsync(sb.checkpoint(), { message: 'after the commit' });
  const [row] = m.engine.catalog.checkpointsOf(sb.id);
  t.truthy(row);
  t.true(m.host.layers.has(row!.layer_id));
  t.true(fs.existsSync(`${m.engine.paths.processImage(row!.id)}/memory`));
  // And a rollback to it works.
  armed = false;
  const report = await sb.rollback(row!.id);
  t.is(report.checkpointId, row!.id);
});
