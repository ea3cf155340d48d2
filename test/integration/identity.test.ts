/**
 * A sandbox is addressed by identity, never by a bare pid. Once a sandbox's
 * init has exited, its pid can go to a host process; nothing given to the
 * sandbox may then run in that process's namespaces or root. The manager
 * learns of the exit at once and marks the sandbox stopped, and the helper's
 * request (environment values included) never shows in a command line.
 */
import test from 'ava';
import fs from 'node:fs';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { eventually, integration, openTestLockstep, sleep } from '../helpers/harness.js';
import { ApiClient } from '../fixtures/http-client.js';
import { runCommand, spawnDetached } from '../../src/instances/commands.js';
import { helperPath } from '../../src/native/binding.js';
import { startTime } from '../../src/host/proc.js';
import type { Sandbox } from '../../src/index.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));
const run = promisify(execFile);

/** Makes the sandbox's init exit from inside, as a tenant's command can. */
async function killInitFromInside(sb: Sandbox): Promise<void> {
  // lockstep-init leaves on SIGTERM (SIGKILL from inside its own pid namespace is ignored by the kernel).
  await sb.commands.run(['sh', '-c', 'kill -TERM 1; sleep 10']);
}

/**
 * Makes a host process hold `pid`: ns_last_pid makes the next pid the kernel
 * hands out `pid`, unless another process on the host takes it first, so it
 * is tried many times. If some other host process got it meanwhile, that one
 * serves as well (it is not the init: its start time differs). Returns the
 * holder's start time, and whether it is this test's own process.
 */
async function hostProcessWithPid(
  t: { teardown: (fn: () => void) => void },
  pid: number,
  initStart: number,
): Promise<{ start: number; ours: boolean }> {
  for (let attempt = 0; attempt < 500; attempt++) {
    const holder = startTime(pid);
    if (holder !== undefined && holder !== initStart) return { start: holder, ours: false };
    fs.writeFileSync('/proc/sys/kernel/ns_last_pid', String(pid - 1));
    const child: ChildProcess = spawn('sleep', ['30'], { stdio: 'ignore' });
    if (child.pid === pid) {
      t.teardown(() => void child.kill('SIGKILL'));
      return { start: startTime(pid)!, ours: true };
    }
    child.kill('SIGKILL');
    if (attempt % 20 === 19) await sleep(10);
  }
  throw new Error(`could not get pid ${pid} for a host process`);
}

function allCommandLines(): string[] {
  const out: string[] = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      out.push(fs.readFileSync(`/proc/${name}/cmdline`, 'utf8'));
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

integration(test, () => {
  test.serial('a pid reused by a host process after the init died is never entered', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    const before = ls.engine.catalog.sandbox(sb.id)!;
    const oldPid = before.init_pid!;
    // What a manager held before the init died: the pid and start time it would enter by.
    const stale = sb.core.enterTarget();

    await killInitFromInside(sb);
    await eventually(() => startTime(oldPid) !== before.init_start, 10_000);
    const host = await hostProcessWithPid(t, oldPid, before.init_start!);
    t.not(host.start, before.init_start, 'a host process now holds the old init pid');

    const marker = `/tmp/lockstep-identity-${randomBytes(6).toString('hex')}`;
    t.teardown(() => fs.rmSync(marker, { force: true }));
    await t.throwsAsync(sb.commands.run(['touch', marker]), { code: 'SANDBOX_NOT_RUNNING' });
    // The helper itself refuses a pid whose start time is not the init's, even when asked to enter it.
    await t.throwsAsync(runCommand(stale, ['touch', marker]), { code: 'SANDBOX_NOT_RUNNING' });
    await t.throwsAsync(spawnDetached(stale, ['touch', marker]), { code: 'SANDBOX_NOT_RUNNING' });
    // The command ran nowhere: not on the host, where the pid now lives.
    t.false(fs.existsSync(marker));
    if (host.ours) t.is(startTime(oldPid), host.start, 'the host process was left alone');

    await eventually(() => ls.engine.catalog.sandbox(sb.id)!.state === 'stopped');
    const row = ls.engine.catalog.sandbox(sb.id)!;
    t.is(row.init_pid, null);
    t.is(row.init_start, null);
    t.is(sb.info().state, 'stopped');
  });

  test.serial('a catalog row still naming a dead init is found out, not entered', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    const before = ls.engine.catalog.sandbox(sb.id)!;
    await killInitFromInside(sb);
    await eventually(() => ls.engine.catalog.sandbox(sb.id)!.state === 'stopped');
    await eventually(() => startTime(before.init_pid!) !== before.init_start, 10_000);
    await hostProcessWithPid(t, before.init_pid!, before.init_start!);
    // A manager that missed the exit (this row as an old one would have left it).
    ls.engine.catalog.updateSandbox(sb.id, {
      state: 'running',
      init_pid: before.init_pid,
      init_start: before.init_start,
    });
    const marker = `/tmp/lockstep-identity-${randomBytes(6).toString('hex')}`;
    t.teardown(() => fs.rmSync(marker, { force: true }));
    await t.throwsAsync(sb.commands.run(['touch', marker]), { code: 'SANDBOX_NOT_RUNNING' });
    await t.throwsAsync(sb.checkpoint(), { code: 'SANDBOX_NOT_RUNNING' });
    t.false(fs.existsSync(marker));
    await eventually(() => ls.engine.catalog.sandbox(sb.id)!.state === 'stopped');
    t.is(ls.engine.catalog.sandbox(sb.id)!.init_pid, null);
  });

  test.serial('the SDK marks a sandbox stopped as soon as its init exits, and its cgroup is emptied', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    const other = await ls.create();
    await sb.commands.spawn('sleep 1000');
    await sb.commands.spawn('kill -TERM 1');
    await eventually(() => sb.info().state === 'stopped', 10_000);
    t.is(sb.info().pid, null);
    const cg = ls.engine.runtime.cgroupName(ls.engine.catalog.sandbox(sb.id)!.instance);
    await eventually(() => ls.engine.cgroups.pids(cg).length === 0);
    await t.throwsAsync(sb.commands.run(['true']), { code: 'SANDBOX_NOT_RUNNING' });
    // Another sandbox is not affected.
    t.is(other.info().state, 'running');
    t.is((await other.commands.run(['echo', 'ok'])).stdout, 'ok\n');
    // Removing a stopped sandbox works as for any other.
    await ls.remove(sb.id);
    t.deepEqual(
      ls.list().map((s) => s.id),
      [other.id],
    );
  });

  test.serial('a rollback kills the old init on purpose: the sandbox stays running on the new one', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    await sb.files.write('/workspace/f', 'one');
    const ckpt = await sb.checkpoint();
    await sb.settled();
    await sb.files.write('/workspace/f', 'two');
    const restore = await sb.rollback(ckpt.id);
    await sb.settled();
    const again = await sb.rollback(ckpt.id); // standby swap or restore, whichever is ready
    await sb.settled();
    await ls.engine.inits.settled();
    t.not(restore.pid, again.pid);
    const row = ls.engine.catalog.sandbox(sb.id)!;
    t.is(row.state, 'running');
    t.is(row.init_pid, again.pid);
    t.is((await sb.commands.run(['cat', '/workspace/f'])).stdout, 'one');
    // The new init is watched: its exit is noticed too.
    await sb.commands.spawn('kill -TERM 1');
    await eventually(() => sb.info().state === 'stopped', 10_000);
  });

  test.serial(
    'a background command is signalled through a pidfd: its whole process group goes, nothing else',
    async (t) => {
      const ls = await openTestLockstep(t);
      const sb = await ls.create();
      const cg = ls.engine.runtime.cgroupName(ls.engine.catalog.sandbox(sb.id)!.instance);
      const handle = await sb.commands.run('sleep 600 & sleep 600; wait', { background: true });
      await eventually(() => ls.engine.cgroups.pids(cg).length >= 5); // init, the wrapper sh, sh, two sleeps
      t.true(await handle.kill('SIGKILL'));
      t.deepEqual(await handle.wait({ timeoutMs: 10_000 }), { exitCode: null });
      await eventually(() => ls.engine.cgroups.pids(cg).length === 1, 10_000);
      t.deepEqual(ls.engine.cgroups.pids(cg), [ls.engine.catalog.sandbox(sb.id)!.init_pid]);
      t.false(await handle.kill(), 'an exited command is not signalled again');
    },
  );

  test.serial(
    'checkpoint and freeze of a stopped sandbox are refused and change nothing; rollback and fork bring it back',
    async (t) => {
      const ls = await openTestLockstep(t);
      const sb = await ls.create();
      await sb.files.write('/workspace/f', 'kept');
      const ckpt = await sb.checkpoint();
      await sb.settled();
      await killInitFromInside(sb);
      await eventually(() => sb.info().state === 'stopped', 10_000);
      await ls.engine.inits.settled();
      const before = ls.engine.catalog.sandbox(sb.id)!;
      t.is(
        ls.engine.catalog.standby(sb.id)?.instance ?? null,
        null,
        'the warm standby of a stopped sandbox is dropped',
      );

      await t.throwsAsync(sb.checkpoint(), { code: 'SANDBOX_NOT_RUNNING' });
      await t.throwsAsync(sb.freeze(), { code: 'SANDBOX_NOT_RUNNING' });
      await t.throwsAsync(sb.commands.run(['true']), { code: 'SANDBOX_NOT_RUNNING' });
      t.deepEqual(ls.engine.catalog.sandbox(sb.id), before);
      t.deepEqual(
        sb.checkpoints().map((c) => c.id),
        [ckpt.id],
      );
      t.deepEqual(ls.engine.catalog.operations(), []);

      // A fork starts from the checkpoint, not from the dead processes.
      const [fork] = await sb.fork(ckpt.id);
      if (!fork?.ok) return t.fail(`the fork failed: ${JSON.stringify(fork)}`);
      t.is((await ls.get(fork.id).commands.run(['cat', '/workspace/f'])).stdout, 'kept');
      // Rolling back is how a stopped sandbox comes back: processes restored from the checkpoint.
      const report = await sb.rollback(ckpt.id);
      t.is(report.path, 'restore');
      t.is(sb.info().state, 'running');
      t.is((await sb.commands.run(['cat', '/workspace/f'])).stdout, 'kept');
    },
  );

  test.serial('env values reach the command but never a command line on the host', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create({ envs: { BASE_SECRET: `base-${randomBytes(8).toString('hex')}` } });
    const secret = `x${randomBytes(16).toString('hex')}`;
    const big = 'y'.repeat(100_000); // larger than the helper's first read: the request is read to its end
    const running = sb.commands.run(['sh', '-c', 'echo "$SECRET $BASE_SECRET"; printf %s "$BIG" | wc -c; sleep 2'], {
      env: { SECRET: secret, BIG: big },
    });
    const helperLines = await eventually(
      () => {
        const lines = allCommandLines().filter((l) => l.startsWith(helperPath + '\0enter'));
        return lines.length ? lines : undefined;
      },
      10_000,
      10,
    );
    const everyLine = allCommandLines();
    const result = await running;
    t.deepEqual(helperLines![0]!.split('\0').filter(Boolean), [helperPath, 'enter', '--request-fd', '4']);
    t.false(
      everyLine.some((l) => l.includes(secret)),
      'no process on the host shows the value',
    );
    t.false(everyLine.some((l) => l.includes(JSON.parse(sb.core.row().env).BASE_SECRET)));
    t.is(result.exitCode, 0);
    t.is(result.stdout, `${secret} ${JSON.parse(sb.core.row().env).BASE_SECRET}\n100000\n`);
  });

  test.serial('a manager left open does not keep its process alive', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    // A second process opens the same state directory, watches the init, and never closes.
    const script = `const { Lockstep } = await import(${JSON.stringify(new URL('../../src/index.js', import.meta.url).href)});
      const ls = await Lockstep.open({ home: ${JSON.stringify(ls.home)} });
      ls.get(${JSON.stringify(sb.id)}).core.runningRow();
      console.log(ls.engine.inits.track(ls.engine.catalog.sandbox(${JSON.stringify(sb.id)})) ? 'watching' : 'not watching');`;
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], {
      timeout: 30_000,
      env: { ...process.env, LOCKSTEP_LOG_LEVEL: 'warn' },
    });
    t.is(stdout.trim(), 'watching');
  });

  test.serial('`lockstep serve` marks a sandbox stopped when its init exits (GET shows it)', async (t) => {
    const ls = await openTestLockstep(t);
    const env = { ...process.env, LOCKSTEP_HOME: ls.home, LOCKSTEP_LOG_LEVEL: 'warn' };
    const { token } = JSON.parse(
      (await run(process.execPath, [CLI, 'tenant', 'add', 'acme', '--json'], { env })).stdout,
    ) as { token: string };
    const child = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--json'], {
      env,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    t.teardown(() => void child.kill('SIGKILL'));
    const url = await new Promise<string>((resolve, reject) => {
      let out = '';
      child.stdout!.on('data', (b: Buffer) => {
        out += b.toString();
        try {
          resolve((JSON.parse(out) as { url: string }).url);
        } catch {
          /* not all of it yet */
        }
      });
      child.once('exit', (code) => reject(new Error(`serve exited with ${code}: ${out}`)));
    });
    const api = new ApiClient(url, token);
    const created = await api.post('/v1/sandboxes', {});
    t.is(created.status, 201, created.text);
    const id: string = created.body.id;
    const bg = await api.post(`/v1/sandboxes/${id}/commands`, { cmd: 'kill -TERM 1', background: true });
    t.is(bg.status, 200, bg.text);
    const got = await eventually(async () => {
      const r = await api.get(`/v1/sandboxes/${id}`);
      return r.body.state === 'stopped' ? r : undefined;
    }, 10_000);
    t.is(got!.status, 200);
    t.false('pid' in got!.body, 'no host pid in the API answer');
    const refused = await api.post(`/v1/sandboxes/${id}/commands`, { cmd: 'true' });
    t.is(refused.status, 409, refused.text);
    t.is(refused.body.error.code, 'SANDBOX_NOT_RUNNING');
  });
});
