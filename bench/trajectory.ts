/**
 * `npm run bench:trajectory`: what state management costs a software-
 * engineering agent run (issue 11, target t), on the `dev` image:
 * - a git repository made inside the sandbox (generated: FILES files,
 *   REPO_MB MiB of hex text, one commit), and a python3 process holding
 *   PY_MIB MiB of state, 1 MiB of which a "test" tool call rewrites;
 * - linear: STEPS steps cycling edit / test / read tool calls, a checkpoint
 *   after every step, and ROLLBACKS rollbacks (every STEPS/ROLLBACKS steps,
 *   alternately to the checkpoint just taken and to the one two steps back);
 * - tree search: EXPANSIONS expansions (step + checkpoint), with a rollback
 *   to a random earlier node before every other one (49 of 100, as DeltaBox).
 * After each rollback the python process's counter is checked against the
 * value it had at that checkpoint (the bench fails on a mismatch).
 *
 * State-management time = the wall clock of checkpoint() and rollback()
 * calls, plus whatever background work (durability, warm standby) is still
 * running when the modelled inference of the next step would have ended:
 * inference is modelled, added arithmetically (1 s and 5 s per step), never
 * slept. Its share = state / (state + tool calls + steps × inference).
 *
 *   node dist/bench/trajectory.js [--quick] [--tracking on|off] [--page-delta on|off] [--standby on|off]
 *                                 [--durable-later on|off] [--userns on|off]
 *                                 [--standby-after-checkpoint on|off|auto] [--out FILE]
 * (the switches set the manager's settings of those names, for A/B runs; a
 * switch not given leaves the manager's own setting)
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Lockstep, type Sandbox } from '../src/index.js';
import { numericFields, summarize, summarizePhases, type Summary } from './stats.js';
import { withSettings } from './workloads.js';
import { writeReportHtml } from './report-html.js';

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    // Written-page tracking (Lockstep's CRIU build) is the default; page-delta compares pages after a whole dump.
    tracking: { type: 'string', default: 'on' },
    'page-delta': { type: 'string', default: 'off' },
    standby: { type: 'string', default: 'on' },
    'standby-after-checkpoint': { type: 'string' },
    'durable-later': { type: 'string', default: 'on' },
    userns: { type: 'string', default: 'on' },
    out: { type: 'string' },
  },
});
const QUICK = args.quick;
const SIZE = QUICK
  ? { files: 600, repoMb: 12, pyMib: 48, steps: 12, rollbacks: 2, expansions: 20, treeRollbacks: 9 }
  : { files: 5000, repoMb: 110, pyMib: 200, steps: 60, rollbacks: 10, expansions: 100, treeRollbacks: 49 };
const INFERENCE_S = [1, 5];

const PY_STATE = `
import os, sys, time
n = int(sys.argv[1]) << 20
state = bytearray(n)
for i in range(0, n, 4096):
    state[i] = 1
count, off = 0, 0
while True:
    if os.path.exists('/tmp/py-cmd'):
        cmd = open('/tmp/py-cmd').read().strip()
        if cmd == 'work':
            for i in range(off, off + (1 << 20), 4096):
                state[i % n] = (state[i % n] + 1) % 256
            off = (off + (1 << 20)) % n
            count += 1
        with open('/tmp/py-out.tmp', 'w') as f:
            f.write(str(count))
        os.rename('/tmp/py-out.tmp', '/tmp/py-out')
        os.remove('/tmp/py-cmd')
    time.sleep(0.02)
`;

const MAKE_REPO = `
import os, sys, subprocess
files, total = int(sys.argv[1]), int(sys.argv[2]) << 20
root = '/workspace/repo'
per = total // files
for i in range(files):
    d = os.path.join(root, 'pkg%03d' % (i // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'mod%05d.py' % i), 'w') as f:
        f.write('# module %d\\n' % i)
        f.write(os.urandom(per // 2).hex())
        f.write('\\n')
g = ['git', '-c', 'user.email=bench@lockstep.test', '-c', 'user.name=bench', '-C', root]
subprocess.run(['git', 'init', '-q', root], check=True)
subprocess.run(g + ['add', '-A'], check=True)
subprocess.run(g + ['commit', '-qm', 'generated'], check=True)
out = subprocess.run(['du', '-sb', root], capture_output=True, text=True, check=True).stdout.split()[0]
print(files, out)
`;

/** Asks the python process to do something ('work' or 'report') and returns its counter. */
async function py(sb: Sandbox, cmd: 'work' | 'report'): Promise<number> {
  const r = await sb.commands.run(
    [
      'sh',
      '-c',
      `echo ${cmd} > /tmp/py-cmd; i=0; while [ -e /tmp/py-cmd ]; do sleep 0.02; i=$((i+1)); [ $i -gt 1500 ] && exit 3; done; cat /tmp/py-out`,
    ],
    { timeoutMs: 60_000 },
  );
  if (r.exitCode !== 0) throw new Error(`python state process did not answer ${cmd}: ${r.stderr}`);
  return Number(r.stdout.trim());
}

/** One tool call of the agent, by kind; returns nothing, the time is measured outside. */
async function toolCall(sb: Sandbox, step: number): Promise<void> {
  const i = (step * 37) % SIZE.files;
  const mod = `/workspace/repo/pkg${String(Math.floor(i / 100)).padStart(3, '0')}/mod${String(i).padStart(5, '0')}.py`;
  switch (step % 3) {
    case 0: // edit: append to a module and write a new file
      await sb.commands.run(['sh', '-c', `printf '# edited at step ${step}\\n' >> ${mod}`]);
      await sb.files.write(`/workspace/repo/notes/step-${step}.md`, `step ${step}\n`.repeat(200));
      break;
    case 1: // test: the python process rewrites 1 MiB of its state; git sees the diff
      await py(sb, 'work');
      await sb.commands.run(['sh', '-c', 'cd /workspace/repo && git diff --stat | tail -1']);
      break;
    default: // read
      await sb.commands.run(['sh', '-c', `cd /workspace/repo && git status --short | head -5 && wc -c ${mod}`]);
      await sb.files.read(mod);
  }
}

interface Phase {
  steps: number;
  checkpointMs: number[];
  /** The library's own phase timings of each checkpoint (dump, delta, snapshot, commit...). */
  checkpointPhases: Record<string, number>[];
  rollbackMs: number[];
  rollbackPaths: Record<string, number>;
  toolMs: number[];
  /** Background work after each checkpoint or rollback until the sandbox settled (durability, standby). */
  backgroundMs: number[];
  toDurableMs: number[];
  peakMemoryBytes: number;
  peakStandbyBytes: number;
  storeBytesBefore: number;
  storeBytesAfter: number;
  wallMs: number;
}

function storeUsedBytes(ls: Lockstep): number {
  const s = fs.statfsSync(ls.engine.paths.store);
  return (s.blocks - s.bfree) * s.bsize;
}

function memoryNow(ls: Lockstep, sandboxId: string): { total: number; standby: number } {
  const { catalog, cgroups, runtime } = ls.engine;
  const row = catalog.sandbox(sandboxId)!;
  const own = cgroups.memoryBytes(runtime.cgroupName(row.instance));
  const key = catalog.standby(sandboxId)?.instance;
  const standby = key ? cgroups.memoryBytes(runtime.cgroupName(key)) : 0;
  return { total: own + standby, standby };
}

function newPhase(ls: Lockstep): Phase {
  return {
    steps: 0,
    checkpointMs: [],
    checkpointPhases: [],
    rollbackMs: [],
    rollbackPaths: {},
    toolMs: [],
    backgroundMs: [],
    toDurableMs: [],
    peakMemoryBytes: 0,
    peakStandbyBytes: 0,
    storeBytesBefore: storeUsedBytes(ls),
    storeBytesAfter: 0,
    wallMs: 0,
  };
}

/** The sandbox settles (untimed for the call, kept as background time), then memory is sampled. */
async function settleAndSample(ls: Lockstep, sb: Sandbox, p: Phase, ckptId?: string): Promise<void> {
  const t = performance.now();
  await sb.settled();
  p.backgroundMs.push(performance.now() - t);
  if (ckptId) {
    const timings = JSON.parse(ls.engine.catalog.checkpoint(ckptId)!.timings) as { toDurableMs?: number };
    if (timings.toDurableMs !== undefined) p.toDurableMs.push(timings.toDurableMs);
  }
  const m = memoryNow(ls, sb.id);
  p.peakMemoryBytes = Math.max(p.peakMemoryBytes, m.total);
  p.peakStandbyBytes = Math.max(p.peakStandbyBytes, m.standby);
}

async function step(ls: Lockstep, sb: Sandbox, p: Phase, n: number, counters: Map<string, number>): Promise<string> {
  const t0 = performance.now();
  await toolCall(sb, n);
  p.toolMs.push(performance.now() - t0);
  const t1 = performance.now();
  const info = await sb.checkpoint({ label: `step ${n}` });
  p.checkpointMs.push(performance.now() - t1);
  p.checkpointPhases.push(numericFields(info.timings));
  p.steps++;
  await settleAndSample(ls, sb, p, info.id);
  counters.set(info.id, await py(sb, 'report')); // untimed: what the checkpoint holds
  return info.id;
}

async function rollback(ls: Lockstep, sb: Sandbox, p: Phase, target: string, counters: Map<string, number>) {
  const t = performance.now();
  const r = await sb.rollback(target);
  p.rollbackMs.push(performance.now() - t);
  p.rollbackPaths[r.path] = (p.rollbackPaths[r.path] ?? 0) + 1;
  const got = await py(sb, 'report');
  if (got !== counters.get(target))
    throw new Error(`after a rollback to ${target} python's counter is ${got}, it was ${counters.get(target)}`);
  await settleAndSample(ls, sb, p);
}

async function linear(ls: Lockstep, sb: Sandbox, counters: Map<string, number>): Promise<Phase> {
  const p = newPhase(ls);
  const t0 = performance.now();
  const ids: string[] = [];
  const every = Math.floor(SIZE.steps / SIZE.rollbacks);
  let k = 0;
  for (let s = 1; s <= SIZE.steps; s++) {
    progress(`linear step ${s}/${SIZE.steps}`);
    ids.push(await step(ls, sb, p, s, counters));
    if (s % every === 0 && k < SIZE.rollbacks) {
      // Alternately: undo the last step's effects on the sandbox (the checkpoint just taken: the standby)
      // and abandon the last two steps (an older checkpoint: a CRIU restore).
      const target = k % 2 === 0 ? ids.at(-1)! : ids.at(-3)!;
      await rollback(ls, sb, p, target, counters);
      k++;
    }
  }
  p.wallMs = performance.now() - t0;
  p.storeBytesAfter = storeUsedBytes(ls);
  return p;
}

async function treeSearch(ls: Lockstep, sb: Sandbox, counters: Map<string, number>, root: string): Promise<Phase> {
  const p = newPhase(ls);
  const t0 = performance.now();
  const nodes = [root];
  let seed = 11;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  let rollbacks = 0;
  for (let i = 0; i < SIZE.expansions; i++) {
    progress(`tree expansion ${i + 1}/${SIZE.expansions}`);
    if (i % 2 === 1 && rollbacks < SIZE.treeRollbacks) {
      // Expand another node than the one just made: go back to it first.
      const target = nodes[Math.floor(rand() * (nodes.length - 1))]!;
      await rollback(ls, sb, p, target, counters);
      rollbacks++;
    }
    nodes.push(await step(ls, sb, p, 100 + i, counters));
  }
  p.wallMs = performance.now() - t0;
  p.storeBytesAfter = storeUsedBytes(ls);
  return p;
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

function report(p: Phase) {
  const callMs = sum(p.checkpointMs) + sum(p.rollbackMs);
  const toolMs = sum(p.toolMs);
  const byInference = Object.fromEntries(
    INFERENCE_S.map((s) => {
      const inferenceMs = s * 1000;
      // Background work longer than the inference it overlaps delays the next step.
      const spill = sum(p.backgroundMs.map((b) => Math.max(0, b - inferenceMs)));
      const stateMs = callMs + spill;
      const trajectoryMs = stateMs + toolMs + p.steps * inferenceMs;
      return [
        `${s}s`,
        {
          stateMs,
          backgroundSpillMs: spill,
          trajectoryMs,
          share: stateMs / trajectoryMs,
          target: s === 1 ? 0.05 : 0.02,
        },
      ];
    }),
  );
  const s = (xs: number[]): Summary => summarize(xs);
  return {
    steps: p.steps,
    rollbacks: p.rollbackMs.length,
    rollbackPaths: p.rollbackPaths,
    stateCallsMs: callMs,
    toolCallsMs: toolMs,
    byInference,
    checkpointMs: s(p.checkpointMs),
    checkpointPhasesP50: Object.fromEntries(
      Object.entries(summarizePhases(p.checkpointPhases)).map(([k, v]) => [k, v.p50]),
    ),
    rollbackMs: s(p.rollbackMs),
    backgroundMs: s(p.backgroundMs),
    toDurableMs: s(p.toDurableMs),
    diskBytesUsed: p.storeBytesAfter - p.storeBytesBefore,
    peakMemoryBytes: p.peakMemoryBytes,
    peakStandbyBytes: p.peakStandbyBytes,
    wallMs: p.wallMs,
  };
}

function progress(what: string): void {
  process.stderr.write(`[trajectory] ${what}\n`);
}

async function main(): Promise<void> {
  const loadAtStart = os.loadavg();
  fs.mkdirSync('/var/tmp', { recursive: true });
  const home = fs.mkdtempSync('/var/tmp/lockstep-trajectory-');
  const ls = await Lockstep.open({ home, userNamespaces: args.userns !== 'off' });
  try {
    await ls.images.ensure('dev', (m) => progress(m));
    const settings = {
      ...(args.tracking === 'off' ? { wpKeeper: null } : {}),
      pageDelta: args['page-delta'] === 'on',
      standby: args.standby !== 'off',
      // Not given: the manager's own setting (LOCKSTEP_STANDBY_AFTER_CHECKPOINT or its default).
      standbyAfterCheckpoint:
        args['standby-after-checkpoint'] === undefined
          ? ls.engine.config.standbyAfterCheckpoint
          : args['standby-after-checkpoint'] === 'auto'
            ? ('auto' as const)
            : args['standby-after-checkpoint'] !== 'off',
      durableLater: args['durable-later'] !== 'off',
      userNamespaces: args.userns !== 'off',
    };
    return await withSettings(ls, settings, async () => {
      const sb = await ls.create({ image: 'dev', memoryMb: SIZE.pyMib + 1024 });
      progress(`generating the repository: ${SIZE.files} files, ${SIZE.repoMb} MiB`);
      const tr = performance.now();
      const made = await sb.commands.run(['python3', '-c', MAKE_REPO, String(SIZE.files), String(SIZE.repoMb)], {
        timeoutMs: 1_800_000,
      });
      if (made.exitCode !== 0) throw new Error(`repository generation failed: ${made.stderr}`);
      const [files, bytes] = made.stdout.trim().split(' ').map(Number);
      const repoMs = performance.now() - tr;
      await sb.commands.spawn(['python3', '-c', PY_STATE, String(SIZE.pyMib)]);
      await py(sb, 'report');
      const pyPid = (await sb.commands.run(['sh', '-c', 'pgrep -f "^python3 -c" | head -1'])).stdout.trim();
      const pyRss = (await sb.commands.run(['sh', '-c', `grep VmRSS /proc/${pyPid}/status`])).stdout.trim();
      const counters = new Map<string, number>();
      const root = await sb.checkpoint({ label: 'start' });
      await sb.settled();
      counters.set(root.id, await py(sb, 'report'));
      const lin = linear(ls, sb, counters);
      const linearResult = report(await lin);
      await ls.get(sb.id).rollback(root.id); // the tree starts at the same state
      await sb.settled();
      const treeResult = report(await treeSearch(ls, sb, counters, root.id));
      const out = {
        startedAt: new Date().toISOString(),
        quick: QUICK,
        settings,
        host: { cpus: os.cpus().length, loadAtStart, loadAtEnd: os.loadavg(), kernel: os.release() },
        setup: { repoFiles: files, repoBytes: bytes, repoMs, pythonStateMiB: SIZE.pyMib, pythonRss: pyRss },
        linear: linearResult,
        treeSearch: treeResult,
        totalStoreBytes: storeUsedBytes(ls),
      };
      const file = args.out ?? new URL('../../bench/results/trajectory.json', import.meta.url).pathname;
      fs.mkdirSync(new URL('.', `file://${file}`).pathname, { recursive: true });
      fs.writeFileSync(file, JSON.stringify(out, null, 2) + '\n');
      // The page beside it shows the share per step, and the sweep's curves if a bench run left them.
      if (args.out === undefined) progress(`wrote ${writeReportHtml(path.dirname(file))}`);
      for (const [name, r] of [
        ['linear', linearResult],
        ['tree search', treeResult],
      ] as const)
        process.stdout.write(
          `${name}: ${r.steps} steps, ${r.rollbacks} rollbacks ${JSON.stringify(r.rollbackPaths)}; state calls ${(r.stateCallsMs / 1000).toFixed(1)} s; ` +
            INFERENCE_S.map((s) => {
              const b = r.byInference[`${s}s`]!;
              return `${s} s/step: ${(100 * b.share).toFixed(2)}% (target ≤ ${100 * b.target}%: ${b.share <= b.target ? 'PASS' : 'MISS'})`;
            }).join('; ') +
            `; disk ${(r.diskBytesUsed / 2 ** 20).toFixed(0)} MiB; peak memory ${(r.peakMemoryBytes / 2 ** 20).toFixed(0)} MiB (standby ${(r.peakStandbyBytes / 2 ** 20).toFixed(0)})\n`,
        );
      process.stdout.write(`wrote ${file} (load ${loadAtStart[0]!.toFixed(1)} → ${os.loadavg()[0]!.toFixed(1)})\n`);
    });
  } finally {
    await ls.destroyAll({ deleteFiles: true }).catch(() => undefined);
    await ls.close().catch(() => undefined);
    fs.rmSync(home, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`[trajectory] failed: ${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  },
);
