/**
 * Workload (e), the memory sweep: a python3 process holding 16, 64, 256 or
 * 1024 MiB, of which 1 MiB (256 pages at a rotating offset) changes between
 * two checkpoints, on a SIGUSR1 from the host. Measured per size: checkpoint
 * wall clock (tracked, whole, and the first after a rollback), bytes the
 * checkpoint stored on disk against the bytes that changed, rollback through
 * the warm standby and through a CRIU restore, the standby's resident
 * memory, and the CRIU CLI peer (stock CRIU) on a twin sandbox.
 *
 * The chain of checkpoints is kept while a size is measured (deleted at the
 * end), as an agent keeps its history: deleting each predecessor would make
 * every checkpoint absorb its parent's pages and measure the wrong thing.
 */
import fs from 'node:fs';
import type { Sandbox } from '../src/index.js';
import { measurement, type Measurement } from './report.js';
import { numericFields, summarize, type Summary } from './stats.js';
import {
  hostPidOf,
  instanceOf,
  MIB,
  rssKiB,
  settle,
  waitFor,
  withSettings,
  withStandby,
  type BenchContext,
} from './workloads.js';
import { measureCriuCliPeer } from './peers.js';

export const SWEEP_SIZES_MIB = [16, 64, 256, 1024];
export const CHANGED_BYTES = MIB;

/** Holds MIB MiB touched; each SIGUSR1 (taken with sigwait) rewrites one byte in each of 256 pages (1 MiB) and records the generation in /tmp/gen. */
const PYTHON_SWEEP = [
  'import os, signal',
  'n = int(os.environ["MIB"]) << 20',
  'b = bytearray(n)',
  '[b.__setitem__(i, 1) for i in range(0, n, 4096)]',
  'gen = 0',
  'def bump(*_):',
  '    global gen',
  '    gen += 1',
  '    off = (gen << 20) % n',
  '    v = gen % 255 + 1',
  '    for i in range(off, off + (1 << 20), 4096): b[i] = v',
  '    with open("/tmp/gen", "w") as f: f.write(str(gen))',
  // Taken with sigwait: a handler's signal sent before time.sleep is re-entered would wait the hour.
  'signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})',
  'bump()',
  'while True:',
  '    signal.sigwait({signal.SIGUSR1})',
  '    bump()',
].join('\n');

const PY_NEEDLE = 'PYTHON_SWEEP';

async function generation(sb: Sandbox): Promise<number> {
  try {
    return Number((await sb.files.read('/tmp/gen')).content.toString('utf8')) || 0;
  } catch {
    return 0;
  }
}

/** A dev sandbox whose python3 holds `mib` MiB resident; resolves once it has. */
export async function startSweepPython(ctx: BenchContext, mib: number): Promise<Sandbox> {
  // Room for the process, the interpreter and the page cache of the run.
  const sb = await ctx.ls.create({ image: 'dev', memoryMb: mib + 512 });
  await sb.commands.spawn(['python3', '-c', `# ${PY_NEEDLE}\n${PYTHON_SWEEP}`], { env: { MIB: String(mib) } });
  await waitFor(
    `python3 to hold ${mib} MiB`,
    () => {
      const pid = hostPidOf(ctx.ls, sb.id, PY_NEEDLE);
      return pid && rssKiB(pid) >= mib * 1024 ? pid : undefined;
    },
    120_000,
  );
  await untilGenerationAbove(sb, 0);
  return sb;
}

/** Changes 1 MiB of the python's memory (and the few bytes of /tmp/gen), and waits until it has. */
export async function change1MiBOfMemory(ctx: BenchContext, sb: Sandbox): Promise<void> {
  const before = await generation(sb);
  const pid = hostPidOf(ctx.ls, sb.id, PY_NEEDLE);
  if (!pid) throw new Error(`the sweep's python3 is not running in ${sb.id}`);
  process.kill(pid, 'SIGUSR1');
  await untilGenerationAbove(sb, before);
}

async function untilGenerationAbove(sb: Sandbox, before: number): Promise<void> {
  const deadline = Date.now() + 20_000;
  while ((await generation(sb)) <= before) {
    if (Date.now() > deadline) throw new Error(`python3 in ${sb.id} did not change its memory within 20 s`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Resident memory of the sandbox's warm standby (all its processes), in bytes; 0 without one. */
function standbyRssBytes(ctx: BenchContext, sandboxId: string): number {
  const e = ctx.ls.engine;
  e.catalog.requireSandbox(sandboxId);
  const standby = e.catalog.standby(sandboxId);
  if (!standby) return 0;
  return e.cgroups.pids(e.runtime.cgroupName(standby.instance)).reduce((s, p) => s + rssKiB(p) * 1024, 0);
}

function sandboxRssBytes(ctx: BenchContext, sandboxId: string): number {
  const e = ctx.ls.engine;
  return e.cgroups.pids(e.runtime.cgroupName(instanceOf(ctx.ls, sandboxId))).reduce((s, p) => s + rssKiB(p) * 1024, 0);
}

export interface SweepResult {
  measurements: Measurement[];
  /** Byte figures (the Summary's fields are bytes here): stored per checkpoint, standby RSS, sandbox RSS. */
  bytes: Record<string, Summary>;
  notes: string[];
}

/**
 * How a pass stores its images: "tracked" is the default (Lockstep's CRIU
 * build dumps only the pages written since the previous checkpoint);
 * "whole" turns tracking and page-delta off (every page every time, the
 * baseline before issue 25).
 */
function withImages<T>(ctx: BenchContext, mode: 'tracked' | 'whole', fn: () => Promise<T>): Promise<T> {
  return withSettings(ctx.ls, mode === 'whole' ? { wpKeeper: null, pageDelta: false } : {}, fn);
}

/** Rollbacks measured per pass, after its chain of checkpoints (at least one). */
const ROLLBACKS = 3;

/**
 * One size of the sweep, on one sandbox, in an agent's rhythm: a chain of
 * checkpoints, each after 1 MiB of the memory changed (the checkpoint and
 * the background work after it timed apart), then rollbacks to the newest
 * checkpoint, each after another change, then the first checkpoint after a
 * rollback (its processes were restored, so it is dumped whole). Passes:
 * whole images (the baseline), tracked with the warm standby (the default;
 * rollback = swap), tracked with the standby off (rollback = CRIU restore
 * of the chain). Then the CRIU CLI peer (stock CRIU) on a twin sandbox.
 */
export async function measureSweepSize(ctx: BenchContext, mib: number, iterations: number): Promise<SweepResult> {
  const key = `e.${mib}m`;
  const label = `e: python3 holding ${mib} MiB, 1 MiB changed`;
  const sb = await startSweepPython(ctx, mib);
  const paths: Record<string, number> = {};
  const ids: string[] = [];
  const total = ctx.warmup + iterations;
  const pass = async (mode: 'tracked' | 'whole', standby: 'on' | 'off') => {
    const r = {
      ck: [] as number[],
      phases: [] as Record<string, number>[],
      stored: [] as number[],
      standbyMs: [] as number[],
      standbyRss: [] as number[],
      rb: [] as number[],
      afterRollback: [] as number[],
      afterRollbackStored: [] as number[],
    };
    const what = `${mode} images, standby ${standby}`;
    await withImages(ctx, mode, () =>
      withStandby(ctx.ls, standby, async () => {
        let newest = '';
        for (let i = 0; i < total; i++) {
          ctx.checkAborted();
          ctx.progress.step(`(e) ${mib} MiB: change 1 MiB, checkpoint (${what})`, i + 1, total);
          await change1MiBOfMemory(ctx, sb);
          await settle(ctx.ls, sb.id);
          const t0 = performance.now();
          const info = await sb.checkpoint();
          const t1 = performance.now();
          await settle(ctx.ls, sb.id);
          const t2 = performance.now();
          ids.push(info.id);
          newest = info.id;
          if (i < ctx.warmup) continue;
          r.ck.push(t1 - t0);
          r.phases.push(numericFields(info.timings));
          r.stored.push(info.sizes.processImageBytes);
          r.standbyMs.push(t2 - t1);
          r.standbyRss.push(standbyRssBytes(ctx, sb.id));
        }
        const rollbacks = Math.max(1, Math.min(ROLLBACKS, iterations));
        for (let i = 0; i < rollbacks; i++) {
          ctx.checkAborted();
          ctx.progress.step(
            `(e) ${mib} MiB: change 1 MiB, rollback to the newest checkpoint (${what})`,
            i + 1,
            rollbacks,
          );
          await change1MiBOfMemory(ctx, sb);
          await settle(ctx.ls, sb.id);
          const t0 = performance.now();
          const back = await sb.rollback(newest);
          r.rb.push(performance.now() - t0);
          await settle(ctx.ls, sb.id);
          const p = `${what}: ${back.path}`;
          paths[p] = (paths[p] ?? 0) + 1;
        }
        await change1MiBOfMemory(ctx, sb);
        await settle(ctx.ls, sb.id);
        const t0 = performance.now();
        const info = await sb.checkpoint();
        r.afterRollback.push(performance.now() - t0);
        r.afterRollbackStored.push(info.sizes.processImageBytes);
        ids.push(info.id);
        await settle(ctx.ls, sb.id);
      }),
    );
    return r;
  };
  try {
    const whole = await pass('whole', 'on');
    const inc = await pass('tracked', 'on');
    const cold = await pass('tracked', 'off');
    const rss = sandboxRssBytes(ctx, sb.id);
    const out: SweepResult = {
      measurements: [
        measurement(
          `${key}.lockstep.checkpoint`,
          label,
          'Lockstep',
          'checkpoint (tracked: written pages only)',
          inc.ck,
          {
            phaseSamples: inc.phases,
          },
        ),
        measurement(
          `${key}.lockstep.checkpoint:whole`,
          label,
          'Lockstep',
          'checkpoint, whole images (tracking off, before)',
          whole.ck,
          { phaseSamples: whole.phases },
        ),
        measurement(
          `${key}.lockstep.checkpoint:after-rollback`,
          label,
          'Lockstep',
          'first checkpoint after a rollback (restored processes: whole)',
          [...inc.afterRollback, ...cold.afterRollback],
        ),
        measurement(`${key}.lockstep.checkpoint:standby-off`, label, 'Lockstep', 'checkpoint, standby off', cold.ck, {
          phaseSamples: cold.phases,
        }),
        measurement(
          `${key}.lockstep.standby`,
          label,
          'Lockstep',
          'background after checkpoint (durability, standby restore of the chain)',
          inc.standbyMs,
        ),
        measurement(
          `${key}.lockstep.standby:whole`,
          label,
          'Lockstep',
          'background after checkpoint (whole images)',
          whole.standbyMs,
        ),
        measurement(`${key}.lockstep.rollback`, label, 'Lockstep', 'rollback (default: warm standby)', inc.rb),
        measurement(
          `${key}.lockstep.rollback:cold`,
          label,
          'Lockstep',
          'rollback via CRIU restore of the chain (standby off)',
          cold.rb,
        ),
      ],
      bytes: {
        [`${key}.storedBytes`]: summarize([...inc.stored, ...cold.stored]),
        [`${key}.storedBytesWhole`]: summarize(whole.stored),
        [`${key}.storedBytesAfterRollback`]: summarize([...inc.afterRollbackStored, ...cold.afterRollbackStored]),
        [`${key}.changedBytes`]: summarize([CHANGED_BYTES]),
        [`${key}.standbyRssBytes`]: summarize(inc.standbyRss),
        [`${key}.sandboxRssBytes`]: summarize([rss]),
      },
      notes: [
        `(e) ${mib} MiB: rollback paths ${JSON.stringify(paths)}; sandbox RSS at the end ${(rss / MIB).toFixed(1)} MiB.`,
      ],
    };
    // Newest first: no image has to absorb a parent's pages on the way.
    for (const id of ids.reverse()) await sb.deleteCheckpoint(id);
    await ctx.ls.remove(sb.id);

    const peer = await startSweepPython(ctx, mib);
    const cli = await measureCriuCliPeer({ ...ctx, iterations: Math.min(iterations, 3) }, peer, { key, label });
    out.measurements.push(...cli.measurements);
    await ctx.ls.remove(peer.id);
    return out;
  } catch (e) {
    await ctx.ls.remove(sb.id).catch(() => undefined);
    throw e;
  }
}

/** The whole sweep; large sizes get fewer iterations (a 1 GiB dump takes seconds). */
export async function measureMemorySweep(
  ctx: BenchContext,
  sizes = SWEEP_SIZES_MIB,
  partialFile?: string,
): Promise<SweepResult> {
  const all: SweepResult = { measurements: [], bytes: {}, notes: [] };
  for (const mib of sizes) {
    const iterations = Math.max(3, Math.min(ctx.iterations, Math.round((ctx.iterations * 64) / Math.max(64, mib))));
    ctx.progress.note(`(e) memory sweep: ${mib} MiB, ${iterations} iterations`);
    const r = await measureSweepSize(ctx, mib, iterations);
    all.measurements.push(...r.measurements);
    Object.assign(all.bytes, r.bytes);
    all.notes.push(...r.notes);
    // A 1 GiB size takes many minutes on a busy machine: what is done so far survives an interrupted run.
    if (partialFile) fs.writeFileSync(partialFile, JSON.stringify(all, null, 1));
  }
  return all;
}
