/**
 * A restored sandbox's /dev folder, made by the addon (native/helper/dev-folder.h,
 * shared with the helper's create verb): the same device nodes, links and
 * mount points; preparing it again changes nothing; a failure is a typed
 * error naming the folder.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { freshHome, integration } from '../helpers/harness.js';
import { native } from '../../src/native/binding.js';
import { StatePaths } from '../../src/paths.js';
import { SandboxRuntime } from '../../src/instances/runtime.js';

function runtimeAt(home: string): SandboxRuntime {
  const paths = new StatePaths(home);
  // Only the paths and the addon take part in prepareForRestore.
  const unused = {} as never;
  return new SandboxRuntime(paths, unused, unused, unused, 'test', native(), unused);
}

integration(test, () => {
  test('the folder has the device nodes, links and mount points a sandbox needs; again is a no-op', async (t) => {
    const home = freshHome('dev-folder');
    t.teardown(() => fs.rmSync(home, { recursive: true, force: true }));
    const runtime = runtimeAt(home);
    const dev = runtime.paths.sandboxDev('sbx_dev');
    fs.mkdirSync(dev, { recursive: true });
    await runtime.prepareForRestore('sbx_dev');
    await runtime.prepareForRestore('sbx_dev');
    const nodes = Object.fromEntries(
      ['null', 'zero', 'full', 'random', 'urandom', 'tty'].map((n) => {
        const st = fs.lstatSync(path.join(dev, n));
        return [n, [st.isCharacterDevice(), st.rdev, st.mode & 0o777]];
      }),
    );
    const rdev = (maj: number, min: number) => (maj << 8) | min;
    t.deepEqual(nodes, {
      null: [true, rdev(1, 3), 0o666],
      zero: [true, rdev(1, 5), 0o666],
      full: [true, rdev(1, 7), 0o666],
      random: [true, rdev(1, 8), 0o666],
      urandom: [true, rdev(1, 9), 0o666],
      tty: [true, rdev(5, 0), 0o666],
    });
    t.deepEqual(
      ['fd', 'stdin', 'stdout', 'stderr', 'ptmx'].map((l) => fs.readlinkSync(path.join(dev, l))),
      ['/proc/self/fd', '/proc/self/fd/0', '/proc/self/fd/1', '/proc/self/fd/2', 'pts/ptmx'],
    );
    t.true(fs.lstatSync(path.join(dev, 'shm')).isDirectory());
    t.true(fs.lstatSync(path.join(dev, 'pts')).isDirectory());
    t.is(fs.readdirSync(dev).length, 13);
  });

  test('a mount point that is not a folder fails with DEV_FOLDER_FAILED naming it', async (t) => {
    const home = freshHome('dev-folder');
    t.teardown(() => fs.rmSync(home, { recursive: true, force: true }));
    const runtime = runtimeAt(home);
    const dev = runtime.paths.sandboxDev('sbx_bad');
    fs.mkdirSync(dev, { recursive: true });
    fs.writeFileSync(path.join(dev, 'shm'), 'planted');
    const e = await t.throwsAsync(runtime.prepareForRestore('sbx_bad'), { code: 'DEV_FOLDER_FAILED' });
    t.like((e as unknown as { details: object }).details, { sysCode: 'ENOTDIR', path: path.join(dev, 'shm') });
  });
});
