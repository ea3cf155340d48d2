/**
 * Idmapped mounts made side by side, as forks make them on libuv's pool.
 * Each call makes a short-lived child in a new user namespace to describe
 * its id map. Such a child must never hold the manager's descriptors: when
 * each had a copy of the descriptor table, two children made at once each
 * held the pipe the other waited on, neither exited, and the sandbox locks
 * they had copied stayed taken (every later call on those sandboxes failed
 * with SANDBOX_BUSY). Real kernel, real addon.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { eventually, integration, sleep } from '../helpers/harness.js';
import { native } from '../../src/native/binding.js';
import { RunnerProcess } from '../fixtures/runner-process.js';

/** Processes other than this one that have `file` open. */
function othersHolding(file: string): number[] {
  const pids: number[] = [];
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    if (Number(pid) === process.pid) continue;
    try {
      for (const fd of fs.readdirSync(`/proc/${pid}/fd`))
        if (fs.readlinkSync(`/proc/${pid}/fd/${fd}`) === file) pids.push(Number(pid));
    } catch {
      /* gone, or not ours to read */
    }
  }
  return pids;
}

/** This process's children that are not in its user namespace. */
function childrenInOtherUserns(): number[] {
  const own = fs.readlinkSync('/proc/self/ns/user');
  const children = fs.readdirSync(`/proc/self/task`).flatMap((tid) => {
    try {
      return fs.readFileSync(`/proc/self/task/${tid}/children`, 'utf8').split(' ').filter(Boolean);
    } catch {
      return []; // a thread of this process that ended meanwhile (one of the addon's own)
    }
  });
  return children.map(Number).filter((pid) => {
    try {
      return fs.readlinkSync(`/proc/${pid}/ns/user`) !== own;
    } catch {
      return false;
    }
  });
}

const ROUNDS = 20;
const LOOP = fileURLToPath(new URL('../../../test/fixtures/idmap-loop.mjs', import.meta.url));
const KILLS = 20;

integration(test, () => {
  test('20 rounds of 32 idmapped mounts at once: every id map applies, no child outlives its call or holds a manager descriptor', async (t) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-idmap-'));
    const targets: string[] = [];
    t.teardown(() => {
      for (const target of targets) {
        try {
          native().unmount(target, true);
        } catch {
          /* not mounted */
        }
      }
      fs.rmSync(dir, { recursive: true, force: true });
    });
    const source = path.join(dir, 'source');
    fs.mkdirSync(source);
    fs.writeFileSync(path.join(source, 'file'), 'x');
    // Stands for a sandbox lock held while the mounts are made.
    const lockFile = path.join(dir, 'lock');
    const lockFd = fs.openSync(lockFile, 'w');
    t.teardown(() => fs.closeSync(lockFd));

    // Rounds of calls at once: the old deadlock needed two pool threads to
    // interleave between making a gate and cloning, so it is a race to give
    // many chances to.
    const N = 32;
    for (let round = 0; round < ROUNDS; round++) {
      const bases = Array.from({ length: N }, (_, i) => 3_000_000_000 + i * 65536);
      const mine = bases.map((_, i) => path.join(dir, `r${round}-${i}`));
      await Promise.all(
        bases.map(async (base, i) => {
          fs.mkdirSync(mine[i]!);
          targets.push(mine[i]!);
          await native().idmappedMounts([[source, mine[i]!]], base, 65536, true);
        }),
      );
      // Root-owned on disk reads as each range's first id through its mount.
      t.deepEqual(
        mine.map((target) => fs.statSync(path.join(target, 'file')).uid),
        bases,
      );
    }
    // Every child is reaped promptly, and none has the lock file open.
    await eventually(() => childrenInOtherUserns().length === 0, 10_000).catch(() => undefined);
    t.deepEqual(childrenInOtherUserns(), []);
    t.deepEqual(othersHolding(lockFile), []);
  });

  // A manager killed between a child's clone and its kill used to leave the
  // child paused for good (parent 1, one thread), holding the dead manager's
  // descriptor table: its stdout pipe (the random-kill test waited 20 min
  // for its end), its state directory's lock and its sandbox locks. Seen
  // in 6 of 20 kills of this loop before the child asked for SIGKILL on
  // its parent's death.
  test(`${KILLS} kill -9s of a process making idmapped mounts: no child of its own outlives it or holds its pipes`, async (t) => {
    let current: RunnerProcess | undefined;
    t.teardown(() => current?.abandonGroup());
    const left: string[] = [];
    for (let k = 0; k < KILLS; k++) {
      const runner = (current = new RunnerProcess(LOOP, []));
      t.true(await runner.waitFor('"ready"', 30_000), `kill ${k}: the loop started (${runner.err.slice(-2000)})`);
      await sleep(100 + Math.floor(Math.random() * 300));
      runner.kill();
      // Throws (naming who held them) if the pipes stay open: the child survived.
      const end = await runner.ended(`kill ${k}`).catch((e: Error) => {
        left.push(e.message);
        return undefined;
      });
      if (end) t.is(end.signal, 'SIGKILL', `kill ${k}: the loop died by the kill (${runner.err.slice(-2000)})`);
    }
    t.deepEqual(left, [], 'no kill left a process holding the pipes of the loop');
  });
});
