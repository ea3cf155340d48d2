/**
 * The workloads, measured through Lockstep's public API:
 *  (a) an idle shell sandbox: checkpoint and rollback;
 *  (b) a sandbox whose python3 holds 64 MiB of touched memory: checkpoint and rollback;
 *  (c) checkpoint after a 1 MiB change, in a 1 GiB and in a 1 MiB workspace;
 *  (d) fork fan-out to 1, 4 and 16 running sandboxes.
 * Latencies are wall-clock times of the public calls (what a caller waits
 * for); the per-phase timings the library returns are kept next to them.
 */
import fs from 'node:fs';
import type { Lockstep, Sandbox } from '../src/index.js';
import type { LockstepConfig } from '../src/config.js';
import type { CheckpointInfo } from '../src/checkpoints/checkpoint.js';
import {
  attributeCriuDumpLog,
  measurement,
  medianAttribution,
  type CriuLogAttribution,
  type Measurement,
  type Progress,
} from './report.js';
import { numericFields } from './stats.js';

/** What every workload gets from the runner. */
export interface BenchContext {
  ls: Lockstep;
  iterations: number;
  warmup: number;
  progress: Progress;
  /** Throws once the run has been interrupted, so loops stop between iterations. */
  checkAborted(): void;
}

export const IDLE_LOOP = 'while :; do sleep 1; done';

/** Touches every page of a 64 MiB bytearray, then sleeps: RSS ≥ 64 MiB for as long as it lives. */
export const PYTHON_64M = [
  'import time',
  'b = bytearray(64 << 20)',
  '[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]',
  'while True: time.sleep(3600)',
].join('\n');

export const MIB = 1 << 20;
export const RSS_MIN_KIB = 64 * 1024;

/** VmRSS of a host process in KiB (0 when it is gone). */
export function rssKiB(pid: number): number {
  try {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

function cmdline(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

/**
 * Key of the host resources (cgroup, run folder, writable layer) of the
 * sandbox's running instance: the sandbox id, until a rollback swaps in a
 * warm standby, which brings its own key.
 */
export function instanceOf(ls: Lockstep, sandboxId: string): string {
  const row = ls.engine.catalog.requireSandbox(sandboxId) as { instance?: string | null };
  return row.instance ?? sandboxId;
}

/** Host pid of the sandbox process whose command line contains `needle`. */
export function hostPidOf(ls: Lockstep, sandboxId: string, needle: string): number | undefined {
  const e = ls.engine;
  return e.cgroups.pids(e.runtime.cgroupName(instanceOf(ls, sandboxId))).find((p) => cmdline(p).includes(needle));
}

/**
 * Waits until the work Lockstep queued behind a sandbox's lock after a call
 * (preparing a warm standby, removing a replaced instance) is done, so that
 * the next timed call neither waits for it nor shares the CPU with it.
 */
export async function settle(ls: Lockstep, sandboxId: string): Promise<void> {
  await ls.engine.withSandboxLock(sandboxId, async () => undefined);
}

/**
 * Runs fn with some of the manager's settings changed (restored afterwards),
 * for A/B runs on one manager and one sandbox. Settings are resolved once at
 * open (src/config.ts), so setting LOCKSTEP_* variables here would change nothing.
 */
export async function withSettings<T>(ls: Lockstep, patch: Partial<LockstepConfig>, fn: () => Promise<T>): Promise<T> {
  const engine = ls.engine;
  const before = engine.config;
  engine.config = { ...before, ...patch };
  try {
    return await fn();
  } finally {
    engine.config = before;
  }
}

/** Runs fn with the warm standby on or off: "off" measures the CRIU-restore rollback path. */
export function withStandby<T>(ls: Lockstep, value: 'on' | 'off', fn: () => Promise<T>): Promise<T> {
  return withSettings(ls, { standby: value === 'on' }, fn);
}

export async function waitFor<T>(what: string, fn: () => T | undefined | false, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Workload (a): a base sandbox with a shell sleep loop in the background. */
export async function startIdleShell(
  ls: Lockstep,
  opts: { memoryMb?: number; network?: 'none' | 'egress' } = {},
): Promise<Sandbox> {
  const sb = await ls.create({
    image: 'base',
    ...(opts.memoryMb ? { memoryMb: opts.memoryMb } : {}),
    ...(opts.network ? { network: opts.network } : {}),
  });
  await sb.commands.spawn(IDLE_LOOP);
  await waitFor('the sleep loop to start', () => hostPidOf(ls, sb.id, 'while :'));
  return sb;
}

/** Workload (b): a dev sandbox running python3 with 64 MiB resident; resolves once RSS is there. */
export async function startPython64(ls: Lockstep): Promise<{ sb: Sandbox; rssKiB: number }> {
  const sb = await ls.create({ image: 'dev' });
  await sb.commands.spawn(['python3', '-c', PYTHON_64M]);
  const rss = await waitFor('python3 to reach 64 MiB RSS', () => {
    const pid = hostPidOf(ls, sb.id, 'python3');
    const r = pid ? rssKiB(pid) : 0;
    return r >= RSS_MIN_KIB ? r : undefined;
  });
  return { sb, rssKiB: rss };
}

/** The python's RSS now, or an error that names what is wrong. */
export function requirePythonRss(ls: Lockstep, sandboxId: string, when: string): number {
  const pid = hostPidOf(ls, sandboxId, 'python3');
  if (!pid) throw new Error(`python3 is not running in ${sandboxId} ${when}`);
  const rss = rssKiB(pid);
  if (rss < RSS_MIN_KIB)
    throw new Error(`python3 in ${sandboxId} has ${rss} KiB resident ${when}, expected at least ${RSS_MIN_KIB}`);
  return rss;
}

async function assertAnswers(sb: Sandbox, what: string): Promise<void> {
  const r = await sb.commands.run(['true'], { timeoutMs: 10_000 });
  if (r.exitCode !== 0) throw new Error(`${what}: exec of "true" exited with ${r.exitCode}`);
}

export interface CheckpointRollbackResult {
  checkpoint: Measurement;
  /** The same checkpoints with LOCKSTEP_STANDBY=off: what queueing the standby costs the caller. */
  checkpointNoStandby: Measurement;
  /** Start of the checkpoint call until its background durability step recorded it (syncfs, checksums). */
  checkpointToDurable: Measurement;
  /** The same checkpoints with durableLater off: syncfs and checksums before the call returns (the lever's A/B). */
  checkpointDurableFirst: Measurement;
  /** Rollback with Lockstep's defaults: a warm standby of the checkpoint is swapped in when one is ready. */
  rollback: Measurement;
  /** Rollback through a CRIU restore (LOCKSTEP_STANDBY=off; also what a rollback to an older checkpoint does). */
  rollbackCold: Measurement;
  /** Background work after each checkpoint until the sandbox settled (the standby's restore). */
  standby: Measurement;
  paths: Record<string, number>;
}

/**
 * Checkpoint, then roll back to that checkpoint, N times; then N more of
 * both with the warm standby off (the CRIU restore path). Before every
 * timed call the sandbox is settled (untimed), as it is when an agent works
 * for a while between calls. The previous iteration's checkpoint is deleted
 * afterwards (untimed), so the store does not grow.
 */
export async function measureCheckpointRollback(
  ctx: BenchContext,
  sb: Sandbox,
  wl: { key: string; label: string },
  verify?: (when: string) => void,
): Promise<CheckpointRollbackResult> {
  const ck = { on: [] as number[], off: [] as number[] };
  const toDurable: number[] = [];
  const durableFirst: number[] = [];
  const durableFirstPhases: Record<string, number>[] = [];
  const ckPhases = { on: [] as Record<string, number>[], off: [] as Record<string, number>[] };
  const standby: number[] = [];
  const paths: Record<string, number> = {};
  const rb = { on: [] as number[], off: [] as number[] };
  const rbPhases = { on: [] as Record<string, number>[], off: [] as Record<string, number>[] };
  let previous: string | null = null;
  const total = ctx.warmup + ctx.iterations;
  for (const mode of ['on', 'off'] as const) {
    await withStandby(ctx.ls, mode, async () => {
      for (let i = 0; i < total; i++) {
        ctx.checkAborted();
        ctx.progress.step(`(${wl.key}) Lockstep checkpoint + rollback, warm standby ${mode}`, i + 1, total);
        await settle(ctx.ls, sb.id);
        const t0 = performance.now();
        const info = await sb.checkpoint();
        const t1 = performance.now();
        await sb.durable(info.id);
        if (mode === 'on' && i >= ctx.warmup) toDurable.push(performance.now() - t0);
        await settle(ctx.ls, sb.id);
        const t2 = performance.now();
        const r = await sb.rollback(info.id);
        const t3 = performance.now();
        if (i >= ctx.warmup) {
          ck[mode].push(t1 - t0);
          ckPhases[mode].push(numericFields(info.timings));
          if (mode === 'on') standby.push(t2 - t1);
          rb[mode].push(t3 - t2);
          rbPhases[mode].push(numericFields(r.timings));
          const p = `${mode}:${(r as { path?: string }).path ?? 'restore'}`;
          paths[p] = (paths[p] ?? 0) + 1;
        }
        await settle(ctx.ls, sb.id);
        if (previous) await sb.deleteCheckpoint(previous);
        previous = info.id;
      }
    });
  }
  // The lever's A/B, same sandbox, back to back: durability before the call returns.
  await withSettings(ctx.ls, { durableLater: false, standby: false }, async () => {
    for (let i = 0; i < total; i++) {
      ctx.checkAborted();
      ctx.progress.step(`(${wl.key}) Lockstep checkpoint, durable before it returns`, i + 1, total);
      await settle(ctx.ls, sb.id);
      const t0 = performance.now();
      const info = await sb.checkpoint();
      if (i >= ctx.warmup) {
        durableFirst.push(performance.now() - t0);
        durableFirstPhases.push(numericFields(info.timings));
      }
      await settle(ctx.ls, sb.id);
      if (previous) await sb.deleteCheckpoint(previous);
      previous = info.id;
    }
  });
  await settle(ctx.ls, sb.id);
  await assertAnswers(sb, `sandbox ${sb.id} after ${2 * total} rollbacks`);
  verify?.('after the last rollback');
  if (previous) await sb.deleteCheckpoint(previous);
  return {
    checkpoint: measurement(`${wl.key}.lockstep.checkpoint`, wl.label, 'Lockstep', 'checkpoint', ck.on, {
      phaseSamples: ckPhases.on,
    }),
    checkpointNoStandby: measurement(
      `${wl.key}.lockstep.checkpoint:standby-off`,
      wl.label,
      'Lockstep',
      'checkpoint, standby off',
      ck.off,
      { phaseSamples: ckPhases.off },
    ),
    checkpointToDurable: measurement(
      `${wl.key}.lockstep.checkpoint:to-durable`,
      wl.label,
      'Lockstep',
      'checkpoint until durable (background syncfs + checksums done)',
      toDurable,
    ),
    checkpointDurableFirst: measurement(
      `${wl.key}.lockstep.checkpoint:durable-first`,
      wl.label,
      'Lockstep',
      'checkpoint, durable before it returns (LOCKSTEP_DURABLE_LATER=off)',
      durableFirst,
      { phaseSamples: durableFirstPhases },
    ),
    rollback: measurement(
      `${wl.key}.lockstep.rollback`,
      wl.label,
      'Lockstep',
      'rollback (default: warm standby)',
      rb.on,
      { phaseSamples: rbPhases.on },
    ),
    rollbackCold: measurement(
      `${wl.key}.lockstep.rollback:cold`,
      wl.label,
      'Lockstep',
      'rollback via CRIU restore (standby off)',
      rb.off,
      { phaseSamples: rbPhases.off },
    ),
    standby: measurement(
      `${wl.key}.lockstep.standby`,
      wl.label,
      'Lockstep',
      'background after checkpoint (standby restore)',
      standby,
    ),
    paths,
  };
}

/**
 * A few more checkpoints with CRIU logging at level 4, whose dump.log files
 * are split into steps; the per-step medians are returned. Level 4 writes
 * 1000+ lines, so these dumps are slower than the measured ones: read the
 * shares, not the absolute numbers.
 */
export async function criuDumpAttribution(ctx: BenchContext, sb: Sandbox, runs = 3): Promise<CriuLogAttribution> {
  const list: CriuLogAttribution[] = [];
  for (let i = 0; i < runs; i++) {
    ctx.checkAborted();
    ctx.progress.step(`checkpoint with CRIU log level 4 (attribution)`, i + 1, runs);
    await settle(ctx.ls, sb.id);
    const info: CheckpointInfo = await withSettings(ctx.ls, { criuLogLevel: 4 }, async () => {
      const made = await sb.checkpoint({ label: 'bench: CRIU log level 4' });
      await settle(ctx.ls, sb.id);
      return made;
    });
    const log = fs.readFileSync(`${ctx.ls.engine.paths.processImage(info.id)}/dump.log`, 'utf8');
    await sb.deleteCheckpoint(info.id);
    list.push(attributeCriuDumpLog(log, info.timings.dumpMs));
  }
  return medianAttribution(list);
}

/* ------------------------------------------------------------------ */
/* (c) workspace size                                                  */
/* ------------------------------------------------------------------ */

export interface Workspace {
  sb: Sandbox;
  label: string;
  /** Files under /workspace/data and how many MiB each holds. */
  files: number;
  fileMiB: number;
}

/** Creates the files of a workspace inside the sandbox with dd (urandom, so nothing compresses or dedups). */
export async function fillWorkspace(sb: Sandbox, files: number, fileMiB: number): Promise<void> {
  const names = Array.from({ length: files }, (_, i) => i).join(' ');
  const r = await sb.commands.run(
    `mkdir -p /workspace/data && for i in ${names}; do dd if=/dev/urandom of=/workspace/data/f$i bs=1M count=${fileMiB} 2>/dev/null || exit 1; done; sync`,
    { timeoutMs: 600_000 },
  );
  if (r.exitCode !== 0) throw new Error(`filling the workspace of ${sb.id} failed (${r.exitCode}): ${r.stderr}`);
}

/** Overwrites 1 MiB of the workspace in place (a different file and offset each iteration). */
export async function change1MiB(ws: Workspace, i: number): Promise<void> {
  const file = i % ws.files;
  const seek = (i * 7) % ws.fileMiB;
  const r = await ws.sb.commands.run(
    `dd if=/dev/urandom of=/workspace/data/f${file} bs=1M count=1 seek=${seek} conv=notrunc 2>/dev/null`,
    { timeoutMs: 60_000 },
  );
  if (r.exitCode !== 0) throw new Error(`changing 1 MiB in ${ws.sb.id} failed (${r.exitCode}): ${r.stderr}`);
}

export async function prepareWorkspaces(ctx: BenchContext): Promise<{ big: Workspace; small: Workspace }> {
  ctx.progress.note('(c) creating a 1 GiB workspace (16 × 64 MiB, dd in the sandbox) and a 1 MiB one');
  // The page cache of 1 GiB of writes is charged to the sandbox's memory cgroup: give it room.
  const bigSb = await startIdleShell(ctx.ls, { memoryMb: 2048 });
  const smallSb = await startIdleShell(ctx.ls);
  const big: Workspace = { sb: bigSb, label: '1 GiB', files: 16, fileMiB: 64 };
  const small: Workspace = { sb: smallSb, label: '1 MiB', files: 1, fileMiB: 1 };
  await fillWorkspace(bigSb, big.files, big.fileMiB);
  await fillWorkspace(smallSb, small.files, small.fileMiB);
  return { big, small };
}

/** Bytes of regular files in a sandbox's writable layer. */
export function upperBytes(ls: Lockstep, sandboxId: string): number {
  let total = 0;
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      if (e.isDirectory()) walk(`${d}/${e.name}`);
      else if (e.isFile()) total += fs.statSync(`${d}/${e.name}`).size;
    }
  };
  walk(ls.engine.layers.upperDir(instanceOf(ls, sandboxId)).upper);
  return total;
}

/**
 * Per iteration: change 1 MiB in both workspaces (untimed), then checkpoint
 * each (timed). A first, untimed checkpoint of each makes "since the last
 * checkpoint" true from the first measured iteration on.
 */
export async function measureWorkspaceCheckpoints(
  ctx: BenchContext,
  ws: { big: Workspace; small: Workspace },
): Promise<Measurement[]> {
  const samples = { big: [] as number[], small: [] as number[] };
  const phases = { big: [] as Record<string, number>[], small: [] as Record<string, number>[] };
  const previous: Record<'big' | 'small', string | null> = { big: null, small: null };
  const total = ctx.warmup + ctx.iterations;
  for (const which of ['big', 'small'] as const) {
    previous[which] = (await ws[which].sb.checkpoint({ label: 'bench: baseline' })).id;
    await settle(ctx.ls, ws[which].sb.id);
  }
  for (let i = 0; i < total; i++) {
    ctx.checkAborted();
    ctx.progress.step('(c) Lockstep checkpoint after a 1 MiB change, 1 GiB and 1 MiB workspaces', i + 1, total);
    // Alternate the order so neither size always runs right after the other's btrfs commit.
    const order = i % 2 === 0 ? (['big', 'small'] as const) : (['small', 'big'] as const);
    for (const which of order) {
      const w = ws[which];
      await change1MiB(w, i);
      await settle(ctx.ls, w.sb.id);
      const t0 = performance.now();
      const info = await w.sb.checkpoint();
      const ms = performance.now() - t0;
      await settle(ctx.ls, w.sb.id);
      if (i >= ctx.warmup) {
        samples[which].push(ms);
        phases[which].push(numericFields(info.timings));
      }
      if (previous[which]) await w.sb.deleteCheckpoint(previous[which]!);
      previous[which] = info.id;
    }
  }
  for (const which of ['big', 'small'] as const)
    if (previous[which]) await ws[which].sb.deleteCheckpoint(previous[which]!);
  const label = 'c: 1 MiB changed';
  return [
    measurement('c.lockstep.checkpoint-1g', label, 'Lockstep', 'checkpoint, 1 GiB workspace', samples.big, {
      phaseSamples: phases.big,
    }),
    measurement('c.lockstep.checkpoint-1m', label, 'Lockstep', 'checkpoint, 1 MiB workspace', samples.small, {
      phaseSamples: phases.small,
    }),
  ];
}

/* ------------------------------------------------------------------ */
/* (d) fork fan-out                                                    */
/* ------------------------------------------------------------------ */

export interface ForkFanOut {
  measurements: Measurement[];
  perForkMs: Record<number, number[]>;
  iterationsUsed: Record<number, number>;
  /** Resident memory of one fork (the sum of its processes' VmRSS), sampled once per N, in bytes. */
  rssPerForkBytes: Record<number, number[]>;
}

/**
 * For each N: time from calling fork until it resolves with N running
 * sandboxes, and until every one of them has answered an exec (run in
 * parallel). The forks are removed between iterations (untimed). N=16 uses
 * fewer iterations when one iteration (fork + remove) takes over 3 s.
 */
export async function measureForks(
  ctx: BenchContext,
  parent: Sandbox,
  counts: number[] = [1, 4, 16, 64],
): Promise<ForkFanOut> {
  const ckpt = await parent.checkpoint({ label: 'bench: fork source' });
  await settle(ctx.ls, parent.id);
  const out: ForkFanOut = { measurements: [], perForkMs: {}, iterationsUsed: {}, rssPerForkBytes: {} };
  const label = 'd: fork fan-out';
  try {
    for (const n of counts) {
      const ready: number[] = [];
      const answered: number[] = [];
      const perFork: number[] = [];
      let planned = ctx.warmup + ctx.iterations;
      for (let i = 0; i < planned; i++) {
        ctx.checkAborted();
        ctx.progress.step(`(d) Lockstep fork, N=${n}`, i + 1, planned);
        const t0 = performance.now();
        const results = await parent.fork(ckpt.id, { count: n });
        const t1 = performance.now();
        const failed = results.filter((r) => !r.ok);
        await Promise.all(
          results.map(async (r) => (r.ok ? assertAnswers(ctx.ls.get(r.id), `fork ${r.id}`) : undefined)),
        );
        const t2 = performance.now();
        if (i === ctx.warmup)
          out.rssPerForkBytes[n] = results.flatMap((r) =>
            r.ok
              ? [
                  ctx.ls.engine.cgroups
                    .pids(ctx.ls.engine.runtime.cgroupName(instanceOf(ctx.ls, r.id)))
                    .reduce((s, p) => s + rssKiB(p) * 1024, 0),
                ]
              : [],
          );
        for (const r of results) if (r.ok) await ctx.ls.remove(r.id);
        if (failed.length) throw new Error(`${failed.length} of ${n} forks failed: ${JSON.stringify(failed[0])}`);
        if (i >= ctx.warmup) {
          ready.push(t1 - t0);
          answered.push(t2 - t0);
          for (const r of results) if (r.ok) perFork.push(r.ms);
        }
        // A slow machine: keep the run within budget, and say how many were used.
        if (n >= 16 && i === ctx.warmup && performance.now() - t0 > 3000) planned = Math.min(planned, ctx.warmup + 10);
        // 64 forks: a handful of iterations (each makes and removes 64 sandboxes).
        if (n >= 64) planned = Math.min(planned, ctx.warmup + 5);
      }
      out.iterationsUsed[n] = ready.length;
      out.perForkMs[n] = perFork;
      out.measurements.push(
        measurement(`d.lockstep.fork${n}`, label, 'Lockstep', `fork N=${n}: resolved, all running`, ready),
      );
      out.measurements.push(
        measurement(
          `d.lockstep.fork${n}-exec`,
          label,
          'Lockstep',
          `fork N=${n}: + every fork answered an exec`,
          answered,
        ),
      );
    }
  } finally {
    await parent.deleteCheckpoint(ckpt.id).catch(() => undefined);
  }
  return out;
}
