/**
 * Packaging smoke test: what a new user does. `npm pack`, then in a fresh
 * project `npm install` of the tarball (its install hook builds the native
 * parts), `npx lockstep setup`, a script that creates a sandbox, runs a
 * command, checkpoints, rolls back and forks through the installed package,
 * and the installed CLI. Host packages, CRIU and the image build cache are
 * the machine's (already provisioned), and npm resolves from its warm cache
 * (--prefer-offline), so the time goes to native builds: Lockstep's own
 * (~90 s on the loaded 2-vCPU VM) and, where prebuild-install cannot reach
 * its download host, better-sqlite3's SQLite (most of a ~19 min install here).
 *
 * LOCKSTEP_PACKAGING_TRANSCRIPT=FILE writes the commands and their output there.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { destroyHome, freshHome, integration, TEST_ROOT } from '../helpers/harness.js';
import { VERSION } from '../../src/version.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** A user's shell: no npm_* variables from an enclosing `npm test`. */
function userEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith('npm_')));
  return { ...env, CI: 'true', NO_COLOR: '1', ...extra };
}

const transcript: string[] = [];

function run(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: Record<string, string>; show?: string },
): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: userEnv(opts.env ?? {}), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => {
      const envText = Object.entries(opts.env ?? {})
        .map(([k, v]) => `${k}=${v} `)
        .join('');
      transcript.push(
        `$ ${envText}${opts.show ?? [cmd, ...args].join(' ')}`,
        ...[stdout, stderr].filter((s) => s.trim()).map((s) => s.trimEnd()),
        `[exit ${code}]`,
        '',
      );
      resolve({ code: code ?? 1, stdout, stderr });
    });
  });
}

integration(test, () => {
  let tarball = '';
  let packDir = '';

  test.before(async () => {
    fs.mkdirSync(TEST_ROOT, { recursive: true, mode: 0o700 });
    packDir = fs.mkdtempSync(path.join(TEST_ROOT, 'pack-'));
    // --ignore-scripts: the tests run from a dist/ that is already compiled;
    // prepack would only recompile it under the feet of other test files.
    const r = await run('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', packDir], {
      cwd: root,
      show: 'npm pack',
    });
    if (r.code !== 0) throw new Error(`npm pack failed: ${r.stderr}`);
    tarball = path.join(packDir, r.stdout.trim().split('\n').pop()!);
  });

  test.after.always(() => {
    if (packDir) fs.rmSync(packDir, { recursive: true, force: true });
    if (process.env.LOCKSTEP_PACKAGING_TRANSCRIPT)
      fs.writeFileSync(process.env.LOCKSTEP_PACKAGING_TRANSCRIPT, transcript.join('\n') + '\n');
  });

  /** `npx lockstep ARGS` without ever asking the registry (`--no`); `--` keeps npx from reading the flags. */
  const npx = (args: string[], opts: { cwd: string; env?: Record<string, string> }) =>
    run('npx', ['--no', '--', 'lockstep', ...args], { ...opts, show: `npx lockstep ${args.join(' ')}` });

  test.serial(
    'the tarball holds the sources to build, the set-up scripts and deploy/, and no build output or tests',
    async (t) => {
      const r = await run('tar', ['-tzf', tarball], { cwd: packDir });
      const files = new Set(r.stdout.split('\n').filter(Boolean));
      for (const f of [
        'package/package.json',
        'package/binding.gyp',
        'package/native/addon/criu.cc',
        'package/native/helper/main.c',
        'package/scripts/install.js',
        'package/scripts/provision-host.sh',
        'package/sandbox-images/base/build.sh',
        'package/sandbox-images/lib.sh',
        'package/deploy/lockstep.service',
        'package/deploy/config.json',
        'package/CHANGELOG.md',
        'package/bin/lockstep.js',
        'package/dist/src/index.js',
        'package/dist/src/cli/main.js',
      ]) {
        t.true(files.has(f), f);
      }
      t.false(
        [...files].some(
          (f) =>
            f.startsWith('package/build/') ||
            f.startsWith('package/dist/test/') ||
            f.startsWith('package/node_modules/') ||
            f === 'package/scripts/setup.sh',
        ),
      );
    },
  );

  test.serial('a fresh project installs the tarball and uses the SDK and the CLI from it', async (t) => {
    t.timeout(30 * 60_000, 'npm install builds the native parts');
    const project = fs.mkdtempSync(path.join(TEST_ROOT, 'project-'));
    const home = freshHome('packaging');
    t.teardown(async () => {
      if (fs.existsSync(home)) await destroyHome(home);
      fs.rmSync(project, { recursive: true, force: true });
    });
    fs.writeFileSync(
      path.join(project, 'package.json'),
      JSON.stringify({ name: 'smoke-project', version: '1.0.0', private: true, type: 'module' }, null, 2),
    );

    // 1. npm install: the install hook builds the addon, the helper and the init.
    const install = await run(
      'npm',
      ['install', '--prefer-offline', '--no-audit', '--no-fund', '--foreground-scripts', tarball],
      { cwd: project, show: `npm install --prefer-offline --foreground-scripts ./${path.basename(tarball)}` },
    );
    t.is(install.code, 0, install.stderr);
    const installed = path.join(project, 'node_modules', 'lockstep');
    for (const f of ['lockstep.node', 'lockstep-helper', 'lockstep-init'])
      t.true(fs.existsSync(path.join(installed, 'build', 'Release', f)), f);
    t.regex(install.stderr + install.stdout, /lockstep: native parts built/);
    t.true(
      fs.existsSync(path.join(project, 'node_modules', 'node-gyp', 'package.json')),
      'node-gyp is a regular dependency',
    );

    // 2. The installed CLI answers its version.
    const version = await npx(['--version'], { cwd: project });
    t.is(version.stdout.trim(), VERSION);

    // 3. setup --check on a state directory that is not set up: says what is missing, exit 5.
    const env = { LOCKSTEP_HOME: home };
    const before = await npx(['setup', '--check'], { cwd: project, env });
    t.is(before.code, 5);
    t.regex(before.stdout, /PASS native build .*node_modules\/lockstep\/build\/Release/);
    t.regex(before.stdout, /FAIL state directory .*has no catalog yet/);
    t.regex(before.stdout, /→ run `npx lockstep setup` as root/);

    // 4. Before `lockstep setup` on this state directory the script works too, on this
    // provisioned host: the base image is a shipped recipe, made on first use (linked
    // from the build cache).
    const script = path.join(project, 'smoke.mjs');
    fs.writeFileSync(
      script,
      `import { Lockstep } from 'lockstep';

const ls = await Lockstep.open();
try {
  const sandbox = await ls.create({ image: 'base' });
  await sandbox.commands.run(['sh', '-c', 'echo one > /workspace/state.txt']);
  const ckpt = await sandbox.checkpoint({ label: 'one' });
  await sandbox.commands.run(['sh', '-c', 'echo two > /workspace/state.txt']);
  await sandbox.rollback(ckpt.id);
  const afterRollback = (await sandbox.commands.run(['cat', '/workspace/state.txt'])).stdout.trim();
  const [fork] = await sandbox.fork(ckpt.id, { count: 1 });
  const inFork = (await ls.get(fork.id).commands.run(['cat', '/workspace/state.txt'])).stdout.trim();
  console.log(JSON.stringify({ sandbox: sandbox.id, checkpoint: ckpt.id, afterRollback, fork: fork.id, inFork, module: import.meta.resolve('lockstep') }));
} catch (e) {
  console.log(JSON.stringify({ error: e.code, message: e.message }));
  process.exitCode = 1;
} finally {
  await ls.close();
}
`,
    );
    const early = await run('node', ['smoke.mjs'], { cwd: project, env });
    t.is(early.code, 0, early.stdout + early.stderr);
    const first = JSON.parse(early.stdout) as { sandbox: string; fork: string; afterRollback: string };
    t.is(first.afterRollback, 'one');

    // 5. setup (host packages, native build, state directory, image), then --check passes.
    const setup = await npx(['setup', '--images', 'base'], { cwd: project, env });
    t.is(setup.code, 0, setup.stderr);
    t.regex(setup.stderr, /lockstep setup: done in/);
    const after = await npx(['setup', '--check'], { cwd: project, env });
    t.is(after.code, 0, after.stdout);
    t.regex(after.stdout, /PASS image base/);

    // 6. The script: create, run, checkpoint, roll back, fork, through the installed package.
    const smoke = await run('node', ['smoke.mjs'], { cwd: project, env });
    t.is(smoke.code, 0, smoke.stdout + smoke.stderr);
    const result = JSON.parse(smoke.stdout) as {
      sandbox: string;
      checkpoint: string;
      afterRollback: string;
      fork: string;
      inFork: string;
      module: string;
    };
    t.is(result.afterRollback, 'one');
    t.is(result.inFork, 'one');
    t.is(fileURLToPath(result.module), path.join(installed, 'dist', 'src', 'index.js'));

    // 7. The installed CLI sees what the script made.
    const ls = await npx(['ls', '--json'], { cwd: project, env });
    t.is(ls.code, 0);
    const listed = JSON.parse(ls.stdout) as { id: string; forkedFrom: string | null; state: string }[];
    t.deepEqual(listed.map((s) => s.id).sort(), [first.sandbox, first.fork, result.sandbox, result.fork].sort());
    t.is(listed.find((s) => s.id === result.fork)?.forkedFrom, result.checkpoint);
    t.log(transcript.join('\n'));
  });
});
