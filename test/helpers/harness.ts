/**
 * Shared set-up for integration tests: each test file gets a state
 * directory of its own (so files run in parallel without sharing a reaper),
 * torn down with everything it created. On a host that lacks what the tests
 * need they skip with the reason, except under CI=true, where a skip is a
 * failure: CI runs as root on a machine that has everything.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { ExecutionContext, TestFn } from 'ava';
import { Lockstep, type OpenOptions } from '../../src/index.js';

export const TEST_ROOT = process.env.LOCKSTEP_TEST_ROOT ?? '/var/tmp/lockstep-test';

/** Why integration tests cannot run here, or undefined when they can. */
export function integrationBlocker(): string | undefined {
  if (process.platform !== 'linux') return 'not Linux';
  if (process.getuid?.() !== 0) return 'not root';
  if (!fs.existsSync('/opt/lockstep/bin/criu') && !process.env.LOCKSTEP_CRIU)
    return 'CRIU 4.x not provisioned (run npm run setup)';
  return undefined;
}

/**
 * Registers the tests of a file only when the host can run them; otherwise
 * one test that skips (or, under CI, fails) with the reason.
 */
export function integration(test: TestFn, register: () => void): void {
  const blocker = integrationBlocker();
  if (!blocker) {
    register();
    return;
  }
  if (process.env.CI === 'true') {
    test('integration prerequisites', (t) => t.fail(`integration tests cannot run under CI: ${blocker}`));
  } else {
    test.skip(`integration tests skipped: ${blocker}`, () => undefined);
  }
}

/** A fresh state directory path (not created). */
export function freshHome(label = 'home'): string {
  // Searchable, not readable, by others: a sandbox restored into its user
  // namespace resolves its paths as an unprivileged host id.
  fs.mkdirSync(TEST_ROOT, { recursive: true, mode: 0o711 });
  fs.chmodSync(TEST_ROOT, 0o711);
  return path.join(TEST_ROOT, `${label}-${process.pid}-${randomBytes(4).toString('hex')}`);
}

/**
 * Opens a Lockstep on a fresh state directory with the given images built
 * (from the build cache after the first time), and tears it all down after
 * the file's tests.
 */
export async function openTestLockstep(
  t: ExecutionContext | { teardown: (fn: () => Promise<void>) => void },
  opts: { images?: string[]; home?: string; open?: OpenOptions } = {},
): Promise<Lockstep> {
  const home = opts.home ?? freshHome();
  const ls = await Lockstep.open({ ...opts.open, home });
  for (const img of opts.images ?? ['base']) await ls.images.ensure(img);
  t.teardown(async () => {
    await ls.close();
    await destroyHome(home);
  });
  return ls;
}

/** Removes every trace of a test state directory, even if its manager was killed. */
export async function destroyHome(home: string): Promise<void> {
  const ls = await Lockstep.open({ home });
  await ls.destroyAll({ deleteFiles: true });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls until fn returns a truthy value or the time is up. */
export async function eventually<T>(fn: () => Promise<T> | T, timeoutMs = 5000, stepMs = 20): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline)
      throw new Error(`condition not met within ${timeoutMs} ms${last ? `: ${String(last)}` : ''}`);
    await sleep(stepMs);
  }
}

export { os };
