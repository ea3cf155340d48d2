/**
 * Checkpoints that store only the pages that changed (page-delta.ts), on
 * real sandboxes: a Python process holds 8 MiB of random bytes and a dict;
 * between checkpoints 64 KiB of them change. The checkpoints link to their
 * parents and store a fraction of the memory, and every one of them
 * restores the exact memory (a digest the process computes over its own
 * state, on request) and files, also through a 3-deep chain and after the
 * middle checkpoint of a chain is deleted.
 */
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep, Sandbox, CheckpointInfo } from '../../src/index.js';
import { chainDepth, MAX_CHAIN_DEPTH, parentOf } from '../../src/checkpoints/page-delta.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { hostPath } from '../fixtures/stub-workloads.js';

// Set for the crash runner too.
process.env.LOCKSTEP_PAGE_DELTA = 'on';
const BLOB_MIB = 8;
const CRASH_RUNNER = fileURLToPath(new URL('../../../test/fixtures/crash-runner.mjs', import.meta.url));

/** SIGUSR1: change 64 KiB of the blob and bump the dict; SIGUSR2: report (generation, digest of blob and dict) to /tmp/report. Both taken with sigwait. */
const PY_MEMORY = `
import hashlib, json, os, signal
state = {'gen': 0, 'notes': {}}
blob = bytearray(os.urandom(${BLOB_MIB} << 20))
def report(*_):
    h = hashlib.sha256(blob)
    h.update(json.dumps(state, sort_keys=True).encode())
    with open('/tmp/report.tmp', 'w') as f:
        f.write('%d %s' % (state['gen'], h.hexdigest()))
    os.replace('/tmp/report.tmp', '/tmp/report')
def change(*_):
    state['gen'] += 1
    g = state['gen']
    off = (g * 3 << 16) % len(blob)
    blob[off:off + (1 << 16)] = os.urandom(1 << 16)
    state['notes']['n%d' % g] = 'x' * g
    report()
# Taken synchronously: with handlers and time.sleep, a signal sent just as
# the previous handler returns, before the sleep is re-entered, waits the hour.
signals = {signal.SIGUSR1, signal.SIGUSR2}
signal.pthread_sigmask(signal.SIG_BLOCK, signals)
report()
while True:
    if signal.sigwait(signals) == signal.SIGUSR1:
        change()
    else:
        report()
`;

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    // Sandboxes get a user namespace (the default); one test makes one without.
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['dev'] });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  const imageDir = (c: CheckpointInfo) => ls.engine.paths.processImage(c.id);

  function pythonPid(sb: Sandbox): number {
    const e = ls.engine;
    const row = e.catalog.requireSandbox(sb.id);
    const pid = e.cgroups
      .pids(e.runtime.cgroupName(row.instance))
      .find((p) => fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('memory.py'));
    if (!pid) throw new Error(`no python in ${sb.id}`);
    return pid;
  }

  /** What the process holds in memory now: it is asked to report afresh (the old report file is removed first). */
  async function memory(sb: Sandbox): Promise<string> {
    const file = hostPath(ls, sb.id, '/tmp/report');
    fs.rmSync(file, { force: true });
    process.kill(pythonPid(sb), 'SIGUSR2');
    return eventually(() => fs.existsSync(file) && fs.readFileSync(file, 'utf8'), 60_000, 5) as Promise<string>;
  }

  /** Changes 64 KiB of the blob and a dict entry, and returns the new memory report. */
  async function change(sb: Sandbox): Promise<string> {
    const before = await memory(sb);
    process.kill(pythonPid(sb), 'SIGUSR1');
    return eventually(
      async () => {
        const now = fs.readFileSync(hostPath(ls, sb.id, '/tmp/report'), 'utf8');
        return now !== before && now.split(' ')[0] !== before.split(' ')[0] && now;
      },
      60_000,
      5,
    ) as Promise<string>;
  }

  async function pythonSandbox(t: ExecutionContext, userNamespace = true): Promise<Sandbox> {
    const before = ls.engine.userNamespaces;
    ls.engine.userNamespaces = userNamespace;
    let sb: Sandbox;
    try {
      sb = await ls.create({ image: 'dev' });
    } finally {
      ls.engine.userNamespaces = before;
    }
    t.is(ls.engine.catalog.requireSandbox(sb.id).id_base !== null, userNamespace, 'user namespace as asked');
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    await sb.files.write('/workspace/memory.py', PY_MEMORY);
    await sb.commands.spawn(['python3', '/workspace/memory.py'], { stderrPath: '/tmp/memory.err' });
    await eventually(() => fs.existsSync(hostPath(ls, sb.id, '/tmp/report')), 60_000, 10);
    return sb;
  }

  /** Three checkpoints, each after a change of memory and of /workspace/file; returns them with what each held. */
  async function chainOfThree(sb: Sandbox) {
    const out: { ckpt: CheckpointInfo; mem: string; file: string }[] = [];
    for (let i = 1; i <= 3; i++) {
      const mem = await change(sb);
      const file = `version ${i}\n`;
      await sb.files.write('/workspace/file', file);
      const ckpt = await sb.checkpoint({ label: `v${i}` });
      await sb.settled();
      out.push({ ckpt, mem, file });
    }
    return out;
  }

  async function expectAt(
    t: ExecutionContext,
    sb: Sandbox,
    at: { ckpt: CheckpointInfo; mem: string; file: string },
    path: 'standby' | 'restore',
  ) {
    await change(sb); // move away first, so that the rollback has something to undo
    if (path === 'restore') {
      // A warm standby (of the latest checkpoint, or of the last rollback's) would spare CRIU the chain.
      await sb.settled();
      await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
    }
    const report = await sb.rollback(at.ckpt.id);
    t.is(report.path, path);
    t.is(await memory(sb), at.mem, `memory of ${at.ckpt.label}`);
    t.is((await sb.files.read('/workspace/file')).content.toString(), at.file, `file of ${at.ckpt.label}`);
  }

  const threeDeep = test.macro(async (t, userNamespace: boolean) => {
    t.timeout(600_000); // a busy 2-CPU machine: restores of an 8 MiB Python take seconds each
    const sb = await pythonSandbox(t, userNamespace);
    const [c1, c2, c3] = await chainOfThree(sb);
    t.is(parentOf(imageDir(c1!.ckpt)), null, 'the first checkpoint is whole');
    t.is(parentOf(imageDir(c2!.ckpt)), c1!.ckpt.id);
    t.is(parentOf(imageDir(c3!.ckpt)), c2!.ckpt.id);
    t.is(chainDepth(imageDir(c3!.ckpt)), 2);
    // 64 KiB of the 8 MiB blob changed, plus what the interpreter touched.
    t.true(c1!.ckpt.sizes.processImageBytes > BLOB_MIB << 20, `whole: ${c1!.ckpt.sizes.processImageBytes}`);
    for (const c of [c2!, c3!])
      t.true(c.ckpt.sizes.processImageBytes < (BLOB_MIB << 20) / 4, `delta: ${c.ckpt.sizes.processImageBytes}`);

    await expectAt(t, sb, c3!, 'standby'); // the standby itself was restored through the chain
    await expectAt(t, sb, c1!, 'restore');
    await expectAt(t, sb, c2!, 'restore');
    await expectAt(t, sb, c3!, 'restore');
  });
  test.serial('a 3-deep chain stores what changed and restores each checkpoint exactly', threeDeep, true);
  test.serial('the same without a user namespace', threeDeep, false);

  test.serial('a fork of a chained checkpoint gets the chain in its own id range, and the exact memory', async (t) => {
    t.timeout(600_000);
    const sb = await pythonSandbox(t);
    const [, c2] = await chainOfThree(sb);
    t.is(chainDepth(imageDir(c2!.ckpt)), 1);
    const before = fs.readdirSync(imageDir(c2!.ckpt)).sort();
    const [result] = await sb.fork(c2!.ckpt.id, { count: 1 });
    const fork = ls.get((result as { id: string }).id);
    t.teardown(() => ls.remove(fork.id).catch(() => undefined));
    const e = ls.engine;
    const forkBase = e.catalog.requireSandbox(fork.id).id_base;
    t.not(forkBase, null);
    t.not(forkBase, e.catalog.requireSandbox(sb.id).id_base, 'a range of its own');
    t.is(await memory(fork), c2!.mem, 'the fork holds the memory of the checkpoint it came from');
    t.is((await fork.files.read('/workspace/file')).content.toString(), c2!.file);
    // The parent's chain is untouched, and nothing of the copy is left behind.
    t.deepEqual(fs.readdirSync(imageDir(c2!.ckpt)).sort(), before);
    t.is(parentOf(imageDir(c2!.ckpt)), sb.checkpoints()[0]!.id);
    t.deepEqual(
      fs.readdirSync(e.paths.scratch).filter((n) => n.startsWith('images-')),
      [],
    );
    // And the parent still restores through its chain.
    await expectAt(t, sb, c2!, 'restore');
  });

  test.serial(
    'deleting the middle of a chain keeps its child restorable; deleting the root makes the child whole',
    async (t) => {
      t.timeout(600_000); // a busy 2-CPU machine: restores of an 8 MiB Python take seconds each
      const sb = await pythonSandbox(t);
      const [c1, c2, c3] = await chainOfThree(sb);
      await sb.deleteCheckpoint(c2!.ckpt.id);
      t.false(fs.existsSync(imageDir(c2!.ckpt)));
      t.is(parentOf(imageDir(c3!.ckpt)), c1!.ckpt.id, 'the child links to its grandparent');
      await expectAt(t, sb, c3!, 'restore');

      await sb.deleteCheckpoint(c1!.ckpt.id);
      t.is(parentOf(imageDir(c3!.ckpt)), null, 'no parent left');
      await expectAt(t, sb, c3!, 'restore');
      // The next checkpoint links to the surviving one.
      const mem = await change(sb);
      const c4 = await sb.checkpoint({ label: 'v4' });
      await sb.settled();
      t.is(parentOf(imageDir(c4)), c3!.ckpt.id);
      await expectAt(t, sb, { ckpt: c4, mem, file: c3!.file }, 'restore');
    },
  );

  test.serial('kill -9 after the child absorbed its parent: the checkpoint stays, and both restore', async (t) => {
    t.timeout(600_000); // a busy 2-CPU machine: restores of an 8 MiB Python take seconds each
    const sb = await pythonSandbox(t);
    const [c1, c2, c3] = await chainOfThree(sb);
    const child = spawn(process.execPath, [CRASH_RUNNER, 'delete-checkpoint', ls.home, sb.id, c2!.ckpt.id], {
      env: { ...process.env, LOCKSTEP_FAULT: 'deleteCheckpoint:flattened' },
      stdio: 'ignore',
    });
    const [, signal] = await once(child, 'exit');
    t.is(signal, 'SIGKILL', 'the manager died at the fault point');
    t.deepEqual(
      sb.checkpoints().map((c) => c.id),
      [c1!.ckpt.id, c2!.ckpt.id, c3!.ckpt.id],
      'nothing was deleted',
    );
    t.is(parentOf(imageDir(c3!.ckpt)), c1!.ckpt.id, 'the child already stands without its parent');
    await expectAt(t, sb, c2!, 'restore');
    await expectAt(t, sb, c3!, 'restore');
    await sb.deleteCheckpoint(c2!.ckpt.id); // finishing the delete later works
    await expectAt(t, sb, c3!, 'restore');
  });

  test.serial('a chain is cut at the depth bound, so a restore reads a bounded number of images', async (t) => {
    t.timeout(600_000); // a busy 2-CPU machine: restores of an 8 MiB Python take seconds each
    const sb = await pythonSandbox(t);
    await sb.files.write('/workspace/file', 'same\n');
    const made: { ckpt: CheckpointInfo; mem: string; file: string }[] = [];
    for (let i = 0; i < MAX_CHAIN_DEPTH + 2; i++) {
      const mem = await change(sb);
      made.push({ ckpt: await sb.checkpoint(), mem, file: 'same\n' });
      await sb.settled();
    }
    t.deepEqual(
      made.map((c) => chainDepth(imageDir(c.ckpt))),
      [...Array.from({ length: MAX_CHAIN_DEPTH + 1 }, (_, i) => i), 0],
    );
    await expectAt(t, sb, made[MAX_CHAIN_DEPTH]!, 'restore'); // the deepest image
    await expectAt(t, sb, made[0]!, 'restore');
  });
});
