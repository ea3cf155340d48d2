/**
 * CPU weight and cap, disk quota of the writable layer, and their refusal of
 * bad values: each limit is read back from the kernel (cgroup files, btrfs
 * qgroups) and shown to act (counters, errno inside the sandbox), across
 * checkpoint, rollback (both paths) and fork.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { eventually, integration, openTestLockstep, sleep } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';

const MiB = 1024 * 1024;
const bin = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../bin/lockstep.js');

function cli(home: string, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [bin, ...args],
      { env: { ...process.env, LOCKSTEP_HOME: home, NO_COLOR: '1' } },
      (err, stdout, stderr) => {
        if (err && typeof err.code !== 'number') return reject(err);
        resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
      },
    );
  });
}

/** The sandbox's directory in the cpu hierarchy (v1) or the unified one (v2). */
function cpuDir(ls: Lockstep, instance: string): string {
  const name = ls.engine.runtime.cgroupName(instance);
  return ls.engine.cgroups.version === 2 ? path.join('/sys/fs/cgroup', name) : path.join('/sys/fs/cgroup/cpu', name);
}

function cpuWeightFile(ls: Lockstep, instance: string): string {
  const file = ls.engine.cgroups.version === 2 ? 'cpu.weight' : 'cpu.shares';
  return fs.readFileSync(path.join(cpuDir(ls, instance), file), 'utf8').trim();
}

const instanceOf = (sb: Sandbox) => sb.core.row().instance;

/** Starts `n` busy loops in the background inside the sandbox. */
async function spin(sb: Sandbox, n: number): Promise<void> {
  for (let i = 0; i < n; i++) await sb.commands.run('while :; do :; done', { background: true });
}

integration(test, () => {
  test.serial(
    'a write past the disk quota fails with EDQUOT inside; the sandbox, checkpoint, rollback, fork and neighbours carry on',
    async (t) => {
      const ls = await openTestLockstep(t);
      const sb = await ls.create({ diskMb: 8 });
      const other = await ls.create();
      t.is(sb.info().diskMb, 8);
      t.is(other.info().diskMb, 2048, 'a create that names no diskMb gets the default limit');
      t.is(ls.engine.layers.upperUsage(instanceOf(sb))?.quotaBytes, 8 * MiB, 'the qgroup limit of the writable layer');

      // dd stops at the quota; busybox prints strerror(EDQUOT).
      const dd = await sb.commands.run(
        ['sh', '-c', 'dd if=/dev/zero of=/workspace/big bs=1M count=20; echo "dd=$?"; wc -c < /workspace/big'],
        { timeoutMs: 60_000 },
      );
      t.regex(dd.stderr, /Disk quota exceeded/);
      t.regex(dd.stdout, /^dd=1$/m);
      const written = Number(dd.stdout.trim().split('\n').pop());
      t.true(written > 4 * MiB && written <= 8 * MiB, `dd wrote ${written} bytes before the quota stopped it`);
      const small = await sb.commands.run(['sh', '-c', 'echo more > /workspace/small']);
      t.not(small.exitCode, 0);
      t.regex(small.stderr, /Disk quota exceeded/);

      // The sandbox still answers, and a neighbour without a quota can write.
      t.is((await sb.commands.run(['echo', 'alive'])).stdout, 'alive\n');
      const big = await other.commands.run(
        ['sh', '-c', 'dd if=/dev/zero of=/workspace/big bs=1M count=20 2>/dev/null; wc -c < /workspace/big'],
        { timeoutMs: 60_000 },
      );
      t.is(big.stdout.trim(), String(20 * MiB));

      // A checkpoint of a full layer works; a rollback to it (warm standby) keeps the quota.
      const ckpt = await sb.checkpoint({ label: 'full' });
      await sb.commands.run(['sh', '-c', 'rm /workspace/big; echo after > /workspace/after']);
      await sb.settled();
      const back = await sb.rollback(ckpt.id);
      t.is((await sb.files.read('/workspace/big')).content.length, written, 'the checkpoint kept the file');
      t.false(await sb.files.exists('/workspace/after'));
      t.is(
        ls.engine.layers.upperUsage(instanceOf(sb))?.quotaBytes,
        8 * MiB,
        `quota kept after a rollback (${back.path})`,
      );
      const stillFull = await sb.commands.run(['sh', '-c', 'dd if=/dev/zero of=/workspace/more bs=1M count=4']);
      t.regex(stillFull.stderr, /Disk quota exceeded/, 'the restored layer is still full');

      // The CRIU restore path (no standby) keeps it too.
      await sb.settled();
      await dropStandby(ls.engine, sb.id);
      const restored = await sb.rollback(ckpt.id);
      t.is(restored.path, 'restore');
      t.is(ls.engine.layers.upperUsage(instanceOf(sb))?.quotaBytes, 8 * MiB, 'quota kept after a CRIU rollback');
      t.regex((await sb.commands.run(['sh', '-c', 'echo x > /workspace/x'])).stderr, /Disk quota exceeded/);
      // The files API meets the same quota and says so, rather than reporting a truncated write as done.
      await t.throwsAsync(sb.files.write('/workspace/via-api', Buffer.alloc(4 * MiB, 1)), {
        code: 'DISK_QUOTA_EXCEEDED',
      });

      // Deleting the file gives the room back.
      const freed = await sb.commands.run(
        [
          'sh',
          '-c',
          'rm /workspace/big /workspace/more 2>/dev/null; sync; dd if=/dev/zero of=/workspace/again bs=1M count=4 2>&1 && wc -c < /workspace/again',
        ],
        { timeoutMs: 60_000 },
      );
      t.is(freed.exitCode, 0, freed.stdout + freed.stderr);
      t.regex(freed.stdout, new RegExp(`^${4 * MiB}$`, 'm'));

      // A fork of the full checkpoint has the same quota, and is full too.
      const [fork] = await sb.fork(ckpt.id);
      t.true(fork!.ok, JSON.stringify(fork));
      const child = ls.get((fork as { id: string }).id);
      t.is(child.info().diskMb, 8);
      t.is(ls.engine.layers.upperUsage(instanceOf(child))?.quotaBytes, 8 * MiB);
      t.regex(
        (await child.commands.run(['sh', '-c', 'dd if=/dev/zero of=/workspace/more bs=1M count=4'])).stderr,
        /Disk quota exceeded/,
      );
    },
  );

  test.serial(
    'CPU weights 100:400 give the heavier sandbox clearly more CPU, measured by its cgroup counters; a cap holds',
    async (t) => {
      const ls = await openTestLockstep(t);
      const light = await ls.create({ cpuWeight: 100 });
      const heavy = await ls.create({ cpuWeight: 400 });
      const v1 = ls.engine.cgroups.version === 1;
      t.is(cpuWeightFile(ls, light.id), v1 ? '1024' : '100');
      t.is(cpuWeightFile(ls, heavy.id), v1 ? '4096' : '400');
      t.is(heavy.info().cpuWeight, 400);

      const cores = (await light.commands.run(['nproc'])).stdout.trim();
      await spin(light, Number(cores));
      await spin(heavy, Number(cores));
      await sleep(500); // let both reach steady state
      const cg = (sb: Sandbox) => ls.engine.runtime.cgroupName(instanceOf(sb));
      const l0 = ls.engine.cgroups.cpuUsageUsec(cg(light));
      const h0 = ls.engine.cgroups.cpuUsageUsec(cg(heavy));
      await sleep(4000);
      const dl = ls.engine.cgroups.cpuUsageUsec(cg(light)) - l0;
      const dh = ls.engine.cgroups.cpuUsageUsec(cg(heavy)) - h0;
      t.log(`cpu used over the interval: light ${dl} us, heavy ${dh} us, ratio ${(dh / dl).toFixed(2)}`);
      t.true(dl > 0 && dh / dl > 2, `heavy/light = ${(dh / dl).toFixed(2)}`);

      // A fork has the same weight.
      const ckpt = await heavy.checkpoint();
      const [f] = await heavy.fork(ckpt.id);
      t.true(f!.ok);
      t.is(cpuWeightFile(ls, (f as { id: string }).id), v1 ? '4096' : '400');
      await ls.remove(light.id);
      await ls.remove(heavy.id);
      await ls.remove((f as { id: string }).id);

      // A hard cap of 0.2 CPU: the cgroup can never use more than 20 ms per 100 ms period.
      const capped = await ls.create({ cpus: 0.2 });
      t.is(capped.info().cpus, 0.2);
      const quotaFile = v1
        ? fs.readFileSync(path.join(cpuDir(ls, capped.id), 'cpu.cfs_quota_us'), 'utf8').trim()
        : fs.readFileSync(path.join(cpuDir(ls, capped.id), 'cpu.max'), 'utf8').trim();
      t.is(quotaFile, v1 ? '20000' : '20000 100000');
      await spin(capped, 2);
      await sleep(300);
      const c0 = ls.engine.cgroups.cpuUsageUsec(cg(capped));
      const w0 = performance.now();
      await sleep(2000);
      const used = ls.engine.cgroups.cpuUsageUsec(cg(capped)) - c0;
      const elapsedUs = (performance.now() - w0) * 1000;
      t.log(`capped at 0.2 CPU: used ${used} us in ${elapsedUs.toFixed(0)} us`);
      // An upper bound only (a loaded host gives less, never more): 0.2 of the time plus one period of slack.
      t.true(used <= 0.2 * elapsedUs + 100_000, `used ${used} us`);
      t.true(used > 0);
    },
  );

  // [field, bad value, why it is bad]
  const badValues: [string, unknown, string][] = [
    ['cpuWeight', 0, 'zero'],
    ['cpuWeight', -100, 'negative'],
    ['cpuWeight', 10_001, 'past the maximum'],
    ['cpuWeight', 1e12, 'huge'],
    ['cpuWeight', 150.5, 'not an integer'],
    ['cpuWeight', '200', 'a string'],
    ['cpus', 0, 'zero'],
    ['cpus', -1, 'negative'],
    ['cpus', 0.005, 'below 0.01'],
    ['cpus', 0.123, 'more than two decimals'],
    ['cpus', 1e9, 'huge'],
    ['cpus', '1', 'a string'],
    ['ioWeight', 0, 'zero'],
    ['ioWeight', -5, 'negative'],
    ['ioWeight', 1001, 'past the maximum'],
    ['ioWeight', 2.5, 'not an integer'],
    ['diskMb', 0, 'zero'],
    ['diskMb', -8, 'negative'],
    ['diskMb', 2 ** 40, 'huge'],
    ['diskMb', 8.5, 'not an integer'],
    ['diskMb', true, 'a boolean'],
  ];

  test.serial(
    'bad values of every new limit are refused with INVALID_ARGUMENT naming the field, through the SDK and HTTP, and nothing is created',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'acme'));
      const rowsBefore = ls.engine.catalog.allSandboxes().length;
      for (const [field, value, why] of badValues) {
        const e = await t.throwsAsync(
          ls.create({ [field]: value } as never),
          { code: 'INVALID_ARGUMENT' },
          `SDK ${field} ${why}`,
        );
        t.is((e as unknown as { field: string }).field, field, `SDK ${field} ${why}`);
        const r = await api.post('/v1/sandboxes', { [field]: value });
        t.is(r.status, 400, `HTTP ${field} ${why}: ${r.text}`);
        t.like(r.body.error, { code: 'INVALID_ARGUMENT', field }, `HTTP ${field} ${why}`);
      }
      t.is(ls.engine.catalog.allSandboxes().length, rowsBefore, 'no sandbox row was left behind');
      t.deepEqual(ls.engine.layers.listUppers(), []);

      // A well-formed I/O weight on a host where no scheduler honours one is refused, not ignored.
      const io = ls.engine.cgroups.ioWeightSupport();
      const r = await api.post('/v1/sandboxes', { ioWeight: 200 });
      if (io.ok) {
        t.is(r.status, 201, r.text);
        t.is(r.body.ioWeight, 200);
      } else {
        t.is(r.status, 422, r.text);
        t.like(r.body.error, { code: 'LIMIT_UNSUPPORTED', field: 'ioWeight' });
        await t.throwsAsync(ls.create({ ioWeight: 200 }), { code: 'LIMIT_UNSUPPORTED' });
        t.deepEqual(ls.engine.layers.listUppers(), []);
      }

      // Good values come back in the sandbox JSON.
      const ok = await api.post('/v1/sandboxes', { cpuWeight: 300, cpus: 1.5, diskMb: 64, memoryMb: 64 });
      t.is(ok.status, 201, ok.text);
      t.like(ok.body, { cpuWeight: 300, cpus: 1.5, diskMb: 64, memoryMb: 64 });
      t.like((await api.get(`/v1/sandboxes/${ok.body.id}`)).body, { cpuWeight: 300, cpus: 1.5, diskMb: 64 });
    },
  );

  test.serial(
    'tenant quotas: a warm standby counts against maxMemoryMb (a create past it is refused; a standby past it is not made) and checkpoint bytes against maxCheckpointMb',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);

      // Room for a 64 MiB sandbox and its standby, exactly.
      const tight = client.as(tenantToken(ls, 'tight', { maxMemoryMb: 128 }));
      const a = (await tight.post('/v1/sandboxes', { memoryMb: 64 })).body.id as string;
      await tight.post(`/v1/sandboxes/${a}/checkpoints`, {});
      await eventually(() => ls.engine.catalog.standby(a) !== undefined, 30_000);
      t.like((await tight.get('/v1/tenant')).body.usage, { memoryMb: 64, standbyMemoryMb: 64 });
      const refused = await tight.post('/v1/sandboxes', { memoryMb: 64 });
      t.is(refused.status, 429, refused.text);
      t.like(refused.body.error, { code: 'QUOTA_EXCEEDED' });
      t.regex(
        refused.body.error.message,
        /at most 128 MiB of memory; it has 128 and asked for 64 more \(running sandboxes and their warm standbys count\)/,
      );
      t.is(ls.list(tenantId(ls, 'tight')).length, 1);

      // No room for a standby: none is made, and a rollback restores with CRIU instead.
      const lean = client.as(tenantToken(ls, 'lean', { maxMemoryMb: 100 }));
      const b = (await lean.post('/v1/sandboxes', { memoryMb: 64 })).body.id as string;
      const ck = (await lean.post(`/v1/sandboxes/${b}/checkpoints`, {})).body.id as string;
      await ls.get(b).settled();
      t.is(ls.engine.catalog.standby(b)?.instance ?? null, null, 'no standby past the quota');
      t.like((await lean.get('/v1/tenant')).body.usage, { memoryMb: 64, standbyMemoryMb: 0 });
      const rb = await lean.post(`/v1/sandboxes/${b}/rollback`, { checkpointId: ck });
      t.is(rb.status, 200, rb.text);
      t.is(ls.engine.catalog.sandbox(b)!.state, 'running');

      // Checkpoint bytes: a 3 MiB file makes each checkpoint over 3 MiB (the layer counts once quotas are on).
      const ckq = client.as(tenantToken(ls, 'ckq', { maxCheckpointMb: 5 }));
      const c = (await ckq.post('/v1/sandboxes', { memoryMb: 64, diskMb: 64 })).body.id as string;
      await ckq.post(`/v1/sandboxes/${c}/commands`, { cmd: 'head -c 3145728 /dev/urandom > /workspace/data' });
      const first = await ckq.post(`/v1/sandboxes/${c}/checkpoints`, {});
      t.is(first.status, 201, first.text);
      const firstBytes = first.body.sizes.processImageBytes + first.body.sizes.layerBytes;
      t.true(first.body.sizes.layerBytes >= 3 * MiB && firstBytes <= 5 * MiB, JSON.stringify(first.body.sizes));
      await ls.get(c).settled();
      const layersBefore = ls.engine.layers.listLayers().sort();
      const imagesBefore = fs.readdirSync(ls.engine.paths.processImages).sort();
      const second = await ckq.post(`/v1/sandboxes/${c}/checkpoints`, {});
      t.is(second.status, 429, second.text);
      t.like(second.body.error, { code: 'QUOTA_EXCEEDED' });
      t.regex(second.body.error.message, /at most 5 MiB of checkpoints/);
      t.is((await ckq.get(`/v1/sandboxes/${c}/checkpoints`)).body.length, 1);
      t.deepEqual(ls.engine.layers.listLayers().sort(), layersBefore, 'the refused checkpoint left no layer');
      t.deepEqual(fs.readdirSync(ls.engine.paths.processImages).sort(), imagesBefore, 'nor a process image');
      t.is(
        (await ckq.post(`/v1/sandboxes/${c}/commands`, { cmd: 'echo still running' })).body.stdout,
        'still running\n',
      );
      // Deleting the first checkpoint gives the room back.
      t.is((await ckq.del(`/v1/sandboxes/${c}/checkpoints/${first.body.id}`)).status, 200);
      t.is((await ckq.post(`/v1/sandboxes/${c}/checkpoints`, {})).status, 201);
    },
  );

  test.serial(
    'the CLI sets limits at create and shows them with what is used in ls and inspect; bad flags exit 2 naming the field',
    async (t) => {
      const ls = await openTestLockstep(t);
      const home = ls.home;
      await ls.close(); // the CLI processes are the managers from here on
      const made = await cli(
        home,
        'create',
        '--cpu-weight',
        '300',
        '--cpus',
        '0.5',
        '--disk-mb',
        '32',
        '--memory',
        '64',
        '--json',
      );
      t.is(made.code, 0, made.stderr);
      const id = (JSON.parse(made.stdout) as { id: string }).id;
      t.is((await cli(home, 'exec', id, '--', 'sh', '-c', 'head -c 2097152 /dev/zero > /workspace/two; sync')).code, 0);
      const inspect = await cli(home, 'inspect', id, '--json');
      t.is(inspect.code, 0, inspect.stderr);
      const info = JSON.parse(inspect.stdout) as {
        cpuWeight: number;
        cpus: number;
        diskMb: number;
        usage: { cpuSeconds: number; diskUsedMb: number };
      };
      t.like(info, { cpuWeight: 300, cpus: 0.5, diskMb: 32 });
      t.true(info.usage.diskUsedMb >= 2 && info.usage.diskUsedMb < 32, `disk used ${info.usage.diskUsedMb} MiB`);
      t.true(info.usage.cpuSeconds >= 0);
      t.regex((await cli(home, 'inspect', id)).stdout, /^limits +mem 64M pids 256 cpu 300 cap 0.5 disk 32M$/m);
      t.regex((await cli(home, 'ls')).stdout, new RegExp(`^${id} .* mem 64M pids 256 cpu 300 cap 0.5 disk 32M$`, 'm'));
      for (const [flags, field] of [
        [['--disk-mb', '0'], 'diskMb'],
        [['--cpu-weight=-1'], 'cpuWeight'],
        [['--cpus', '0.001'], 'cpus'],
      ] as const) {
        const r = await cli(home, 'create', ...flags, '--json');
        t.is(r.code, 2, r.stdout + r.stderr);
        t.like(JSON.parse(r.stdout).error, { code: 'INVALID_ARGUMENT', field });
      }
      const usage = await cli(home, 'create', '--cpus', 'half', '--json');
      t.is(usage.code, 2);
      t.like(JSON.parse(usage.stdout).error, { code: 'USAGE' });
      t.is(JSON.parse((await cli(home, 'ls', '--json')).stdout).length, 1, 'refused creates made nothing');
    },
  );
});
