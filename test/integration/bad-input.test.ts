/**
 * Bad input against a real state directory: every call fails with a typed
 * error (a stable `code`, and for INVALID_ARGUMENT the field, which the
 * message names), and NOTHING is half-created: the catalog, run folders,
 * mounts, cgroups, subvolumes and the sandbox's processes are the same
 * before and after.
 */
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import type { CreateOptions, Lockstep, RunOptions, Sandbox, SpawnOptions } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { COMMAND_TIMEOUT_MAX_MS, IMAGE_NAME_MAX } from '../../src/limits.js';
import { hostState, sandboxPids } from '../fixtures/host-state.js';

// One state directory and one sandbox for the whole file (the tests are serial).
const cleanups: (() => Promise<void>)[] = [];
let shared: Promise<{ ls: Lockstep; sb: Sandbox }> | undefined;
function fixture(): Promise<{ ls: Lockstep; sb: Sandbox }> {
  shared ??= (async () => {
    const ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => cleanups.push(fn) });
    const sb = await ls.create();
    // Links planted inside the sandbox that point outside it: absolute, relative, and to a file.
    const r = await sb.commands.run([
      'sh',
      '-c',
      'ln -s / /workspace/escape && ln -s ../../../../../.. /workspace/up && ln -s /etc/hostname /workspace/abs-file && ln -s ../.. /workspace/dotdot',
    ]);
    if (r.exitCode !== 0) throw new Error(`planting symlinks failed: ${r.stderr}`);
    return { ls, sb };
  })();
  return shared;
}

/** Everything a half-made sandbox could leave, plus the live sandbox's processes. */
function snapshot(ls: Lockstep, sb: Sandbox) {
  return { ...hostState(ls), list: ls.list().map((s) => `${s.id}:${s.state}`), pids: sandboxPids(ls, sb.id).sort() };
}

interface Expected {
  code: string;
  field?: string;
  /** Text the message must contain (besides the field). */
  mentions?: string;
}

/** Runs a failing call and checks the error and that nothing changed on the host. */
async function rejectsCleanly(
  t: ExecutionContext,
  call: (ls: Lockstep, sb: Sandbox) => Promise<unknown> | unknown,
  expected: Expected,
): Promise<void> {
  const { ls, sb } = await fixture();
  const before = snapshot(ls, sb);
  const err = await t.throwsAsync(async () => call(ls, sb), { code: expected.code });
  if (expected.field !== undefined) {
    t.is((err as { field?: string }).field ?? (err as { details?: { field?: string } }).details?.field, expected.field);
    t.true(
      err!.message.toLowerCase().includes(expected.field.toLowerCase()),
      `message names the field: ${err!.message}`,
    );
  }
  if (expected.mentions !== undefined)
    t.true(err!.message.includes(expected.mentions), `message mentions ${expected.mentions}: ${err!.message}`);
  t.deepEqual(snapshot(ls, sb), before, 'nothing was created or left behind');
}

const show = (v: unknown) =>
  JSON.stringify(v, (_k, x) =>
    typeof x === 'number' && !Number.isFinite(x) ? String(x) : typeof x === 'string' ? x.replace(/\0/g, '\\0') : x,
  );

const badCreate = test.macro({
  exec: (t, opts: CreateOptions, expected: Expected) => rejectsCleanly(t, (ls) => ls.create(opts), expected),
  title: (_p, opts: CreateOptions, expected: Expected) =>
    `create ${show(opts)} -> ${expected.code}${expected.field ? ` (${expected.field})` : ''}`,
});

const badRun = test.macro({
  exec: (t, cmd: string | string[], opts: RunOptions, expected: Expected) =>
    rejectsCleanly(t, (_ls, sb) => sb.commands.run(cmd, opts), expected),
  title: (_p, cmd: string | string[], opts: RunOptions, expected: Expected) =>
    `run ${show(cmd)} ${show(opts)} -> ${expected.code}${expected.field ? ` (${expected.field})` : ''}`,
});

const badSpawn = test.macro({
  exec: (t, cmd: string | string[], opts: SpawnOptions, expected: Expected) =>
    rejectsCleanly(t, (_ls, sb) => sb.commands.spawn(cmd, opts), expected),
  title: (_p, cmd: string | string[], opts: SpawnOptions, expected: Expected) =>
    `spawn ${show(cmd)} ${show(opts)} -> ${expected.code}${expected.field ? ` (${expected.field})` : ''}`,
});

type FileCall = 'read' | 'write' | 'list' | 'exists' | 'mkdir' | 'remove';
const badPath = test.macro({
  exec: (t, call: FileCall, p: string, expected: Expected) =>
    rejectsCleanly(
      t,
      (_ls, sb) => {
        switch (call) {
          case 'read':
            return sb.files.read(p);
          case 'write':
            return sb.files.write(p, 'pwned\n');
          case 'list':
            return sb.files.list(p);
          case 'exists':
            return sb.files.exists(p);
          case 'mkdir':
            return sb.files.mkdir(p);
          case 'remove':
            return sb.files.remove(p);
        }
      },
      expected,
    ),
  title: (_p, call: FileCall, p: string, expected: Expected) => `files.${call}(${show(p)}) -> ${expected.code}`,
});

const invalid = (field: string): Expected => ({ code: 'INVALID_ARGUMENT', field });
const escapes = (p: string): Expected => ({ code: 'PATH_ESCAPES_SANDBOX', field: 'path', mentions: p });

integration(test, () => {
  test.after.always('tear down the shared state directory', async () => {
    for (const fn of cleanups.reverse()) await fn();
  });

  // ---- create ------------------------------------------------------------------
  test.serial(badCreate, { image: 'no-such-image' }, { code: 'IMAGE_NOT_FOUND', mentions: 'no-such-image' });
  for (const image of [
    '../base',
    '../../etc',
    '..',
    'a/b',
    '/etc',
    'base/',
    'Base',
    '',
    'x'.repeat(IMAGE_NAME_MAX + 1),
  ])
    test.serial(badCreate, { image }, invalid('image'));
  for (const memoryMb of [
    -1,
    0,
    15,
    1e9,
    2 ** 53,
    1.5,
    Number.NaN,
    Number.POSITIVE_INFINITY,
    '64' as unknown as number,
  ])
    test.serial(badCreate, { memoryMb }, invalid('memoryMb'));
  for (const pids of [-5, 0, 7, 1e9, 2.5, Number.NaN, '32' as unknown as number])
    test.serial(badCreate, { pids }, invalid('pids'));
  test.serial(badCreate, { hostname: 'bad_host name' }, invalid('hostname'));
  test.serial(badCreate, { envs: { '1NOPE': 'x' } }, invalid('envs.1NOPE'));

  // ---- commands ----------------------------------------------------------------
  test.serial(badRun, [], {}, invalid('command'));
  test.serial(badRun, '', {}, invalid('command'));
  test.serial(badRun, '   ', {}, invalid('command'));
  test.serial(badRun, [''], {}, invalid('command[0]'));
  test.serial(badRun, ['echo', 'a\0b'], {}, invalid('command[1]'));
  test.serial(badRun, 'echo a\0b', {}, invalid('command[2]'));
  test.serial(badRun, ['pwd'], { cwd: 'relative/dir' }, invalid('cwd'));
  // PRODUCT BUG (see the report): runCommand turns every helper failure with
  // exit status 125 into SANDBOX_ENTER_FAILED before its own chdir branch can
  // map a missing cwd to INVALID_ARGUMENT (cwd), as spawn already does.
  test.serial(badRun, ['pwd'], { cwd: '/does/not/exist' }, invalid('cwd'));
  test.serial(badRun, ['env'], { env: { '1BAD': 'x' } }, invalid('env.1BAD'));
  test.serial(badRun, ['env'], { env: { 'A=B': 'x' } }, invalid('env.A=B'));
  test.serial(badRun, ['env'], { env: { 'WITH SPACE': 'x' } }, invalid('env.WITH SPACE'));
  test.serial(badRun, ['env'], { env: { OK: 'nul\0byte' } }, invalid('env.OK'));
  test.serial(badRun, ['true'], { timeoutMs: -1 }, invalid('timeoutMs'));
  // As over HTTP and MCP: an integer number of ms, at most COMMAND_TIMEOUT_MAX_MS.
  test.serial(badRun, ['true'], { timeoutMs: 1.5 }, invalid('timeoutMs'));
  test.serial(badRun, ['true'], { timeoutMs: COMMAND_TIMEOUT_MAX_MS + 1 }, invalid('timeoutMs'));
  test.serial(badSpawn, [], {}, invalid('command'));
  test.serial(badSpawn, '', {}, invalid('command'));
  test.serial(badSpawn, ['sleep', '1\0'], {}, invalid('command[1]'));
  test.serial(badSpawn, ['sleep', '100'], { cwd: 'tmp' }, invalid('cwd'));
  test.serial(badSpawn, ['sleep', '100'], { cwd: '/does/not/exist' }, invalid('cwd'));
  test.serial(badSpawn, ['definitely-not-a-command'], {}, invalid('command[0]'));
  test.serial(badSpawn, ['sleep', '100'], { stdoutPath: 'relative.log' }, invalid('stdoutPath'));

  // ---- files: traversal and symlinks out of the sandbox ----------------------------
  for (const p of ['../../etc/shadow', '/../../etc/shadow', '/workspace/../../../etc/shadow'])
    test.serial(badPath, 'read', p, escapes(p));
  // write() creates the parent first, so its error names the parent directory.
  test.serial(badPath, 'write', '../../tmp/lockstep-pwned', escapes('../../tmp'));
  for (const p of [
    '/workspace/escape/etc/hostname',
    '/workspace/up/etc/hostname',
    '/workspace/abs-file',
    '/workspace/dotdot/../etc/passwd',
  ])
    test.serial(badPath, 'read', p, escapes(p));
  test.serial(badPath, 'list', '/workspace/escape', escapes('/workspace/escape'));
  test.serial(badPath, 'list', '/workspace/up/root', escapes('/workspace/up/root'));
  test.serial(badPath, 'exists', '/workspace/escape/etc', escapes('/workspace/escape/etc'));
  test.serial(
    badPath,
    'mkdir',
    '/workspace/escape/tmp/lockstep-made-here',
    escapes('/workspace/escape/tmp/lockstep-made-here'),
  );
  test.serial(badPath, 'read', '/etc/pass\0wd', invalid('path'));
  test.serial(badPath, 'read', '', invalid('path'));

  test.serial('writing through a symlink that points out of the sandbox creates nothing on the host', async (t) => {
    const { sb } = await fixture();
    const name = `lockstep-pwned-${randomBytes(6).toString('hex')}`;
    for (const p of [`/workspace/escape/tmp/${name}`, `/workspace/up/tmp/${name}`]) {
      const err = await t.throwsAsync(sb.files.write(p, 'pwned\n'), { code: 'PATH_ESCAPES_SANDBOX' });
      t.true(err!.message.includes(p.slice(0, p.lastIndexOf('/'))), err!.message);
    }
    t.false(fs.existsSync(`/tmp/${name}`));
    // The links themselves are fine to look at and to remove.
    const links = (await sb.files.list('/workspace')).filter((e) => e.type === 'symlink').map((e) => e.name);
    t.deepEqual(links, ['abs-file', 'dotdot', 'escape', 'up']);
  });

  // ---- commands that cannot run ----------------------------------------------------
  test.serial('a program that does not exist exits 127 with a message on stderr', async (t) => {
    const { ls, sb } = await fixture();
    const before = snapshot(ls, sb);
    const direct = await sb.commands.run(['definitely-not-a-command', '--flag']);
    t.is(direct.exitCode, 127);
    t.is(direct.stdout, '');
    t.regex(direct.stderr, /definitely-not-a-command/);
    const byPath = await sb.commands.run(['/no/such/program']);
    t.is(byPath.exitCode, 127);
    t.regex(byPath.stderr, /\/no\/such\/program/);
    const viaShell = await sb.commands.run('definitely-not-a-command');
    t.is(viaShell.exitCode, 127);
    t.regex(viaShell.stderr, /definitely-not-a-command: not found/);
    const notExecutable = await sb.commands.run(['/etc/passwd']);
    t.is(notExecutable.exitCode, 126);
    t.regex(notExecutable.stderr, /\/etc\/passwd/);
    t.deepEqual(snapshot(ls, sb), before);
  });

  // ---- sandboxes that do not exist -------------------------------------------------
  test.serial('unknown sandbox ids are SANDBOX_NOT_FOUND and name the id', async (t) => {
    const { ls, sb } = await fixture();
    const before = snapshot(ls, sb);
    for (const id of ['sbx_doesnotexist0', 'sbx_../../etc', sb.id.toUpperCase()]) {
      const err = t.throws(() => ls.get(id), { code: 'SANDBOX_NOT_FOUND' });
      t.true(err!.message.includes(JSON.stringify(id)));
      await t.throwsAsync(ls.remove(id), { code: 'SANDBOX_NOT_FOUND' });
    }
    const empty = t.throws(() => ls.get(''), { code: 'INVALID_ARGUMENT' });
    t.is((empty as { field?: string }).field, 'id');
    t.true(empty!.message.includes('id'));
    t.deepEqual(snapshot(ls, sb), before);
  });

  test.serial('a removed sandbox refuses every call with SANDBOX_NOT_FOUND', async (t) => {
    const { ls, sb } = await fixture();
    const gone = await ls.create();
    const handle = ls.get(gone.id);
    await ls.remove(gone.id);
    const before = snapshot(ls, sb);
    for (const [what, call] of [
      ['run', () => handle.commands.run(['true'])],
      ['run (shell)', () => gone.commands.run('echo hi')],
      ['spawn', () => handle.commands.spawn(['sleep', '100'])],
      ['checkpoint', () => handle.checkpoint()],
      ['remove', () => ls.remove(gone.id)],
      ['get', async () => ls.get(gone.id)],
    ] as const) {
      const err = await t.throwsAsync(call as () => Promise<unknown>, { code: 'SANDBOX_NOT_FOUND' }, what);
      t.true(err!.message.includes(gone.id), what);
    }
    t.throws(() => handle.info(), { code: 'SANDBOX_NOT_FOUND' });
    t.deepEqual(snapshot(ls, sb), before);
    // The shared sandbox is unaffected by all of the above.
    t.is((await sb.commands.run(['echo', 'fine'])).stdout, 'fine\n');
  });

  // The files API reports the sandbox's own error, not a wrapped file error.
  test.serial('the files API of a removed sandbox refuses with SANDBOX_NOT_FOUND', async (t) => {
    const { ls } = await fixture();
    const gone = await ls.create();
    await ls.remove(gone.id);
    await t.throwsAsync(gone.files.read('/etc/passwd'), { code: 'SANDBOX_NOT_FOUND' });
    await t.throwsAsync(gone.files.write('/workspace/x', 'x'), { code: 'SANDBOX_NOT_FOUND' });
    await t.throwsAsync(gone.files.list('/'), { code: 'SANDBOX_NOT_FOUND' });
  });
});
