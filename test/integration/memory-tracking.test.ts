/**
 * Checkpoints that dump only the pages written since the previous one
 * (Lockstep's CRIU build, native/criu/, with its written-page keeper), on
 * real sandboxes in user namespaces with their seccomp filters on.
 *
 * The exactness property: memload (native/criu/test/memload.c, built
 * static here) holds memory whose every MiB it can hash. Each step changes
 * random pages and, in its mixed mode, makes new mappings, moves one with
 * mremap, forks a child that changes its own copy, drops pages with
 * madvise(MADV_DONTNEED) (anonymous and copied-on-write file pages), has the
 * kernel write into it (pread), and uses transparent huge pages. After
 * every step a checkpoint is taken and the hashes of that step are kept;
 * then every checkpoint is rolled back to, in a shuffled order, and a fork
 * is made from one of them, and the restored processes must hash to exactly
 * what they held at that checkpoint. A restore arms the tracking in the
 * processes it makes, so the chain goes on incrementally after a rollback
 * too, and those checkpoints are checked the same way. A page the tracker
 * missed is a mismatch here.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import test, { type ExecutionContext } from 'ava';
import type { CheckpointInfo, Lockstep, Sandbox } from '../../src/index.js';
import { parentOf } from '../../src/checkpoints/page-delta.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { hostPath } from '../fixtures/stub-workloads.js';
import { projectRoot } from '../../src/native/binding.js';

const MIB = 32;
const STEPS = 6;
const DIR = '/tmp/ml';

/** memload, linked statically so that it runs in any image. */
function buildMemload(): string {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'memload-')), 'memload');
  execFileSync('cc', ['-O2', '-static', '-o', out, path.join(projectRoot, 'native/criu/test/memload.c')]);
  return out;
}

integration(test, () => {
  let ls: Lockstep;
  let memload: Buffer;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    memload = fs.readFileSync(buildMemload());
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  /** Host pid of the sandbox's memload main process (the one whose parent is not memload). */
  function memloadPid(sb: Sandbox): number {
    const e = ls.engine;
    const row = e.catalog.requireSandbox(sb.id);
    const pids = e.cgroups.pids(e.runtime.cgroupName(row.instance));
    const isMemload = (p: number) => {
      try {
        return fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('/usr/local/bin/memload');
      } catch {
        return false;
      }
    };
    const ppid = (p: number) => {
      const stat = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
      return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    };
    const main = pids.find((p) => isMemload(p) && !isMemload(ppid(p)));
    if (!main) throw new Error(`no memload in ${sb.id}`);
    return main;
  }

  const sums = (sb: Sandbox, name: string) => {
    const f = hostPath(ls, sb.id, `${DIR}/${name}`);
    return fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : undefined;
  };

  /** The hashes memload wrote for step k: its main process's, and its child's once it has one. */
  async function stepSums(sb: Sandbox, k: number): Promise<Record<string, string>> {
    const written = (name: string) => eventually(() => sums(sb, name), 60_000, 5) as Promise<string>;
    const main = await written(`step-${k}-main.sums`);
    return k >= 2 ? { main, child: await written(`step-${k}-child.sums`) } : { main };
  }

  /** What the processes hold now: memload asked (again every 2 s) to hash its memory afresh. */
  async function verifySums(sb: Sandbox, roles: string[]): Promise<Record<string, string>> {
    for (const r of roles) fs.rmSync(hostPath(ls, sb.id, `${DIR}/verify-${r}.sums`), { force: true });
    let asked = 0;
    const out: Record<string, string> = {};
    await eventually(
      () => {
        if (Date.now() - asked > 2000) {
          process.kill(memloadPid(sb), 'SIGUSR2');
          asked = Date.now();
        }
        for (const r of roles) {
          const s = sums(sb, `verify-${r}.sums`);
          if (s === undefined) return false;
          out[r] = s;
        }
        return true;
      },
      60_000,
      5,
    );
    return out;
  }

  async function memloadSandbox(t: ExecutionContext): Promise<Sandbox> {
    const sb = await ls.create({ image: 'base', memoryMb: 512 });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    t.not(ls.engine.catalog.requireSandbox(sb.id).id_base, null, 'the sandbox has a user namespace');
    await sb.files.write('/usr/local/bin/memload', memload, { mode: 0o755 });
    await sb.commands.run(`mkdir -p ${DIR}`);
    await sb.commands.spawn(['/usr/local/bin/memload', DIR, String(MIB), 'mixed']);
    return sb;
  }

  /** One step of memload's mixed workload; resolves with what it holds after it. */
  async function step(sb: Sandbox, k: number): Promise<Record<string, string>> {
    process.kill(memloadPid(sb), 'SIGUSR1');
    return stepSums(sb, k);
  }

  test.serial(
    'every checkpoint of a tracked chain restores every byte, by rollback in any order and by fork',
    async (t) => {
      t.true(ls.engine.criu.tracksWrites, "checkpoints dump with Lockstep's CRIU build and its keeper");
      const sb = await memloadSandbox(t);
      const chain: { ckpt: CheckpointInfo; held: Record<string, string> }[] = [];
      let held = await stepSums(sb, 0);
      for (let k = 0; ; k++) {
        const ckpt = await sb.checkpoint({ label: `step ${k}` });
        chain.push({ ckpt, held });
        if (k === STEPS) break;
        held = await step(sb, k + 1);
      }

      // The tracker's savings, as stored: the first dump is whole, the child forked at step 2 is
      // new to the keeper (dumped whole once), and the others hold what was written since.
      const bytes = chain.map((c) => c.ckpt.sizes.processImageBytes);
      const whole = bytes[0]!;
      t.true(whole > MIB << 20, `the first checkpoint holds the memory: ${whole} bytes`);
      for (const k of [1, 4, 5, 6])
        t.true(bytes[k]! < whole / 4, `checkpoint ${k} stores what changed: ${bytes[k]} of ${whole} bytes`);
      for (const k of [1, 4, 5, 6])
        t.is(
          parentOf(ls.engine.paths.processImage(chain[k]!.ckpt.id)),
          chain[k - 1]!.ckpt.id,
          `checkpoint ${k} links to ${k - 1}`,
        );

      // Every checkpoint, out of order: the standby (the newest) and CRIU restores of the others.
      const order = [STEPS, 1, 4, 0, 3, 6, 2, 5];
      for (const k of order) {
        const { ckpt, held: want } = chain[k]!;
        await sb.rollback(ckpt.id);
        t.deepEqual(await verifySums(sb, Object.keys(want)), want, `memory after the rollback to checkpoint ${k}`);
      }

      // A fork restores the chain into a sandbox of its own.
      const [forked] = await sb.fork(chain[4]!.ckpt.id);
      if (!forked?.ok) return t.fail(`the fork failed: ${JSON.stringify(forked)}`);
      t.teardown(() => ls.remove(forked.id).catch(() => undefined));
      const fork = ls.get(forked.id);
      t.deepEqual(await verifySums(fork, ['main', 'child']), chain[4]!.held, 'memory of the fork of checkpoint 4');

      // From a restored tree the chain goes on: the restore armed the tracking in the restored
      // processes (tagged with the checkpoint they came from), so the first dump after it is
      // already incremental, and both restore exactly.
      await sb.rollback(chain[3]!.ckpt.id);
      const after: { ckpt: CheckpointInfo; held: Record<string, string> }[] = [];
      for (let k = 4; k <= 5; k++) {
        const now = await step(sb, k);
        after.push({ ckpt: await sb.checkpoint(), held: now });
      }
      for (const [i, a] of after.entries())
        t.true(
          a.ckpt.sizes.processImageBytes < whole / 4,
          `checkpoint ${i + 1} after the rollback stores what changed: ${a.ckpt.sizes.processImageBytes} of ${whole} bytes`,
        );
      t.is(
        parentOf(ls.engine.paths.processImage(after[0]!.ckpt.id)),
        chain[3]!.ckpt.id,
        'linked to the checkpoint restored',
      );
      for (const { ckpt, held: want } of [after[0]!, after[1]!].reverse()) {
        await sb.rollback(ckpt.id);
        t.deepEqual(await verifySums(sb, Object.keys(want)), want, `memory after the rollback to ${ckpt.id}`);
      }

      // Deleting a checkpoint in the middle of the chain: its child absorbs the pages it took from it.
      await sb.settled();
      await sb.deleteCheckpoint(chain[5]!.ckpt.id);
      t.is(parentOf(ls.engine.paths.processImage(chain[6]!.ckpt.id)), chain[4]!.ckpt.id, 'relinked to the grandparent');
      await sb.rollback(chain[6]!.ckpt.id);
      t.deepEqual(await verifySums(sb, ['main', 'child']), chain[6]!.held, 'memory after its parent was deleted');
    },
  );

  test.serial('a keeper that died costs one whole dump, not a byte', async (t) => {
    const sb = await memloadSandbox(t);
    await stepSums(sb, 0);
    await sb.checkpoint();
    await step(sb, 1);
    await step(sb, 2); // memload forks its child here: from now on the tree is two processes
    await sb.checkpoint();
    const held = await step(sb, 3);
    const keeperPid = Number(
      execFileSync('pgrep', ['-f', `wp-keeper ${ls.engine.paths.wpKeeperSocket}`])
        .toString()
        .trim(),
    );
    process.kill(keeperPid, 'SIGKILL');
    const whole = await sb.checkpoint();
    t.true(
      whole.sizes.processImageBytes > MIB << 20,
      'the processes were dumped whole: the new keeper knew none of them',
    );
    const next = await step(sb, 4);
    const tracked = await sb.checkpoint();
    t.true(tracked.sizes.processImageBytes < whole.sizes.processImageBytes / 4, 'tracked again from the whole dump on');
    await sb.rollback(whole.id);
    t.deepEqual(await verifySums(sb, ['main', 'child']), held, 'the whole dump restores exactly');
    await sb.rollback(tracked.id);
    t.deepEqual(await verifySums(sb, ['main', 'child']), next, 'the one after it too');
  });
});
