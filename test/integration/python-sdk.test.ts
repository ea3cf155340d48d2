/**
 * The Python SDK's pytest suite (clients/python/tests), run with Debian's
 * python3 against a real `lockstep serve` started here on loopback, so that
 * `npm test` and CI run it like every other integration test.
 */
import test from 'ava';
import fs from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { tenantToken } from '../fixtures/http-client.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));
const PYTHON_DIR = fileURLToPath(new URL('../../../clients/python', import.meta.url));
/** Debian's interpreter, not whatever python3 comes first on PATH: the SDK promises to need nothing else. */
const PYTHON = '/usr/bin/python3';
/** Addresses of the egress sandbox the scenario makes: a range no other file uses (test/unit/test-ranges.test.ts). */
const RANGE = '10.236.0.0/24';

/** Starts `lockstep serve --port 0 --json` on a state directory; resolves with its URL. */
async function serve(t: { teardown: (fn: () => Promise<void>) => void }, home: string): Promise<string> {
  // A folder snapshot store beside the state directory, for the push and pull tests.
  const store = `${home}-store`;
  t.teardown(async () => fs.rmSync(store, { recursive: true, force: true }));
  const child: ChildProcess = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--json'], {
    env: {
      ...process.env,
      LOCKSTEP_HOME: home,
      LOCKSTEP_LOG_LEVEL: 'warn',
      LOCKSTEP_SNAPSHOT_STORE: store,
      LOCKSTEP_NETWORK_RANGE: RANGE,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exit;
  });
  let out = '';
  return new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      out += b.toString();
      try {
        resolve((JSON.parse(out) as { url: string }).url);
      } catch {
        /* not all of it yet */
      }
    });
    void exit.then((code) => reject(new Error(`serve exited with ${code} before listening: ${out}`)));
  });
}

/** Runs a command; resolves with its exit code and combined output. */
function run(
  cmd: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  cwd: string,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env, cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (b: Buffer) => (output += b.toString()));
    child.stderr.on('data', (b: Buffer) => (output += b.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, output }));
  });
}

integration(test, () => {
  test.serial('the Python SDK passes its pytest suite against lockstep serve', async (t) => {
    t.timeout(600_000);
    if (!fs.existsSync(PYTHON))
      return t.fail(
        `${PYTHON} is missing: run npm run setup (scripts/provision-host.sh installs python3 and python3-pytest)`,
      );
    // dev: the PTY test runs Python's REPL on a terminal of the sandbox.
    const ls = await openTestLockstep(t, { images: ['base', 'dev'] });
    const url = await serve(t, ls.home);
    const env = {
      PATH: '/usr/bin:/bin',
      LOCKSTEP_API_URL: url,
      LOCKSTEP_API_KEY: tenantToken(ls, 'python'),
      // A sandbox (2048 MiB by default) and two forks fit in its disk quota, a third does not.
      LOCKSTEP_API_KEY_DISK_QUOTA: tenantToken(ls, 'python-disk', { maxDiskMb: 7000 }),
      PYTHONPATH: PYTHON_DIR,
      PYTHONDONTWRITEBYTECODE: '1',
      ...(process.env.CI ? { CI: process.env.CI } : {}),
    };
    const r = await run(PYTHON, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests'], env, PYTHON_DIR);
    t.log(r.output.split('\n').slice(-15).join('\n'));
    t.is(r.code, 0, r.output);
    t.regex(r.output, /\d+ passed/);
    t.notRegex(r.output, /failed|skipped|error/i);
  });
});
