/**
 * CgroupV1 and CgroupV2 against a fake cgroupfs: plain directories and files
 * in a temp dir passed as the driver's root. Where the driver polls a file
 * the kernel would update (freezer.state, cgroup.events, cgroup.procs), the
 * test plays the kernel by writing that file itself.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import test, { type ExecutionContext } from 'ava';
import { CgroupV1, CgroupV2, detectCgroups, sharesForWeight } from '../../src/host/cgroups.js';

const NAME = 'lockstep/tag0123456/sbx_unit';

function fakeRoot(t: ExecutionContext): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-cgfake-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const read = (f: string) => fs.readFileSync(f, 'utf8');
const tick = () => new Promise<void>((r) => setTimeout(r, 15));

/** In a real cgroupfs the control files do not stop rmdir; in the fake they would, so drop them. */
function dropControlFiles(dir: string): void {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) if (e.isFile()) fs.unlinkSync(path.join(dir, e.name));
}

/** A process of our own for the kill tests (never a stranger's pid). */
function startSleeper(t: ExecutionContext) {
  const child = spawn('sleep', ['300'], { stdio: 'ignore' });
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { pid: child.pid!, exited };
}

// ---- cgroup v1 ------------------------------------------------------------

test('v1 create makes one directory per controller and writes the limits', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  cg.create(NAME, { pids: 32, memoryBytes: 64 * 1024 * 1024 });
  for (const c of ['pids', 'memory', 'freezer']) t.true(fs.statSync(path.join(root, c, NAME)).isDirectory(), c);
  t.is(read(path.join(root, 'pids', NAME, 'pids.max')), '32');
  t.is(read(path.join(root, 'memory', NAME, 'memory.limit_in_bytes')), String(64 * 1024 * 1024));
});

test('v1 create without limits writes no limit files', (t) => {
  const root = fakeRoot(t);
  new CgroupV1(root).create(NAME, {});
  t.false(fs.existsSync(path.join(root, 'pids', NAME, 'pids.max')));
  t.false(fs.existsSync(path.join(root, 'memory', NAME, 'memory.limit_in_bytes')));
});

test('v1 procsFiles, freezerPath and pids name the right files', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  t.deepEqual(cg.procsFiles(NAME), [
    path.join(root, 'pids', NAME, 'cgroup.procs'),
    path.join(root, 'memory', NAME, 'cgroup.procs'),
    path.join(root, 'freezer', NAME, 'cgroup.procs'),
  ]);
  t.is(cg.freezerPath(NAME), path.join(root, 'freezer', NAME));
  t.deepEqual(cg.pids(NAME), [], 'no cgroup: no pids');
  cg.create(NAME, {});
  fs.writeFileSync(path.join(root, 'pids', NAME, 'cgroup.procs'), '101\n202\n303\n');
  t.deepEqual(cg.pids(NAME), [101, 202, 303]);
});

test('v1 freeze writes FROZEN, thaw writes THAWED, isFrozen reads the state', async (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  cg.create(NAME, {});
  const state = path.join(root, 'freezer', NAME, 'freezer.state');
  t.false(cg.isFrozen(NAME), 'no state file yet');
  fs.writeFileSync(state, 'THAWED\n');
  t.false(cg.isFrozen(NAME));
  await cg.freeze(NAME, 1000);
  t.is(read(state), 'FROZEN');
  t.true(cg.isFrozen(NAME));
  // The kernel reports FREEZING while it is still stopping tasks: that is not thawed either.
  fs.writeFileSync(state, 'FREEZING\n');
  t.true(cg.isFrozen(NAME));
  cg.thaw(NAME);
  t.is(read(state), 'THAWED');
  t.false(cg.isFrozen(NAME));
});

test('v1 kill SIGKILLs every member and waits until the cgroup is empty', async (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  cg.create(NAME, {});
  const sleeper = startSleeper(t);
  const procs = path.join(root, 'pids', NAME, 'cgroup.procs');
  fs.writeFileSync(procs, `${sleeper.pid}\n`);
  let settled = false;
  const killing = cg.kill(NAME, 5000).then(() => (settled = true));
  t.is(await sleeper.exited, 'SIGKILL');
  await tick();
  t.false(settled, 'kill() waits for the kernel to empty cgroup.procs');
  fs.writeFileSync(procs, ''); // the kernel drops the dead task
  await killing;
  t.is(read(path.join(root, 'freezer', NAME, 'freezer.state')), 'THAWED', 'thawed again so the SIGKILL is delivered');
});

test('v1 kill of a cgroup that does not exist is a no-op', async (t) => {
  const root = fakeRoot(t);
  await new CgroupV1(root).kill('lockstep/none/sbx_gone', 100);
  t.false(fs.existsSync(path.join(root, 'freezer', 'lockstep')));
});

test('v1 remove is idempotent and removes every controller directory', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  cg.create(NAME, { pids: 8, memoryBytes: 1 << 24 });
  for (const c of ['pids', 'memory', 'freezer']) dropControlFiles(path.join(root, c, NAME));
  cg.remove(NAME);
  for (const c of ['pids', 'memory', 'freezer']) t.false(fs.existsSync(path.join(root, c, NAME)), c);
  t.notThrows(() => cg.remove(NAME));
  t.notThrows(() => cg.remove('lockstep/never/created'));
});

test('v1 remove reports a cgroup that still has children (only ENOENT counts as gone)', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  cg.create(`${NAME}/child`, {});
  const err = t.throws(() => cg.remove(NAME));
  t.truthy((err as NodeJS.ErrnoException).code);
  t.true(fs.existsSync(path.join(root, 'pids', NAME, 'child')));
});

test('v1 children lists the sub-directories of a group in the pids hierarchy', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  t.deepEqual(cg.children('lockstep/tag0123456'), []);
  cg.create('lockstep/tag0123456/sbx_a', {});
  cg.create('lockstep/tag0123456/sbx_b', {});
  cg.create('lockstep/othertag00/sbx_c', {});
  fs.writeFileSync(path.join(root, 'pids', 'lockstep/tag0123456', 'pids.max'), 'max');
  t.deepEqual(cg.children('lockstep/tag0123456').sort(), ['sbx_a', 'sbx_b']);
});

test('v1 oomKills reads oom_kill from memory.oom_control', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  t.is(cg.oomKills(NAME), 0, 'no cgroup');
  cg.create(NAME, {});
  fs.writeFileSync(
    path.join(root, 'memory', NAME, 'memory.oom_control'),
    'oom_kill_disable 0\nunder_oom 0\noom_kill 3\n',
  );
  t.is(cg.oomKills(NAME), 3);
});

// ---- cgroup v2 ------------------------------------------------------------

test('v2 create enables controllers top-down and writes the limits in the leaf', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  cg.create(NAME, { pids: 64, memoryBytes: 32 * 1024 * 1024 });
  for (const dir of [root, path.join(root, 'lockstep'), path.join(root, 'lockstep/tag0123456')]) {
    t.is(read(path.join(dir, 'cgroup.subtree_control')), '+memory +pids', dir);
  }
  const leaf = path.join(root, NAME);
  t.false(fs.existsSync(path.join(leaf, 'cgroup.subtree_control')), 'the leaf holds processes, not children');
  t.is(read(path.join(leaf, 'pids.max')), '64');
  t.is(read(path.join(leaf, 'memory.max')), String(32 * 1024 * 1024));
  t.is(read(path.join(leaf, 'memory.swap.max')), '0');
});

test('v2 create fails with CGROUP_CONTROLLERS when a controller cannot be enabled', (t) => {
  const root = fakeRoot(t);
  fs.mkdirSync(path.join(root, 'cgroup.subtree_control')); // writing it fails with EISDIR
  const err = t.throws(() => new CgroupV2(root).create(NAME, { pids: 8 }));
  t.is((err as { code?: string }).code, 'CGROUP_CONTROLLERS');
  t.true(err!.message.includes(root));
});

test('v2 procsFiles, freezerPath and pids name the right files', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  t.deepEqual(cg.procsFiles(NAME), [path.join(root, NAME, 'cgroup.procs')]);
  t.is(cg.freezerPath(NAME), path.join(root, NAME));
  cg.create(NAME, {});
  fs.writeFileSync(path.join(root, NAME, 'cgroup.procs'), '7\n8\n');
  t.deepEqual(cg.pids(NAME), [7, 8]);
});

test('v2 freeze writes cgroup.freeze=1 and waits for "frozen 1" in cgroup.events', async (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  cg.create(NAME, {});
  const events = path.join(root, NAME, 'cgroup.events');
  fs.writeFileSync(events, 'populated 1\nfrozen 0\n');
  let settled = false;
  const freezing = cg.freeze(NAME, 5000).then(() => (settled = true));
  await tick();
  t.is(read(path.join(root, NAME, 'cgroup.freeze')), '1');
  t.false(settled, 'still waiting for the kernel');
  fs.writeFileSync(events, 'populated 1\nfrozen 1\n'); // the kernel finished freezing
  await freezing;
  t.true(cg.isFrozen(NAME));
  cg.thaw(NAME);
  t.is(read(path.join(root, NAME, 'cgroup.freeze')), '0');
  t.false(cg.isFrozen(NAME));
});

test('v2 freeze gives up with CGROUP_TIMEOUT when the kernel never reports frozen', async (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  cg.create(NAME, {});
  fs.writeFileSync(path.join(root, NAME, 'cgroup.events'), 'populated 1\nfrozen 0\n');
  await t.throwsAsync(cg.freeze(NAME, 50), { code: 'CGROUP_TIMEOUT' });
});

test('v2 kill writes cgroup.kill and waits until cgroup.procs is empty', async (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  cg.create(NAME, {});
  const procs = path.join(root, NAME, 'cgroup.procs');
  fs.writeFileSync(procs, '4242\n');
  let settled = false;
  const killing = cg.kill(NAME, 5000).then(() => (settled = true));
  await tick();
  t.is(read(path.join(root, NAME, 'cgroup.kill')), '1');
  t.false(settled);
  fs.writeFileSync(procs, '');
  await killing;
  t.true(settled);
});

test('v2 remove is idempotent; children and oomKills read the unified tree', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV2(root);
  cg.create('lockstep/tag0123456/sbx_a', { pids: 8 });
  cg.create('lockstep/tag0123456/sbx_b', {});
  t.deepEqual(cg.children('lockstep/tag0123456').sort(), ['sbx_a', 'sbx_b']);
  t.deepEqual(cg.children('lockstep/missing'), []);
  fs.writeFileSync(
    path.join(root, 'lockstep/tag0123456/sbx_a', 'memory.events'),
    'low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n',
  );
  t.is(cg.oomKills('lockstep/tag0123456/sbx_a'), 2);
  t.is(cg.oomKills('lockstep/tag0123456/sbx_b'), 0);
  dropControlFiles(path.join(root, 'lockstep/tag0123456/sbx_a'));
  cg.remove('lockstep/tag0123456/sbx_a');
  t.false(fs.existsSync(path.join(root, 'lockstep/tag0123456/sbx_a')));
  t.notThrows(() => cg.remove('lockstep/tag0123456/sbx_a'));
  t.deepEqual(cg.children('lockstep/tag0123456'), ['sbx_b']);
});

// ---- detection ----------------------------------------------------------

test('detectCgroups picks v2 when cgroup.controllers is at the root', (t) => {
  const root = fakeRoot(t);
  fs.writeFileSync(path.join(root, 'cgroup.controllers'), 'cpu memory pids\n');
  const cg = detectCgroups(root);
  t.true(cg instanceof CgroupV2);
  t.is(cg.version, 2);
});

test('detectCgroups picks v1 when pids, memory and freezer are mounted', (t) => {
  const root = fakeRoot(t);
  for (const c of ['pids', 'memory', 'freezer']) {
    fs.mkdirSync(path.join(root, c));
    fs.writeFileSync(path.join(root, c, 'cgroup.procs'), '');
  }
  const cg = detectCgroups(root);
  t.true(cg instanceof CgroupV1);
  t.is(cg.version, 1);
});

test('detectCgroups names the missing v1 controllers', (t) => {
  const root = fakeRoot(t);
  fs.mkdirSync(path.join(root, 'pids'));
  fs.writeFileSync(path.join(root, 'pids', 'cgroup.procs'), '');
  const err = t.throws(() => detectCgroups(root));
  t.is((err as { code?: string }).code, 'CGROUP_UNAVAILABLE');
  t.true(err!.message.includes('memory, freezer'));
});

// ---- CPU and I/O limits -----------------------------------------------------

test('v1 writes cpu.shares (weight * 1024 / 100) and the CFS quota in the cpu hierarchy, and joins cpu and cpuacct too', (t) => {
  const root = fakeRoot(t);
  for (const c of ['pids', 'memory', 'freezer', 'cpu', 'cpuacct'])
    fs.mkdirSync(path.join(root, c), { recursive: true });
  for (const c of ['pids', 'memory', 'freezer', 'cpu', 'cpuacct'])
    fs.writeFileSync(path.join(root, c, 'cgroup.procs'), '');
  fs.writeFileSync(path.join(root, 'cpu', 'cpu.shares'), '1024');
  const cg = new CgroupV1(root);
  t.true(cg.cpuControl);
  cg.create(NAME, { cpuWeight: 400, cpuQuotaUs: 50_000 });
  t.is(read(path.join(root, 'cpu', NAME, 'cpu.shares')), '4096');
  t.is(read(path.join(root, 'cpu', NAME, 'cpu.cfs_quota_us')), '50000');
  t.is(read(path.join(root, 'cpu', NAME, 'cpu.cfs_period_us')), '100000');
  t.true(cg.procsFiles(NAME).includes(path.join(root, 'cpuacct', NAME, 'cgroup.procs')));
  fs.writeFileSync(path.join(root, 'cpuacct', NAME, 'cpuacct.usage'), '2500000\n');
  t.is(cg.cpuUsageUsec(NAME), 2500);
});

test('weights map to shares linearly, so ratios survive on v1', (t) => {
  t.is(sharesForWeight(100), 1024);
  t.is(sharesForWeight(1), 10);
  t.is(sharesForWeight(10_000), 102_400);
  t.is(sharesForWeight(400) / sharesForWeight(100), 4);
});

test('v1 without a cpu hierarchy refuses a CPU weight instead of ignoring it', (t) => {
  const root = fakeRoot(t);
  const cg = new CgroupV1(root);
  t.false(cg.cpuControl);
  t.throws(() => cg.create(NAME, { cpuWeight: 200 }), { code: 'CGROUP_CONTROLLERS' });
});

test('v2 enables cpu where available and writes cpu.weight and cpu.max; cpu.stat gives the usage', (t) => {
  const root = fakeRoot(t);
  fs.writeFileSync(path.join(root, 'cgroup.controllers'), 'cpuset cpu io memory pids\n');
  const cg = new CgroupV2(root, path.join(root, 'no-block'));
  cg.create(NAME, { cpuWeight: 250, cpuQuotaUs: 20_000 });
  t.is(read(path.join(root, 'cgroup.subtree_control')), '+memory +pids +cpu +io');
  t.is(read(path.join(root, NAME, 'cpu.weight')), '250');
  t.is(read(path.join(root, NAME, 'cpu.max')), '20000 100000');
  fs.writeFileSync(path.join(root, NAME, 'cpu.stat'), 'usage_usec 777\nuser_usec 700\n');
  t.is(cg.cpuUsageUsec(NAME), 777);
});

test('I/O weight is reported unavailable unless BFQ (or io.cost) would honour it', (t) => {
  const root = fakeRoot(t);
  const sysBlock = path.join(root, 'sys-block');
  fs.mkdirSync(path.join(sysBlock, 'vda', 'queue'), { recursive: true });
  fs.writeFileSync(path.join(sysBlock, 'vda', 'queue', 'scheduler'), 'none [mq-deadline] kyber bfq\n');
  fs.writeFileSync(path.join(root, 'cgroup.controllers'), 'cpu io memory pids\n');
  const v2 = new CgroupV2(root, sysBlock);
  const off = v2.ioWeightSupport();
  t.false(off.ok);
  t.regex(off.detail, /BFQ/);
  t.throws(() => v2.create(NAME, { ioWeight: 100 }), { code: 'CGROUP_CONTROLLERS' });
  fs.writeFileSync(path.join(sysBlock, 'vda', 'queue', 'scheduler'), 'none mq-deadline kyber [bfq]\n');
  const on = v2.ioWeightSupport();
  t.like(on, { ok: true, file: 'io.bfq.weight' });
  v2.create(NAME, { ioWeight: 300 });
  t.is(read(path.join(root, NAME, 'io.bfq.weight')), '300');

  const v1root = path.join(root, 'v1');
  fs.mkdirSync(path.join(v1root, 'blkio'), { recursive: true });
  fs.writeFileSync(path.join(v1root, 'blkio', 'cgroup.procs'), '');
  t.like(new CgroupV1(v1root, sysBlock).ioWeightSupport(), { ok: false });
});
