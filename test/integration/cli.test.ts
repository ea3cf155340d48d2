/**
 * The `lockstep` command as a user runs it: `node bin/lockstep.js ...` in a
 * subprocess with LOCKSTEP_HOME set. Checks stdout, stderr, the --json
 * shapes and the documented exit codes (0 ok, 2 bad usage or input,
 * 3 not found, 4 conflict; exec exits with the command's own code).
 */
import path from 'node:path';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import { destroyHome, freshHome, integration, openTestLockstep } from '../helpers/harness.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const bin = path.join(repoRoot, 'bin/lockstep.js');

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

function cli(home: string, ...args: string[]): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [bin, ...args],
      { env: { ...process.env, LOCKSTEP_HOME: home, NO_COLOR: '1' }, maxBuffer: 16 << 20 },
      (err, stdout, stderr) => {
        if (err && typeof err.code !== 'number') return reject(err);
        resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
      },
    );
  });
}

/** Runs a command that must succeed and returns its parsed JSON output. */
async function json<T>(t: ExecutionContext, home: string, ...args: string[]): Promise<T> {
  const r = await cli(home, ...args);
  t.is(r.code, 0, `lockstep ${args.join(' ')}: ${r.stderr}${r.stdout}`);
  return JSON.parse(r.stdout) as T;
}

/** A command that must fail with `exit` and, with --json, print {"error":{"code":...}}. */
async function fails(
  t: ExecutionContext,
  home: string,
  exit: number,
  code: string,
  ...args: string[]
): Promise<{ code: string; field?: string; message: string }> {
  const dashes = args.indexOf('--');
  const withJson = dashes < 0 ? [...args, '--json'] : [...args.slice(0, dashes), '--json', ...args.slice(dashes)];
  const r = await cli(home, ...withJson);
  t.is(r.code, exit, `lockstep ${args.join(' ')} --json: ${r.stdout}${r.stderr}`);
  const out = JSON.parse(r.stdout) as { error: { code: string; field?: string; message: string } };
  t.is(out.error.code, code, `lockstep ${args.join(' ')}`);
  t.is(typeof out.error.message, 'string');
  return out.error;
}

interface SandboxJson {
  id: string;
  image: string;
  state: string;
  pid: number;
  memoryMb: number;
  pids: number;
}

integration(test, () => {
  test.serial('create, exec, spawn, ls, rm, image ls and doctor through the CLI', async (t) => {
    const home = freshHome('cli');
    t.teardown(() => destroyHome(home));
    const doctorRun = cli(home, 'doctor', '--json'); // slow (criu check): runs alongside the rest

    const help = await cli(home, 'help'); // neither help nor doctor opens the state directory
    t.is(help.code, 0);
    t.true(help.stdout.includes('Exit codes: 0 ok, 1 failure, 2 bad usage or input, 3 not found'));

    const built = await cli(home, 'image', 'build', 'base');
    t.is(built.code, 0, built.stderr);
    t.regex(built.stdout, /^base {2}\d+\.\d MB\n$/);
    const images = await json<{ name: string; source: string; sizeBytes: number; createdAt: string }[]>(
      t,
      home,
      'image',
      'ls',
      '--json',
    );
    t.is(images.length, 1);
    t.like(images[0], { name: 'base' });
    t.regex(images[0]!.source, /^recipe:base@[0-9a-f]{16}$/);
    t.true(images[0]!.sizeBytes > 1_000_000);
    t.false(Number.isNaN(Date.parse(images[0]!.createdAt)));

    const created = await json<{ id: string }>(
      t,
      home,
      'create',
      '--memory',
      '64',
      '--pids',
      '64',
      '--env',
      'GREETING=hello',
      '--json',
    );
    t.deepEqual(Object.keys(created), ['id']);
    t.regex(created.id, /^sbx_[a-z0-9]+$/);
    const id = created.id;

    const plain = await cli(home, 'exec', id, '--', 'sh', '-c', 'echo out; echo "$GREETING" >&2; exit 7');
    const asJson = await cli(home, 'exec', id, '--json', '--', 'sh', '-c', 'echo out; echo err >&2; exit 7');
    const flags = await cli(home, 'exec', id, '--cwd', '/tmp', '--env', 'A=1', '--', 'sh', '-c', 'echo $A; pwd');
    const literal = await cli(home, 'exec', id, '--', 'echo', '--json');
    const spawnedRun = await cli(home, 'spawn', id, '--json', '--', 'sleep', '1000');
    t.is(plain.code, 7);
    t.is(plain.stdout, 'out\n');
    t.is(plain.stderr, 'hello\n');
    t.is(asJson.code, 7);
    t.deepEqual(JSON.parse(asJson.stdout), { exitCode: 7, stdout: 'out\n', stderr: 'err\n' });
    t.is(flags.code, 0);
    t.is(flags.stdout, '1\n/tmp\n');
    t.is(literal.stdout, '--json\n', 'flags after -- belong to the command');
    t.is(spawnedRun.code, 0, spawnedRun.stderr);
    const spawned = JSON.parse(spawnedRun.stdout) as { pid: number };
    t.deepEqual(Object.keys(spawned), ['pid']);
    t.true(Number.isInteger(spawned.pid) && spawned.pid > 1);
    const cmdline = await cli(home, 'exec', id, '--', 'cat', `/proc/${spawned.pid}/cmdline`);
    t.is(cmdline.stdout, 'sleep\u00001000\u0000');

    const list = await json<SandboxJson[]>(t, home, 'ls', '--json');
    t.is(list.length, 1);
    // Every sandbox gets the default disk limit (2048 MiB) when it names none.
    t.like(list[0], { id, image: 'base', state: 'running', memoryMb: 64, pids: 64, diskMb: 2048 });
    const table = await cli(home, 'ls');
    t.regex(
      table.stdout,
      new RegExp(
        `^ID +IMAGE +STATE +HEAD +CREATED +LIMITS\\n${id} +base +running +- .* mem 64M pids 64 cpu 100 disk 2048M\\n`,
      ),
    );

    t.deepEqual(await json(t, home, 'rm', id, '--json'), { id, removed: true });
    t.deepEqual(await json(t, home, 'ls', '--json'), []);
    await fails(t, home, 3, 'SANDBOX_NOT_FOUND', 'rm', id);
    const again = await cli(home, 'exec', id, '--', 'true');
    t.is(again.code, 3);
    t.is(again.stdout, '');
    t.is(again.stderr, `lockstep: No sandbox with id "${id}"\n`);

    const doctorResult = await doctorRun;
    t.is(doctorResult.code, 0, doctorResult.stdout);
    const doctor = JSON.parse(doctorResult.stdout) as {
      ok: boolean;
      checks: { name: string; ok: boolean; optional?: boolean; detail: string }[];
    };
    t.true(doctor.ok);
    const required = doctor.checks.filter((c) => !c.optional);
    t.true(required.length >= 8, required.map((c) => c.name).join(', '));
    t.deepEqual(
      required.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`),
      [],
    );
    for (const name of [
      'kernel',
      'root',
      'overlayfs',
      'namespaces',
      'cgroups',
      'native build',
      'criu version',
      'criu check',
      'layer store',
    ]) {
      t.true(
        required.some((c) => c.name === name),
        name,
      );
    }
  });

  test.serial('errors exit with the documented codes and print {"error":{"code"}} with --json', async (t) => {
    const ls = await openTestLockstep(t);
    const home = ls.home;
    await ls.close(); // the CLI processes are the managers from here on
    const created = await json<{ id: string }>(t, home, 'create', '--json');

    type Case = [exit: number, code: string, field: string | undefined, args: string[]];
    // Refused while parsing, before the state directory is opened: these may run side by side.
    const early: Case[] = [
      [2, 'USAGE', undefined, ['frobnicate']],
      [2, 'USAGE', undefined, ['create', '--bogus']],
      [2, 'USAGE', undefined, ['rm']],
      [2, 'INVALID_ARGUMENT', 'command', ['exec', created.id]],
      [2, 'INVALID_ARGUMENT', 'image reference', ['image', 'import', 'busybox:latest']],
    ];
    const opening: Case[] = [
      [2, 'USAGE', undefined, ['create', '--memory', 'lots']],
      [2, 'USAGE', undefined, ['exec', created.id, '--env', 'NOEQUALS', '--', 'true']],
      [2, 'INVALID_ARGUMENT', 'memoryMb', ['create', '--memory', '0']],
      [2, 'INVALID_ARGUMENT', 'pids', ['create', '--pids=-3']],
      [2, 'INVALID_ARGUMENT', 'image', ['create', '--image', '../base']],
      [2, 'INVALID_ARGUMENT', 'cwd', ['exec', created.id, '--cwd', 'relative', '--', 'true']],
      [3, 'IMAGE_NOT_FOUND', undefined, ['create', '--image', 'nope']],
      [3, 'SANDBOX_NOT_FOUND', undefined, ['exec', 'sbx_nope', '--', 'true']],
      [3, 'IMAGE_NOT_FOUND', undefined, ['image', 'rm', 'nope']],
      [4, 'IMAGE_EXISTS', undefined, ['image', 'build', 'base']],
    ];
    const check = async ([exit, code, field, args]: Case) => {
      const error = await fails(t, home, exit, code, ...args);
      if (field) t.is(error.field, field, args.join(' '));
    };
    const sequential = (async () => {
      for (const c of opening) await check(c);
    })();
    await Promise.all([...early.map(check), sequential]);

    // Without --json the same errors go to stderr as one line.
    const usage = await cli(home, 'create', '--memory', 'lots');
    t.is(usage.code, 2);
    t.is(usage.stdout, '');
    t.regex(usage.stderr, /^lockstep: --memory must be an integer, got "lots"\n$/);
    const invalid = await cli(home, 'create', '--pids', '1');
    t.is(invalid.code, 2);
    t.regex(invalid.stderr, /^lockstep: Invalid pids: expected an integer from 8 to \d+, received 1\n$/);

    // A command's own failure is its exit code, not a Lockstep error.
    const missing = await cli(home, 'exec', created.id, '--json', '--', 'no-such-program');
    t.is(missing.code, 127);
    t.like(JSON.parse(missing.stdout), {
      exitCode: 127,
      stdout: '',
      stderr: 'lockstep: no-such-program: No such file or directory\n',
    });
    // And none of the failures above left a sandbox behind.
    t.deepEqual(
      (await json<SandboxJson[]>(t, home, 'ls', '--json')).map((s) => s.id),
      [created.id],
    );
  });

  // exit 127 alone would leave the user guessing.
  test.serial('ports expose, ls and close through the CLI; a silent port exits 4, a bad one 2', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    await sb.commands.run('httpd -f -p 127.0.0.1:8080 -h /workspace', { background: true });
    await fails(t, ls.home, 4, 'PORT_NOT_LISTENING', 'ports', 'expose', sb.id, '8081');
    t.is((await fails(t, ls.home, 2, 'INVALID_ARGUMENT', 'ports', 'expose', sb.id, 'http')).field, 'port');
    await fails(t, ls.home, 3, 'SANDBOX_NOT_FOUND', 'ports', 'ls', 'sbx_nosuchsandbox');
    let e: { id: string; port: number; url: string; token: string } | undefined;
    for (let i = 0; !e && i < 50; i++) {
      const r = await cli(ls.home, 'ports', 'expose', sb.id, '8080', '--json');
      if (r.code === 0) e = JSON.parse(r.stdout);
      else await new Promise((res) => setTimeout(res, 100));
    }
    t.truthy(e, 'exposed once httpd listens');
    t.regex(e!.url, new RegExp(`^http://127\\.0\\.0\\.1:7878/ports/${e!.id}/$`));
    t.regex(e!.token, /^lsp_/);
    const listed = await json<{ id: string; port: number; token?: string }[]>(
      t,
      ls.home,
      'ports',
      'ls',
      sb.id,
      '--json',
    );
    t.deepEqual(
      listed.map((x) => [x.id, x.port, x.token]),
      [[e!.id, 8080, undefined]],
    );
    t.deepEqual(await json(t, ls.home, 'ports', 'close', sb.id, '8080', '--json'), { port: 8080, closed: true });
    t.deepEqual(sb.ports.list(), []);
  });

  test.serial('exec of a missing program says why on stderr', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    await ls.close();
    const r = await cli(ls.home, 'exec', sb.id, '--', 'no-such-program');
    t.is(r.code, 127);
    t.regex(r.stderr, /no-such-program/);
  });

  // Catalog writes take the write lock up front (BEGIN IMMEDIATE), so
  // managers opening one directory together wait instead of failing.
  test.serial('managers opening the same state directory at the same time all succeed', async (t) => {
    const ls = await openTestLockstep(t);
    const catalog = ls.engine.paths.catalog;
    const open = () =>
      new Promise<number>((resolve) => {
        execFile(process.execPath, [path.join(repoRoot, 'test/fixtures/open-catalog.mjs'), catalog], (err) =>
          resolve(err ? (err.code as number) : 0),
        );
      });
    const codes: number[] = [];
    for (let round = 0; round < 3; round++) codes.push(...(await Promise.all(Array.from({ length: 12 }, open))));
    t.deepEqual(
      codes.filter((c) => c !== 0),
      [],
      `${codes.filter((c) => c !== 0).length} of ${codes.length} opens failed`,
    );
  });
});

integration(test, () => {
  test.serial('snapshot create, ls, export > file, import < file, start and rm through the CLI', async (t) => {
    const homes = [freshHome('cli-snap-a'), freshHome('cli-snap-b')];
    for (const h of homes) t.teardown(() => destroyHome(h));
    const [a, b] = homes as [string, string];
    for (const h of homes) t.is((await cli(h, 'image', 'build', 'base')).code, 0);
    const { id } = await json<{ id: string }>(t, a, 'create', '--json');
    t.is((await cli(a, 'exec', id, '--', 'sh', '-c', 'echo carried > /workspace/f')).code, 0);
    const ckpt = await json<{ id: string }>(t, a, 'checkpoint', id, '--json');
    const snap = await json<{ id: string; name: string }>(
      t,
      a,
      'snapshot',
      'create',
      ckpt.id,
      '--name',
      'cli-snap',
      '--meta',
      'k=v',
      '--json',
    );
    t.is(snap.name, 'cli-snap');
    t.deepEqual(
      (await json<{ id: string }[]>(t, a, 'snapshot', 'ls', '--json')).map((s) => s.id),
      [snap.id],
    );
    await fails(t, a, 3, 'SNAPSHOT_NOT_FOUND', 'snapshot', 'inspect', 'snap_nothere');
    await fails(t, a, 4, 'SNAPSHOT_EXISTS', 'snapshot', 'create', ckpt.id, '--name', 'cli-snap');
    const file = path.join(path.dirname(a), `cli-bundle-${process.pid}`);
    t.teardown(() => import('node:fs').then((fs) => fs.rmSync(file, { force: true })));
    const sh = (home: string, line: string, env: Record<string, string> = {}) =>
      new Promise<number>((resolve) =>
        execFile('sh', ['-c', line], { env: { ...process.env, LOCKSTEP_HOME: home, ...env } }, (err) =>
          resolve(err ? Number(err.code) : 0),
        ),
      );
    t.is(await sh(a, `"${process.execPath}" "${bin}" snapshot export cli-snap > "${file}"`), 0);
    // B imports only what a key it trusts signed: A's, as `snapshot key` prints it.
    t.is(await sh(b, `"${process.execPath}" "${bin}" snapshot import < "${file}" 2>/dev/null`), 4, 'untrusted');
    const key = (await cli(a, 'snapshot', 'key')).stdout.trim();
    t.regex(key, /^ed25519:[A-Za-z0-9_-]{43}$/);
    t.is(
      await sh(b, `"${process.execPath}" "${bin}" snapshot import < "${file}" > "${file}.id"`, {
        LOCKSTEP_TRUSTED_BUNDLE_KEYS: key,
      }),
      0,
    );
    const fs = await import('node:fs');
    const imported = fs.readFileSync(`${file}.id`, 'utf8').trim();
    fs.rmSync(`${file}.id`);
    t.regex(imported, /^snap_/);
    const started = await json<{ id: string }>(t, b, 'create', '--from-snapshot', imported, '--json');
    const r = await cli(b, 'exec', started.id, '--', 'cat', '/workspace/f');
    t.is(r.stdout, 'carried\n');
    t.is((await cli(b, 'rm', started.id)).code, 0);
    t.deepEqual(await json(t, b, 'snapshot', 'rm', imported, '--json'), { id: imported, deleted: true });
    t.deepEqual(await json(t, b, 'snapshot', 'ls', '--json'), []);
  });
});
