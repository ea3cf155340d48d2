/**
 * Recovery correctness (issue 15): N randomized agent trajectories of 10-30 tool calls
 * (writes, reads, deletes, commands, verdicts, effects), a checkpoint with a context after
 * each, a failure injected at a random step followed by a rollback to a random earlier
 * checkpoint, the rest of the steps on the new timeline, and a final rollback to a random
 * checkpoint of any timeline. Each report is checked part by part against the model the
 * property test uses (test/fixtures/recovery-model.ts). Reports the share of trials in which
 * every part of every report was exactly right, and the mistakes by kind.
 *
 * Run: node dist/bench/recovery.js [--trials N] [--seed S] [--min-steps A] [--max-steps B] [--concurrency C]
 * Writes bench/results/recovery.json; progress goes to stderr. Trials run C at a time (default 2),
 * each in its own sandbox of one manager (the trajectories never reopen it).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import fc from 'fast-check';
import { Lockstep } from '../src/index.js';
import {
  MISTAKE_KINDS,
  REPORT_MISTAKES,
  describeOp,
  runAgainstModel,
  trajectoryArb,
  type Mismatch,
} from '../test/fixtures/recovery-model.js';

const { values } = parseArgs({
  options: {
    trials: { type: 'string' },
    seed: { type: 'string' },
    'min-steps': { type: 'string' },
    'max-steps': { type: 'string' },
    concurrency: { type: 'string' },
    home: { type: 'string' },
  },
});
const trials = positive('trials', values.trials ?? '200');
const seed = Number(values.seed ?? 15);
if (!Number.isInteger(seed)) throw new Error(`--seed: expected an integer, got ${values.seed}`);
const minSteps = positive('min-steps', values['min-steps'] ?? '10');
const maxSteps = positive('max-steps', values['max-steps'] ?? '30');
if (maxSteps < minSteps) throw new Error(`--max-steps (${maxSteps}) must be at least --min-steps (${minSteps})`);
const concurrency = positive('concurrency', values.concurrency ?? '2');
const home = values.home ?? fs.mkdtempSync('/var/tmp/lockstep-bench-recovery-');
const projectRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

function positive(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name}: expected a positive integer, got ${v}`);
  return n;
}

interface TrialResult {
  trial: number;
  steps: number;
  /** Every part of every report (and every replay) was right, and the run did not crash. */
  ok: boolean;
  /** Every operation's own result was right too (a command's output, a write's hash, ...). */
  allOperationsRight: boolean;
  ms: number;
  mismatches: Mismatch[];
  /** The failing trial's operations, to replay it. */
  ops?: string[];
}

async function main(): Promise<void> {
  const started = Date.now();
  const ls = await Lockstep.open({ home });
  const cleanup = async () => {
    await ls.close().catch(() => undefined);
    const last = await Lockstep.open({ home });
    await last.destroyAll({ deleteFiles: true });
  };
  let stopping = false;
  const onSignal = () => {
    if (stopping) process.exit(130);
    stopping = true;
    process.stderr.write('\nstopping after this trial (again to exit at once)\n');
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const results: TrialResult[] = [];
  try {
    await ls.images.ensure('base');
    const samples = fc.sample(trajectoryArb(minSteps, maxSteps), { seed, numRuns: trials });
    let next = 0;
    const worker = async () => {
      while (next < samples.length && !stopping) {
        const i = next++;
        const ops = samples[i]!;
        const t0 = performance.now();
        const r = await runAgainstModel(ls, ops, { reopen: () => Lockstep.open({ home }) });
        for (const id of r.sandboxIds.reverse()) await ls.remove(id).catch(() => undefined);
        const steps = ops.filter((o) => o.t !== 'checkpoint' && o.t !== 'rollback').length;
        const ok = !r.mismatches.some((m) => REPORT_MISTAKES.includes(m.kind));
        const clean = r.mismatches.length === 0;
        results.push({
          trial: i,
          steps,
          ok,
          allOperationsRight: clean,
          ms: performance.now() - t0,
          mismatches: r.mismatches,
          ...(clean ? {} : { ops: ops.map(describeOp) }),
        });
        const right = results.filter((x) => x.ok).length;
        process.stderr.write(
          `\rtrial ${results.length}/${samples.length}: ${right} right, ${results.length - right} wrong, ${((Date.now() - started) / 1000).toFixed(0)} s   `,
        );
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, samples.length) }, worker));
    results.sort((a, b) => a.trial - b.trial);
    process.stderr.write('\n');
  } finally {
    await cleanup();
  }

  const right = results.filter((r) => r.ok).length;
  const byKind = Object.fromEntries(
    MISTAKE_KINDS.map((k) => [k, results.filter((r) => r.mismatches.some((m) => m.kind === k)).length]),
  );
  const report = {
    date: new Date().toISOString(),
    host: { cpus: os.cpus().length, loadavg: os.loadavg(), kernel: os.release(), node: process.version },
    seed,
    trials: results.length,
    concurrency,
    standby: process.env.LOCKSTEP_STANDBY === 'off' ? 'off' : 'on',
    steps: { min: minSteps, max: maxSteps },
    reportsAllRight: right,
    shareReportsAllRight: results.length === 0 ? 0 : right / results.length,
    everythingRight: results.filter((r) => r.allOperationsRight).length,
    trialsWithMistake: byKind,
    seconds: (Date.now() - started) / 1000,
    medianTrialMs: median(results.map((r) => r.ms)),
    failures: results.filter((r) => r.mismatches.length > 0),
  };
  const dir = path.join(projectRoot, 'bench', 'results');
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'recovery.json'), `${JSON.stringify(report, null, 2)}\n`);

  const lines = [
    `Recovery correctness: ${results.length} trajectories of ${minSteps}-${maxSteps} steps, seed ${seed}, ${concurrency} at a time, warm standby ${report.standby}`,
    '',
    '| | trials |',
    '|---|---|',
    `| every part of every report right | ${right} (${(100 * report.shareReportsAllRight).toFixed(1)}%) |`,
    `| ... and every operation's own result too | ${report.everythingRight} |`,
    ...Object.entries(byKind).map(([k, n]) => `| with a mistake in ${k} | ${n} |`),
    '',
    `${report.seconds.toFixed(0)} s in all, median ${(report.medianTrialMs / 1000).toFixed(1)} s per trial; wrote bench/results/recovery.json`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  if (stopping) process.exitCode = 130;
}

function median(xs: number[]): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
