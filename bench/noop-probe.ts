/**
 * `node dist/bench/noop-probe.js [--rounds N]`: could a checkpoint that would
 * change nothing be skipped soundly? (issue 11, lever "skip checkpoints that
 * would change nothing"; the answer and these figures: docs/decisions/no-change-checkpoints.md,
 * "Skipping no-change checkpoints: not shipped".)
 *
 * The cheap tests a skip would rest on, measured on real sandboxes:
 * - files: the writable layer's btrfs subvolume ctransid (moves with any
 *   change in it), across an idle second, a read-only command, a checkpoint;
 * - memory, without soft-dirty: the only cheap proof that no page changed
 *   is that no task of the tree ran at all, i.e. the cgroup's CPU usage did
 *   not move between the moment the last image was taken (tree frozen) and
 *   the freeze of the next checkpoint.
 * Trees: `sleep` alone (as idle as a tree gets), a shell loop waking every
 * second, and a python3 blocked in `input()` (an idle REPL).
 */
import fs from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { Lockstep, type Sandbox } from '../src/index.js';

const { values: args } = parseArgs({ options: { rounds: { type: 'string', default: '10' } } });
const ROUNDS = Number(args.rounds);

async function main(): Promise<void> {
  const load = os.loadavg();
  const home = fs.mkdtempSync('/var/tmp/lockstep-noop-');
  // The usage as the image was taken: read at the dump's fault point, the tree still frozen.
  let atImage: (() => void) | undefined;
  const ls = await Lockstep.open({
    home,
    config: { standby: false },
    fault: (p) => {
      if (p === 'checkpoint:dumped') atImage?.();
    },
  });
  const out: Record<string, unknown> = { loadAtStart: load };
  try {
    await ls.images.ensure('dev');
    const e = ls.engine;
    const trees: [string, string[]][] = [
      ['sleep', ['sleep', '100000']],
      ['shell loop (sleep 1)', ['sh', '-c', 'while :; do sleep 1; done']],
      [
        'python3 blocked in input()',
        ['sh', '-c', 'mkfifo /tmp/in; python3 -c "input()" < /tmp/in & exec 3>/tmp/in; wait'],
      ],
    ];
    for (const [name, argv] of trees) {
      const sb: Sandbox = await ls.create({ image: 'dev' });
      await sb.commands.spawn(argv);
      await new Promise((r) => setTimeout(r, 1500));
      const row = () => e.catalog.sandbox(sb.id)!;
      const cg = () => e.runtime.cgroupName(row().instance);
      const gen = () => e.native.subvolumeInfo(e.paths.upper(row().instance)).ctransid;
      /** CPU usage of the tree as it is frozen (what a skip would compare). */
      const frozenUsage = async () => {
        await e.cgroups.freeze(cg());
        const u = e.cgroups.cpuUsageUsec(cg());
        e.cgroups.thaw(cg());
        return u;
      };
      let uImage = -1;
      atImage = () => (uImage = e.cgroups.cpuUsageUsec(cg()));
      const r = {
        cpuUnchangedSinceImage: 0,
        cpuUnchangedIdle: 0,
        cpuUnchangedAfterCheckpoint: 0,
        filesUnchangedIdle: 0,
        filesUnchangedRead: 0,
        filesUnchangedCheckpoint: 0,
        rounds: ROUNDS,
      };
      for (let i = 0; i < ROUNDS; i++) {
        // Idle second, no checkpoint: freeze, read, thaw, wait, freeze, read.
        const g0 = gen();
        const u0 = await frozenUsage();
        await new Promise((res) => setTimeout(res, 1000));
        const u1 = await frozenUsage();
        if (u1 === u0) r.cpuUnchangedIdle++;
        if (gen() === g0) r.filesUnchangedIdle++;
        // A read-only tool call.
        const g1 = gen();
        await sb.commands.run(['cat', '/etc/os-release']);
        if (gen() === g1) r.filesUnchangedRead++;
        // A checkpoint, then an idle second: did the tree run after the image was taken?
        const g2 = gen();
        await sb.checkpoint();
        await sb.settled();
        if (gen() === g2) r.filesUnchangedCheckpoint++;
        const u2 = await frozenUsage(); // right after: the dump's own wake-ups are in it
        if (u2 === uImage) r.cpuUnchangedSinceImage++;
        await new Promise((res) => setTimeout(res, 1000));
        const u3 = await frozenUsage();
        if (u3 === u2) r.cpuUnchangedAfterCheckpoint++;
      }
      out[name] = r;
      process.stdout.write(`${name}: ${JSON.stringify(r)}\n`);
      await ls.remove(sb.id);
    }
    out.loadAtEnd = os.loadavg();
    process.stdout.write(JSON.stringify(out) + '\n');
  } finally {
    await ls.destroyAll({ deleteFiles: true }).catch(() => undefined);
    await ls.close();
    fs.rmSync(home, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${(e as Error).stack}\n`);
    process.exit(1);
  },
);
