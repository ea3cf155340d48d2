/**
 * The per-sandbox lock against a real holder in another process (util-linux
 * flock(1) on the same file): a call that cannot get it within its timeout
 * fails with SANDBOX_BUSY naming who holds it, and gets it once released.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SandboxLocks } from '../../src/api/engine.js';
import { native } from '../../src/native/binding.js';
import { systemClock } from '../../src/ports.js';
import { InvalidStateError } from '../../src/errors.js';

test('a lock held by another process: SANDBOX_BUSY names the holder; released, the call runs', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-locks-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'sbx_test');
  fs.writeFileSync(file, '');
  const holder = spawn('flock', ['--exclusive', '--close', file, 'sh', '-c', 'echo held; exec sleep 30'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.teardown(() => holder.kill('SIGKILL'));
  await new Promise<void>((resolve) => holder.stdout.once('data', () => resolve()));

  const locks = new SandboxLocks(() => file, native().flock.bind(native()), systemClock);
  let ran = false;
  const err = await t.throwsAsync(
    locks.with('sbx_test', async () => (ran = true), 200),
    { instanceOf: InvalidStateError },
  );
  t.is((err as InvalidStateError).code, 'SANDBOX_BUSY');
  t.false(ran);
  const holders = (err as InvalidStateError & { details: { holders: string[] } }).details.holders;
  // flock(1) and the sleep it became both have the file open.
  t.true(
    holders.some((h) => / \((flock|sleep)\) /.test(h)),
    holders.join('; '),
  );
  t.regex(err!.message, /its lock is open in pid \d+/);

  holder.kill('SIGKILL');
  await new Promise((r) => holder.once('exit', r));
  t.is(await locks.with('sbx_test', async () => 'ran', 2000), 'ran');
});
