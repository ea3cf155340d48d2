/**
 * What a user meets before the host is set up: npm's install hook run in a
 * copy of the package with no toolchain on PATH, the platform check, and how
 * the "not set up" errors map to exit codes and HTTP statuses.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { assertSupportedPlatform } from '../../src/native/binding.js';
import { exitCodeFor, EXIT } from '../../src/cli/output.js';
import { statusForCode } from '../../src/http/errors.js';
import { HostError } from '../../src/errors.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** A copy of the package's install hook and build inputs in a temporary folder. */
function packageCopy(t: { teardown: (fn: () => void) => void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-install-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.mkdirSync(path.join(dir, 'scripts'));
  fs.copyFileSync(path.join(root, 'scripts', 'install.js'), path.join(dir, 'scripts', 'install.js'));
  fs.copyFileSync(path.join(root, 'binding.gyp'), path.join(dir, 'binding.gyp'));
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'lockstep', type: 'module' }));
  return dir;
}

const hook = (dir: string, args: string[] = []) =>
  spawnSync(process.execPath, [path.join(dir, 'scripts', 'install.js'), ...args], {
    cwd: dir,
    env: { PATH: '/nonexistent' },
    encoding: 'utf8',
  });

test('without a toolchain, npm install succeeds and records why nothing was built', (t) => {
  const dir = packageCopy(t);
  const r = hook(dir);
  t.is(r.status, 0);
  t.regex(
    r.stderr,
    /not building the native parts now: the build tools are missing \(Debian packages: python3, make, g\+\+, gcc\)/,
  );
  t.regex(r.stderr, /run `npx lockstep setup` as root/);
  t.regex(fs.readFileSync(path.join(dir, 'build', 'install-skipped.txt'), 'utf8'), /the build tools are missing/);
  t.false(fs.existsSync(path.join(dir, 'build', 'Release')));
});

test('run by `lockstep setup` (--required), a missing toolchain is a failure', (t) => {
  const r = hook(packageCopy(t), ['--required']);
  t.is(r.status, 1);
  t.regex(r.stderr, /cannot build the native parts: the build tools are missing/);
});

test('only Linux x86_64 is supported, and the error says which platform this is', (t) => {
  t.notThrows(() => assertSupportedPlatform('linux', 'x64'));
  const err = t.throws(() => assertSupportedPlatform('darwin', 'arm64'), { code: 'UNSUPPORTED_PLATFORM' });
  t.regex(err!.message, /Linux x86_64 only \(this is darwin-arm64\)/);
});

test('"not set up" errors exit with the host code and answer 503', (t) => {
  for (const code of [
    'NATIVE_NOT_BUILT',
    'NATIVE_LOAD_FAILED',
    'UNSUPPORTED_PLATFORM',
    'CRIU_NOT_INSTALLED',
    'CATALOG_TOO_NEW',
    'HOST_PROVISIONING_FAILED',
  ] as const) {
    t.is(exitCodeFor(new HostError(code, 'x')), EXIT.host, code);
    t.is(statusForCode(code, new HostError(code, 'x')), 503, code);
  }
  t.is(exitCodeFor(new HostError('CONFIG_INVALID', 'x')), EXIT.usage);
});
