/**
 * `npm run bench`: aligned checkpoint, rollback and fork, measured against
 * the CRIU command line + `cp -a` and `docker checkpoint create`, in one run
 * on one fresh state directory (removed at the end, also on failure or
 * SIGINT). Prints a markdown table with p50/p95 and PASS/MISS against the
 * issue's targets, and writes bench/results/<ISO date>.json + latest.json.
 *
 *   node dist/bench/run.js [--iterations N] [--quick] [--only a,b,c,d] [--no-docker]
 *
 * Everything runs sequentially so that no workload disturbs another.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { execFileSync } from 'node:child_process';
import { Lockstep } from '../src/index.js';
import { criuBinary } from '../src/host/criu-service.js';
import { projectRoot } from '../src/native/binding.js';
import { summarize } from './stats.js';
import {
  fmtMs,
  fmtRatio,
  measurement,
  Progress,
  renderReport,
  writeResults,
  type BenchResults,
  type CriuLogAttribution,
  type Measurement,
  type TargetResult,
} from './report.js';
import {
  criuDumpAttribution,
  measureCheckpointRollback,
  measureForks,
  measureWorkspaceCheckpoints,
  prepareWorkspaces,
  requirePythonRss,
  startIdleShell,
  startPython64,
  upperBytes,
  type BenchContext,
  type ForkFanOut,
} from './workloads.js';
import {
  DOCKER_WORKLOADS,
  DockerPeer,
  killChildren,
  measureCopyPeers,
  measureCriuCliPeer,
  measureDocker,
} from './peers.js';
import { CHANGED_BYTES, measureMemorySweep, SWEEP_SIZES_MIB } from './memory-sweep.js';
import { writeReportHtml } from './report-html.js';

const USAGE = `usage: node dist/bench/run.js [--iterations N] [--quick] [--only a,b,c,d] [--no-docker]
  --iterations N  measured iterations per operation (default 30)
  --quick         5 iterations (a smoke run)
  --only LIST     run only these workloads (a: idle shell, n: idle shell with an egress network, b: 64 MiB python, c: workspace size, d: fork fan-out,
                  e: memory sweep, python3 holding 16-1024 MiB with 1 MiB changed per checkpoint)
  --no-docker     skip the docker checkpoint peer`;

interface Options {
  iterations: number;
  warmup: number;
  quick: boolean;
  only: Set<string>;
  docker: boolean;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      iterations: { type: 'string' },
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      'no-docker': { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  let iterations = values.quick ? 5 : 30;
  if (values.iterations !== undefined) {
    iterations = Number(values.iterations);
    if (!Number.isInteger(iterations) || iterations < 1 || iterations > 10_000)
      throw new Error(`--iterations: expected an integer from 1 to 10000, got ${JSON.stringify(values.iterations)}`);
  }
  const only = new Set(
    (values.only ?? 'a,n,b,c,d,e')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  );
  for (const w of only)
    if (!['a', 'n', 'b', 'c', 'd', 'e'].includes(w))
      throw new Error(`--only: expected letters from a, n, b, c, d, e, got ${JSON.stringify(w)}`);
  return { iterations, warmup: values.quick ? 1 : 2, quick: values.quick, only, docker: !values['no-docker'] };
}

function read(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** "CRIU 4.2.1": the binary Lockstep's service and the CLI peer both run (provisioning may replace it). */
function criuVersion(): string {
  try {
    return `CRIU ${execFileSync(criuBinary(), ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
      .split('\n')[0]!
      .replace(/^Version:\s*/, '')
      .trim()}`;
  } catch {
    return 'CRIU unknown';
  }
}

function hostInfo(criuAtStart: string): Record<string, unknown> {
  const criu = criuVersion();
  return {
    kernel: os.release(),
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model,
    memGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    criu: criu === criuAtStart ? criu : `${criuAtStart} at start, ${criu} at end`,
    // CRIU walks this whole table twice per dump (see the attribution).
    nfConntrackBuckets: Number(read('/proc/sys/net/netfilter/nf_conntrack_buckets') ?? NaN),
    runIsTmpfs: /\s\/run\stmpfs\s/.test(read('/proc/mounts') ?? ''),
  };
}

/** Cleanup steps, run once, last registered first. */
class Cleanup {
  private readonly steps: { what: string; fn: () => Promise<void> | void }[] = [];
  private running: Promise<void> | null = null;
  add(what: string, fn: () => Promise<void> | void): void {
    this.steps.push({ what, fn });
  }
  run(progress: Progress): Promise<void> {
    this.running ??= (async () => {
      for (const s of this.steps.reverse()) {
        try {
          await s.fn();
        } catch (e) {
          progress.note(`cleanup: ${s.what} failed: ${(e as Error).message}`);
        }
      }
    })();
    return this.running;
  }
}

class Aborted extends Error {
  constructor() {
    super('interrupted');
  }
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  const progress = new Progress();
  const cleanup = new Cleanup();
  let aborted = false;

  fs.mkdirSync('/var/tmp', { recursive: true });
  const home = fs.mkdtempSync('/var/tmp/lockstep-bench-');
  // Whatever happens, the state directory goes: through Lockstep when it
  // opened, and by a fresh manager (which reaps) plus rm -rf otherwise.
  cleanup.add(`removing ${home}`, async () => {
    if (!fs.existsSync(home)) return;
    if (fs.existsSync(path.join(home, 'lockstep.db'))) {
      const again = await Lockstep.open({ home });
      await again.destroyAll({ deleteFiles: true });
    }
    fs.rmSync(home, { recursive: true, force: true });
  });
  cleanup.add('killing commands still running', () => killChildren());

  const onSignal = (sig: NodeJS.Signals) => {
    if (aborted) {
      process.stderr.write(`[bench] second ${sig}: exiting without cleanup; state may remain in ${home}\n`);
      process.exit(130);
    }
    aborted = true;
    progress.note(`${sig}: stopping and cleaning up (send it again to exit at once)`);
    killChildren();
    void cleanup.run(progress).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  try {
    return await runBench(opts, home, progress, cleanup, () => aborted);
  } finally {
    progress.note('cleaning up (sandboxes, mounts, Docker objects, state directory)');
    await cleanup.run(progress);
  }
}

async function runBench(
  opts: Options,
  home: string,
  progress: Progress,
  cleanup: Cleanup,
  isAborted: () => boolean,
): Promise<number> {
  const startedAt = new Date();
  const t0 = performance.now();
  const loadAtStart = os.loadavg();
  const criuAtStart = criuVersion();
  progress.note(
    `state directory ${home}; ${opts.iterations} iterations (+${opts.warmup} warm-up) per operation; workloads ${[...opts.only].join(',')}`,
  );
  if (loadAtStart[0]! > 1)
    progress.note(
      `1-min load average is ${loadAtStart[0]!.toFixed(1)}: other work shares the CPUs, so numbers will be slower and noisier than on an idle machine`,
    );
  const ls = await Lockstep.open({ home });
  cleanup.add('Lockstep destroyAll', async () => {
    killChildren(); // a cp or criu still running would keep the store busy
    await ls.destroyAll({ deleteFiles: true });
  });

  const ctx: BenchContext = {
    ls,
    iterations: opts.iterations,
    warmup: opts.warmup,
    progress,
    checkAborted: () => {
      if (isAborted()) throw new Aborted();
    },
  };
  const measurements: Measurement[] = [];
  const criu: Record<string, CriuLogAttribution> = {};
  const notes: string[] = [];
  const diagnostics: BenchResults['diagnostics'] = {};
  let forks: ForkFanOut | undefined;

  await ls.images.ensure('base', (m) => progress.note(m));
  if (opts.only.has('b') || opts.only.has('e')) await ls.images.ensure('dev', (m) => progress.note(m));

  let docker: DockerPeer | { unavailable: string } | undefined;
  if (opts.docker && (opts.only.has('a') || opts.only.has('b'))) {
    docker = await DockerPeer.open(ctx);
    if (docker instanceof DockerPeer) {
      const d = docker;
      cleanup.add('removing Docker containers and images', () => d.cleanup());
    }
  }
  const dockerRows = async (key: 'a' | 'b', label: string) => {
    if (!docker) return;
    if (!(docker instanceof DockerPeer)) {
      measurements.push({
        ...measurement(`${key}.docker.checkpoint`, label, 'Docker', 'checkpoint create', []),
        unavailable: docker.unavailable,
      });
      return;
    }
    measurements.push(...(await measureDocker(ctx, docker, { key, label, ...DOCKER_WORKLOADS[key] })));
  };

  /* (a) idle shell ------------------------------------------------- */
  let idle: Awaited<ReturnType<typeof startIdleShell>> | undefined;
  if (opts.only.has('a') || opts.only.has('d')) {
    progress.note('(a) idle shell sandbox (base image, sleep loop)');
    idle = await startIdleShell(ls);
  }
  if (opts.only.has('a') && idle) {
    const wl = { key: 'a', label: 'a: idle shell' };
    const r = await measureCheckpointRollback(ctx, idle, wl);
    measurements.push(
      r.checkpoint,
      r.checkpointNoStandby,
      r.checkpointToDurable,
      r.checkpointDurableFirst,
      r.rollback,
      r.rollbackCold,
      r.standby,
    );
    notes.push(`(a) rollback paths taken: ${JSON.stringify(r.paths)} (on/off = warm standby setting).`);
    // What every checkpoint/rollback pays before its own work: the CRIU service's version RPC.
    const check: number[] = [];
    for (let i = 0; i < opts.iterations; i++) {
      const t1 = performance.now();
      await ls.engine.criu.ensureRunning();
      check.push(performance.now() - t1);
    }
    diagnostics['criu.ensureRunning'] = summarize(check);
    criu['(a) Lockstep checkpoint, CRIU dump.log at level 4'] = await criuDumpAttribution(ctx, idle);

    const peerSb = await startIdleShell(ls);
    // A peer that cannot run here is reported, not fatal: Lockstep's own rows stand without it.
    try {
      const cli = await measureCriuCliPeer(ctx, peerSb, wl, { freezeCgroupRuns: Math.min(opts.iterations, 5) });
      measurements.push(...cli.measurements);
      if (cli.freezeCgroupDump) measurements.push(cli.freezeCgroupDump);
      criu['(a) criu dump CLI, dump.log at level 4'] = cli.attribution;
    } catch (e) {
      if (e instanceof Aborted) throw e;
      notes.push(`(a) the criu CLI peer failed, so its rows are missing: ${(e as Error).message}`);
    }
    await ls.remove(peerSb.id);
    await dockerRows('a', wl.label);
  }

  /* (n) the idle shell with an egress network ----------------------- */
  if (opts.only.has('n')) {
    // Issue 13: an egress sandbox (veth, nftables policy, resolver) next to (a)'s loopback-only one.
    progress.note('(n) idle shell sandbox with network: egress');
    const sb = await startIdleShell(ls, { network: 'egress' });
    const r = await measureCheckpointRollback(ctx, sb, { key: 'n', label: 'n: idle shell, egress' });
    measurements.push(r.checkpoint, r.rollback, r.rollbackCold);
    notes.push(`(n) rollback paths taken: ${JSON.stringify(r.paths)} (on/off = warm standby setting).`);
    await ls.remove(sb.id);
  }

  /* (d) fork fan-out (the idle shell is the parent) ---------------- */
  if (opts.only.has('d') && idle) {
    forks = await measureForks(ctx, idle);
    measurements.push(...forks.measurements);
    const used = forks.iterationsUsed[16];
    if (used !== undefined && used < opts.iterations)
      notes.push(`(d) N=16 used ${used} iterations (a first iteration took over 3 s).`);
  }
  if (idle) await ls.remove(idle.id);

  /* (b) 64 MiB python ---------------------------------------------- */
  if (opts.only.has('b')) {
    const wl = { key: 'b', label: 'b: python3, 64 MiB RSS' };
    progress.note('(b) dev sandbox with python3 holding 64 MiB');
    const { sb, rssKiB } = await startPython64(ls);
    notes.push(`(b) python3 RSS before measuring: ${(rssKiB / 1024).toFixed(1)} MiB (Lockstep sandbox).`);
    const verify = (when: string) => void requirePythonRss(ls, sb.id, when);
    const r = await measureCheckpointRollback(ctx, sb, wl, verify);
    measurements.push(
      r.checkpoint,
      r.checkpointNoStandby,
      r.checkpointToDurable,
      r.checkpointDurableFirst,
      r.rollback,
      r.rollbackCold,
      r.standby,
    );
    notes.push(`(b) rollback paths taken: ${JSON.stringify(r.paths)} (on/off = warm standby setting).`);
    criu['(b) Lockstep checkpoint, CRIU dump.log at level 4'] = await criuDumpAttribution(ctx, sb);
    await ls.remove(sb.id);

    const peer = await startPython64(ls);
    notes.push(`(b) python3 RSS before measuring: ${(peer.rssKiB / 1024).toFixed(1)} MiB (CLI peer sandbox).`);
    try {
      const cli = await measureCriuCliPeer(ctx, peer.sb, wl, {
        verify: (when) => void requirePythonRss(ls, peer.sb.id, when),
      });
      measurements.push(...cli.measurements);
      criu['(b) criu dump CLI, dump.log at level 4'] = cli.attribution;
    } catch (e) {
      if (e instanceof Aborted) throw e;
      notes.push(`(b) the criu CLI peer failed, so its rows are missing: ${(e as Error).message}`);
    }
    await ls.remove(peer.sb.id);
    await dockerRows('b', wl.label);
  }

  /* (c) workspace size --------------------------------------------- */
  if (opts.only.has('c')) {
    const ws = await prepareWorkspaces(ctx);
    notes.push(
      `(c) writable layers: ${(upperBytes(ls, ws.big.sb.id) / 2 ** 30).toFixed(2)} GiB and ${(upperBytes(ls, ws.small.sb.id) / 2 ** 20).toFixed(2)} MiB of file data.`,
    );
    measurements.push(...(await measureWorkspaceCheckpoints(ctx, ws)));
    measurements.push(...(await measureCopyPeers(ctx, ws)));
    await ls.remove(ws.big.sb.id);
    await ls.remove(ws.small.sb.id);
  }

  /* (e) memory sweep ---------------------------------------------- */
  if (opts.only.has('e')) {
    const sweep = await measureMemorySweep(
      ctx,
      SWEEP_SIZES_MIB,
      path.join(projectRoot, 'bench', 'results', 'sweep-partial.json'),
    );
    measurements.push(...sweep.measurements);
    Object.assign(diagnostics, sweep.bytes);
    notes.push(...sweep.notes);
  }

  const finishedAt = new Date();
  const results: BenchResults = {
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationS: (performance.now() - t0) / 1000,
    host: {
      ...hostInfo(criuAtStart),
      docker: docker instanceof DockerPeer ? docker.version : (docker?.unavailable ?? 'skipped'),
      // Other work on the machine shares its CPUs: a high load makes every number slower and noisier.
      loadAvgStart: loadAtStart.map((x) => Number(x.toFixed(2))),
      loadAvgEnd: os.loadavg().map((x) => Number(x.toFixed(2))),
    },
    options: { iterations: opts.iterations, warmup: opts.warmup, quick: opts.quick, only: [...opts.only] },
    measurements,
    ratios: [],
    targets: [],
    criu,
    notes,
    analysis: [],
    diagnostics,
  };
  evaluate(results, { forks });
  process.stdout.write(`${renderReport(results)}\n`);
  const file = writeResults(path.join(projectRoot, 'bench', 'results'), results);
  const html = writeReportHtml(path.join(projectRoot, 'bench', 'results'));
  progress.note(
    `wrote ${path.relative(process.cwd(), file)}, bench/results/latest.json and ${path.relative(process.cwd(), html)}`,
  );
  return 0;
}

/* ------------------------------------------------------------------ */
/* Targets and what dominates a miss                                    */
/* ------------------------------------------------------------------ */

function evaluate(r: BenchResults, extra: { forks: ForkFanOut | undefined }): void {
  const m = new Map(r.measurements.map((x) => [x.key, x]));
  const p50 = (k: string) => {
    const x = m.get(k);
    return x && !x.unavailable && x.summary.n ? x.summary.p50 : undefined;
  };
  const t = (key: string, target: string, measured: string, pass: boolean | null) =>
    r.targets.push({ key, target, measured, pass });

  // Issue 25's targets for (a): checkpoint ≤ 10 ms and ≥ 25× faster than Docker; rollback ≤ 2 ms
  // through the standby, ≤ 20 ms through a CRIU restore.
  const aCk = p50('a.lockstep.checkpoint');
  if (aCk !== undefined) t('a.lockstep.checkpoint', '≤ 10 ms p50', `${fmtMs(aCk)} ms`, aCk <= 10);
  const aDocker = p50('a.docker.checkpoint');
  if (aCk !== undefined)
    t(
      'a.lockstep.checkpoint:vs-docker',
      '≥ 25× faster than docker checkpoint create',
      aDocker !== undefined ? `${fmtRatio(aDocker / aCk)} faster` : 'no Docker number',
      aDocker !== undefined ? aDocker / aCk >= 25 : null,
    );
  for (const [k, limit, how] of [
    ['a.lockstep.rollback', 2, 'through the standby'],
    ['a.lockstep.rollback:cold', 20, 'through a CRIU restore'],
  ] as const) {
    const v = p50(k);
    if (v !== undefined) t(k, `≤ ${limit} ms p50 ${how}`, `${fmtMs(v)} ms`, v <= limit);
  }
  // Issue 13: an egress sandbox's checkpoint within 3 ms, its standby rollback within 1 ms, of (a)'s.
  for (const [op, slack] of [
    ['checkpoint', 3],
    ['rollback', 1],
  ] as const) {
    const n = p50(`n.lockstep.${op}`);
    const a = p50(`a.lockstep.${op}`);
    if (n !== undefined && a !== undefined)
      t(`n.lockstep.${op}`, `within ${slack} ms of (a)`, `${fmtMs(n - a)} ms more`, n - a <= slack);
  }
  const bL = p50('b.lockstep.checkpoint');
  const bC = p50('b.criu-cli.checkpoint:dump');
  if (bL !== undefined)
    t(
      'b.lockstep.checkpoint',
      '≥ 5× faster than criu dump CLI',
      bC !== undefined ? `${fmtRatio(bC / bL)} faster` : 'no CLI number',
      bC !== undefined ? bC / bL >= 5 : null,
    );

  for (const sys of [
    { key: 'lockstep', system: 'Lockstep' },
    { key: 'cp-btrfs', system: 'cp -a, same btrfs (reflink)' },
    { key: 'cp-ext4', system: 'cp -a, to ext4 (full copy)' },
  ]) {
    const big = p50(`c.${sys.key}.checkpoint-1g`);
    const small = p50(`c.${sys.key}.checkpoint-1m`);
    if (big === undefined || small === undefined) continue;
    const key = `c.${sys.key}.ratio`;
    r.ratios.push({
      key,
      workload: 'c: 1 MiB changed',
      system: sys.system,
      operation: 'ratio 1 GiB / 1 MiB (p50)',
      value: big / small,
      of: [`c.${sys.key}.checkpoint-1g`, `c.${sys.key}.checkpoint-1m`],
    });
    if (sys.key === 'lockstep') t(key, '1 GiB within 1.5× of 1 MiB', fmtRatio(big / small), big / small <= 1.5);
  }
  for (const [n, limit] of [
    [16, 120],
    [64, 450],
  ] as const) {
    const v = p50(`d.lockstep.fork${n}-exec`);
    if (v !== undefined)
      t(`d.lockstep.fork${n}-exec`, `${n} forks answering an exec ≤ ${limit} ms (p50)`, `${fmtMs(v)} ms`, v <= limit);
  }

  for (const mib of SWEEP_SIZES_MIB) {
    const k = `e.${mib}m`;
    const ck = p50(`${k}.lockstep.checkpoint`);
    const budget = 15 + 0.02 * mib;
    if (ck !== undefined)
      t(`${k}.lockstep.checkpoint`, `≤ ${fmtMs(budget)} ms (15 + 0.02/MiB)`, `${fmtMs(ck)} ms`, ck <= budget);
    const stored = r.diagnostics[`${k}.storedBytes`];
    if (stored?.n) {
      const label = `e: python3 holding ${mib} MiB, 1 MiB changed`;
      const key = `${k}.lockstep.stored-ratio`;
      r.ratios.push({
        key,
        workload: label,
        system: 'Lockstep',
        operation: `bytes stored / bytes changed (p50 ${(stored.p50 / 2 ** 20).toFixed(2)} MiB, mean ${(stored.mean / 2 ** 20).toFixed(2)} MiB)`,
        value: stored.p50 / CHANGED_BYTES,
        of: [`${k}.storedBytes`, `${k}.changedBytes`],
      });
      t(key, '≤ 1.1× (within 10%)', fmtRatio(stored.p50 / CHANGED_BYTES), stored.p50 <= 1.1 * CHANGED_BYTES);
      const sby = r.diagnostics[`${k}.standbyRssBytes`];
      const rss = r.diagnostics[`${k}.sandboxRssBytes`];
      if (sby?.n && rss?.n)
        r.ratios.push({
          key: `${k}.lockstep.standby-memory`,
          workload: label,
          system: 'Lockstep',
          operation: `standby RSS / sandbox RSS (${(sby.p50 / 2 ** 20).toFixed(1)} MiB / ${(rss.p50 / 2 ** 20).toFixed(1)} MiB)`,
          value: sby.p50 / rss.p50,
          of: [`${k}.standbyRssBytes`, `${k}.sandboxRssBytes`],
        });
    }
    const cold = p50(`${k}.lockstep.rollback:cold`);
    if (cold !== undefined && mib === 1024)
      t(`${k}.lockstep.rollback:cold`, '≤ 150 ms via a CRIU restore', `${fmtMs(cold)} ms`, cold <= 150);
  }

  // Common observations, measured in this run.
  const dump =
    r.criu['(a) Lockstep checkpoint, CRIU dump.log at level 4'] ??
    r.criu['(b) Lockstep checkpoint, CRIU dump.log at level 4'];
  const ct = dump?.steps.find((s) => s.name.includes('conntrack'));
  const buckets = r.host.nfConntrackBuckets;

  for (const target of r.targets.filter((x) => x.pass === false))
    r.analysis.push(explainMiss(target, m, r, { ct, buckets, ...extra }));

  r.notes.push(
    `Latencies are wall-clock times of the public calls (sb.checkpoint(), sb.rollback(), sb.fork()); "lib total" is the totalMs the library returns. The gap is the per-sandbox lock and the CRIU service's version check before each call.`,
    `A Lockstep checkpoint returns once it can be rolled back to; its syncfs and checksums follow behind the sandbox's lock ("until durable" rows; "durable before it returns" is LOCKSTEP_DURABLE_LATER=off, where persist = that step). The CRIU CLI, cp -a and docker checkpoint do not fsync.`,
    `The CRIU CLI peer pays exec and CRIU's kernel-feature probe on every call: /run is ${r.host.runIsTmpfs ? '' : 'not '}tmpfs here, so criu cannot cache it (Lockstep's long-lived CRIU service keeps its cache on a private tmpfs /run). Its restore runs through /bin/sh, which puts itself into the sandbox's cgroups first (about 1 ms).`,
    `CRIU step attributions are per-step medians of 3 extra dumps at log level 4 (1000+ log lines each), slower than the measured dumps at level 2: read the shares.`,
    `cp -a is GNU coreutils ${coreutilsVersion()}: since 9.0 it clones extents (reflink) by default where the filesystem can, so on the btrfs store it copies metadata only.`,
  );
  for (const d of r.measurements.filter((x) => x.key.endsWith('.docker.rollback'))) {
    r.notes.push(
      d.unavailable
        ? `Docker rollback, ${d.workload}: tried once, ${d.unavailable}; only checkpoint create is timed there.`
        : `Docker rollback, ${d.workload}: start --checkpoint worked here and was timed ${d.summary.n} times (each after an untimed checkpoint --exit, which already stopped the container)${d.note ? `; ${d.note}` : ''}.`,
    );
  }
  const fz = r.measurements.find((x) => x.key === 'a.criu-cli.checkpoint:freeze-cgroup');
  if (fz?.summary.n) {
    r.notes.push(
      `The CLI peer runs criu dump without --freeze-cgroup (CRIU seizes the tasks with ptrace). With it, on a thawed cgroup: min ${fmtMs(fz.summary.min)}, p50 ${fmtMs(fz.summary.p50)}, max ${fmtMs(fz.summary.max)} ms (n=${fz.summary.n}); CRIU polls a cgroup-v1 freezer every 100 ms (criu/seize.c, step_ms), so a dump pays ~100 ms more whenever the cgroup is not frozen at its first look. Lockstep freezes the cgroup itself (polling every 0-10 ms) before calling CRIU.`,
    );
  }
  if (extra.forks) {
    const per = summarize(extra.forks.perForkMs[16] ?? []);
    if (per.n)
      r.notes.push(
        `(d) one fork (as the library reports it, fork() runs 4 at a time): p50 ${fmtMs(per.p50)} ms, p95 ${fmtMs(per.p95)} ms.`,
      );
    for (const [n, rss] of Object.entries(extra.forks.rssPerForkBytes)) {
      const x = summarize(rss);
      if (x.n)
        r.notes.push(
          `(d) memory per fork at N=${n}: p50 ${(x.p50 / 2 ** 20).toFixed(1)} MiB resident (VmRSS of its processes).`,
        );
    }
  }
}

function phaseLine(x: Measurement | undefined, skip: string[] = ['totalMs', 'frozenMs']): string {
  if (!x?.phases) return '';
  return Object.entries(x.phases)
    .filter(([k]) => !skip.includes(k))
    .sort((a, b) => b[1].p50 - a[1].p50)
    .map(([k, s]) => `${k.replace(/Ms$/, '')} ${fmtMs(s.p50)}`)
    .join(', ');
}

function explainMiss(
  target: TargetResult,
  m: Map<string, Measurement>,
  r: BenchResults,
  info: { ct: { ms: number } | undefined; buckets: unknown; forks: ForkFanOut | undefined },
): string {
  const x = m.get(target.key);
  const overhead = x?.phases?.totalMs ? x.summary.p50 - x.phases.totalMs.p50 : undefined;
  const svc = r.diagnostics['criu.ensureRunning'];
  const over =
    overhead !== undefined
      ? `; outside the library's totalMs (sandbox lock, catalog reads, CRIU service version RPC${svc ? ` = ${fmtMs(svc.p50)} ms p50 on its own` : ''}): ${fmtMs(overhead)} ms`
      : '';
  // What the call would take without the synchronous btrfs commit, per iteration.
  const withoutPersist = x?.phaseSamples
    ? summarize(x.samples.map((w, i) => w - (x.phaseSamples![i]!.persistMs ?? 0)))
    : undefined;
  const top = (title: string) => {
    const a = r.criu[title];
    if (!a) return '';
    const steps = a.steps
      .slice(0, 3)
      .map((s) => `${s.name} ${fmtMs(s.ms)} ms (${((100 * s.ms) / (a.wallMs ?? a.logMs)).toFixed(0)}%)`);
    return ` CRIU's dump.log (level 4): ${steps.join('; ')}.`;
  };
  const conntrack =
    info.ct && info.ct.ms > 5 && Number(info.buckets) > 16384
      ? ` The conntrack part is CRIU dumping netfilter conntrack entries twice for the sandbox's network namespace even with --empty-ns net (criu/net.c dump_net_ns → dump_nf_ct, the second call asks for the same table); each dump walks the kernel's global conntrack hash, net.netfilter.nf_conntrack_buckets = ${String(info.buckets)} here.`
      : '';
  switch (target.key) {
    case 'a.lockstep.checkpoint': {
      const est = withoutPersist
        ? ` Without the synchronous btrfs commit the p50 would be ${fmtMs(withoutPersist.p50)} ms.`
        : '';
      return `(a) checkpoint p50 ${target.measured} > 10 ms. Phase p50s: ${phaseLine(x)}${over}. The CRIU dump dominates.${top('(a) Lockstep checkpoint, CRIU dump.log at level 4')}${conntrack}${est}`;
    }
    case 'a.lockstep.rollback':
    case 'a.lockstep.rollback:cold':
      return `(a) rollback p50 ${target.measured} misses "${target.target}". Phase p50s (largest first): ${phaseLine(x)}${over}. (CRIU's restore.log goes to a scratch folder the library deletes, so there is no step breakdown of the restore.)`;
    case 'b.lockstep.checkpoint': {
      const cli = m.get('b.criu-cli.checkpoint:dump');
      const est =
        withoutPersist && cli?.summary.n
          ? ` Without the synchronous btrfs commit (wall − persist, per iteration) the p50 would be ${fmtMs(withoutPersist.p50)} ms, ${fmtRatio(cli.summary.p50 / withoutPersist.p50)} faster than the CLI.`
          : '';
      return `(b) Lockstep checkpoint p50 ${fmtMs(x?.summary.p50)} ms vs criu dump CLI ${fmtMs(cli?.summary.p50)} ms: CLI / Lockstep = ${target.measured.replace(' faster', '')}, target ≥ 5×. Phase p50s: ${phaseLine(x)}${over}.${top('(b) Lockstep checkpoint, CRIU dump.log at level 4')}${est}${top('(b) criu dump CLI, dump.log at level 4').replace("CRIU's dump.log", "The CLI's dump.log")}`;
    }
    case 'c.lockstep.ratio': {
      const big = m.get('c.lockstep.checkpoint-1g');
      const small = m.get('c.lockstep.checkpoint-1m');
      const grow =
        big?.phases && small?.phases
          ? Object.keys(big.phases)
              .filter((k) => k !== 'totalMs' && k !== 'frozenMs')
              .map((k) => [k, big.phases![k]!.p50 - (small.phases![k]?.p50 ?? 0)] as const)
              .sort((a, b) => b[1] - a[1])
          : [];
      return `(c) 1 GiB / 1 MiB = ${target.measured} > 1.5×. Phase p50 growth from 1 MiB to 1 GiB: ${grow.map(([k, v]) => `${k.replace(/Ms$/, '')} ${v >= 0 ? '+' : ''}${fmtMs(v)}`).join(', ')}.`;
    }
    case 'd.lockstep.fork16-exec':
    case 'd.lockstep.fork64-exec': {
      const n = target.key.includes('64') ? 64 : 16;
      const per = summarize(info.forks?.perForkMs[n] ?? []);
      const resolved = m.get(`d.lockstep.fork${n}`);
      const exec = m.get(`d.lockstep.fork${n}-exec`);
      const execPart =
        resolved?.summary.n && exec?.summary.n
          ? ` The exec check of all ${n} (in parallel, one lockstep-helper each) adds ${fmtMs(exec.summary.p50 - resolved.summary.p50)} ms at p50.`
          : '';
      return `(d) ${n} forks: ${target.measured} misses "${target.target}". fork() restores 4 at a time (forkSandbox's default concurrency), so ${n} forks are ${n / 4} waves; one fork takes p50 ${fmtMs(per.p50)} ms (p95 ${fmtMs(per.p95)}) by the library's own count (prepare cgroup and /dev, btrfs snapshot, mount, CRIU restore, commit), and 2 CPUs bound how much 4-way concurrency helps.${execPart}`;
    }
    default:
      return `${target.key}: ${target.measured} misses "${target.target}". Phase p50s: ${phaseLine(x)}.`;
  }
}

function coreutilsVersion(): string {
  try {
    return /(\d+\.\d+)/.exec(execFileSync('cp', ['--version'], { encoding: 'utf8' }))?.[1] ?? '?';
  } catch {
    return '?';
  }
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`[bench] failed: ${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  },
);
