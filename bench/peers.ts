/**
 * The alternatives a user would reach for instead of Lockstep, measured on
 * the same workloads in the same run:
 *  - the CRIU command line plus `cp -a` of the sandbox's writable layer
 *    (same CRIU binary and the same dump/restore options Lockstep
 *    uses, see src/checkpoints/process-image.ts; every call pays CRIU's
 *    exec and its kernel-feature probe, which is what a user pays);
 *  - `cp -a` alone for the workspace-size workload;
 *  - `docker checkpoint create` through dockerode on a container made from
 *    the same root filesystem.
 * The CLI runs against a throwaway Lockstep sandbox of the same shape (own
 * pid/mount/net namespaces, overlay root, /dev bind mount), so the process
 * tree and mounts CRIU sees are identical to Lockstep's.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import Docker from 'dockerode';
import { DEFAULTS } from '../src/config.js';
import type { Lockstep, Sandbox } from '../src/index.js';
import type { Engine } from '../src/api/engine.js';
import { hostOf } from '../src/lifecycle/instance-host.js';
import type { SandboxRow } from '../src/catalog/catalog.js';
import type { CriuRequest } from '../src/native/binding.js';
import { dumpOptions, restoreOptions } from '../src/instances/criu-options.js';
import { startTime } from '../src/host/proc.js';
import { projectRoot } from '../src/native/binding.js';
import {
  attributeCriuDumpLog,
  measurement,
  medianAttribution,
  unavailable,
  type CriuLogAttribution,
  type Measurement,
} from './report.js';
import {
  change1MiB,
  IDLE_LOOP,
  instanceOf,
  PYTHON_64M,
  rssKiB,
  RSS_MIN_KIB,
  waitFor,
  type BenchContext,
  type Workspace,
} from './workloads.js';

/* ------------------------------------------------------------------ */
/* Child processes                                                     */
/* ------------------------------------------------------------------ */

const children = new Set<ChildProcess>();

/** Kills the commands still running (on SIGINT or failure); they are ours, by pid. */
export function killChildren(): void {
  for (const c of children) {
    try {
      c.kill('SIGKILL');
    } catch {
      /* gone */
    }
  }
}

export interface ExecResult {
  ms: number;
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command and times it from spawn to exit: fork, exec, the dynamic
 * loader and the work, as a user invoking it from a program pays.
 */
export function execTimed(cmd: string, args: string[], opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(child);
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
    child.on('error', (e) => {
      clearTimeout(timer);
      children.delete(child);
      reject(e);
    });
    child.on('exit', (code) => {
      const ms = performance.now() - t0;
      clearTimeout(timer);
      children.delete(child);
      // Let the pipes drain so stderr is complete for error messages.
      setImmediate(() => resolve({ ms, code, stdout, stderr }));
    });
  });
}

async function mustExec(cmd: string, args: string[], what: string, opts: { timeoutMs?: number } = {}): Promise<number> {
  const r = await execTimed(cmd, args, opts);
  if (r.code !== 0)
    throw new Error(
      `${what} failed (exit ${r.code}): ${(r.stderr || r.stdout).trim().split('\n').slice(-5).join(' | ')}`,
    );
  return r.ms;
}

const sq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/* ------------------------------------------------------------------ */
/* criu CLI + cp -a                                                    */
/* ------------------------------------------------------------------ */

/**
 * The `criu` command-line flags for one of Lockstep's RPC requests
 * (src/checkpoints/process-image.ts builds them), so the CLI peer runs with
 * exactly the options Lockstep passes and cannot drift from them. Fields
 * the CLI has no flag for are refused, so a new option is never dropped
 * silently.
 */
export function criuCliFlags(engine: Engine, req: Omit<CriuRequest, 'op'>): string[] {
  const b = engine.native;
  const flags: string[] = [];
  const handled = new Set(['op', 'imagesDir', 'pid', 'logLevel', 'freezeCgroup', 'cgroupProcs']);
  for (const [key, value] of Object.entries(req)) {
    if (value === undefined || handled.has(key)) continue;
    switch (key) {
      case 'leaveRunning':
        if (value) flags.push('--leave-running');
        break;
      case 'fileLocks':
        if (value) flags.push('--file-locks');
        break;
      case 'tcpClose':
        if (value) flags.push('--tcp-close');
        break;
      case 'emptyNetns':
        if (value) flags.push('--empty-ns', 'net');
        break;
      case 'root':
        flags.push('--root', value as string);
        break;
      case 'extMounts':
        for (const [k, v] of value as [string, string][]) flags.push('--ext-mount-map', `${k}:${v}`);
        break;
      case 'networkLock':
        if (value !== b.criuNetworkLocks.skip)
          throw new Error(`criuCliFlags: networkLock ${String(value)} has no mapping`);
        flags.push('--network-lock', 'skip');
        break;
      case 'manageCgroupsMode':
        if (value !== b.criuCgroupModes.ignore)
          throw new Error(`criuCliFlags: manageCgroupsMode ${String(value)} has no mapping`);
        flags.push('--manage-cgroups=ignore');
        break;
      default:
        throw new Error(`criuCliFlags: request field ${key} has no CLI flag here`);
    }
  }
  return flags;
}

/** The CRIU command lines equivalent to Lockstep's dump and restore requests. */
export class CriuCli {
  /** Stock CRIU 4.2.1, as a user would run it (Lockstep's own build dumps only written pages, with its keeper). */
  readonly bin = DEFAULTS.stockCriuBinary;
  constructor(private readonly ls: Lockstep) {}

  private row(instance: string, pid: number): SandboxRow {
    const row = this.ls.engine.catalog.sandboxes().find((r) => r.instance === instance);
    if (!row) throw new Error(`no sandbox has instance ${instance}`);
    return { ...row, init_pid: pid };
  }

  /**
   * `criu dump --leave-running` with Lockstep's options (dumpOptions), less
   * the freezer: CRIU polls a cgroup-v1 freezer every 100 ms (seize.c,
   * step_ms), so a user who passes --freeze-cgroup pays ~100 ms whenever
   * the cgroup is not frozen at the first look. Without it CRIU seizes the
   * tasks with ptrace, the usual way to run the CLI. (Lockstep passes it
   * too, but freezes the cgroup itself first, so CRIU finds it frozen.)
   * `instance` keys the host resources: see instanceOf.
   */
  dumpArgs(instance: string, pid: number, dir: string, logLevel = 2, freezeCgroup = false): string[] {
    const e = this.ls.engine;
    const row = this.row(instance, pid);
    const req = dumpOptions(e, { initPid: pid, instance: row.instance }, dir);
    const args = ['dump', '-t', String(pid), '-D', dir, '-o', 'dump.log', `-v${logLevel}`, ...criuCliFlags(e, req)];
    if (freezeCgroup) args.push('--freeze-cgroup', req.freezeCgroup!);
    return args;
  }

  /** `criu restore -d` with Lockstep's options (restoreOptions), plus a pid file. */
  restoreArgs(instance: string, dir: string, pidFile: string): string[] {
    const e = this.ls.engine;
    const row = this.row(instance, 0);
    // The images folder is the work folder here: restore() gives it to the namespace's root, as the service does its own.
    const { workDirOwner: _owner, ...req } = restoreOptions(e, instance, dir, row.id_base ?? null);
    return ['restore', '-d', '-D', dir, '-o', 'restore.log', '-v2', ...criuCliFlags(e, req), '--pidfile', pidFile];
  }

  async dump(instance: string, pid: number, dir: string, logLevel = 2, freezeCgroup = false): Promise<number> {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    return mustExec(
      this.bin,
      this.dumpArgs(instance, pid, dir, logLevel, freezeCgroup),
      `criu dump of ${instance} (log: ${dir}/dump.log)`,
    );
  }

  /**
   * `criu restore -d`, started by a shell that first joins the sandbox's
   * cgroups: with --manage-cgroups=ignore the restored tree lands in CRIU's
   * own cgroups, and Lockstep (like any tool) finds and kills a sandbox by
   * its cgroup. The shell costs about a millisecond.
   */
  async restore(instance: string, dir: string): Promise<{ ms: number; pid: number }> {
    const e = this.ls.engine;
    const pidFile = path.join(dir, 'restored.pid');
    fs.rmSync(pidFile, { force: true });
    // A tree restored into a user namespace works in its folder as its own root.
    const idBase = this.row(instance, 0).id_base;
    if (idBase !== null) {
      fs.chownSync(dir, 0, idBase);
      fs.chmodSync(dir, 0o770);
    }
    const procs = e.cgroups.procsFiles(e.runtime.cgroupName(instance));
    const script = `for f in "$@"; do echo $$ > "$f" || exit 1; done; exec ${[this.bin, ...this.restoreArgs(instance, dir, pidFile)].map(sq).join(' ')}`;
    const ms = await mustExec(
      '/bin/sh',
      ['-c', script, 'sh', ...procs],
      `criu restore of ${instance} (log: ${dir}/restore.log)`,
    );
    return { ms, pid: Number(fs.readFileSync(pidFile, 'utf8').trim()) };
  }
}

export interface CliPeerResult {
  measurements: Measurement[];
  attribution: CriuLogAttribution;
  /** `criu dump` with --freeze-cgroup on the thawed cgroup, when asked for. */
  freezeCgroupDump?: Measurement;
}

/**
 * Per iteration, on a throwaway sandbox running the same workload:
 *  checkpoint = `criu dump --leave-running` + `cp -a` of the upper directory;
 *  rollback   = kill the tree (cgroup), unmount the root, replace the upper
 *               directory with the saved copy (`cp -a`), mount the overlay
 *               again (Lockstep's runtime helpers), `criu restore -d`.
 * The restored tree is handed back to Lockstep (its init pid recorded in the
 * catalog), so the sandbox stays usable; each iteration checks it answers
 * an exec (untimed).
 */
export async function measureCriuCliPeer(
  ctx: BenchContext,
  sb: Sandbox,
  wl: { key: string; label: string },
  opts: { verify?: (when: string) => void; freezeCgroupRuns?: number } = {},
): Promise<CliPeerResult> {
  const e = ctx.ls.engine;
  const cli = new CriuCli(ctx.ls);
  const root = path.join(e.paths.store, 'bench-peer', `${wl.key}-${sb.id}`);
  fs.mkdirSync(root, { recursive: true, mode: 0o700 });
  // The peer sandbox is never checkpointed or rolled back by Lockstep, so its instance does not change.
  const inst = instanceOf(ctx.ls, sb.id);
  const upper = e.layers.upperDir(inst).upper;
  const dumpMs: number[] = [];
  const cpMs: number[] = [];
  const ckMs: number[] = [];
  const rbMs: number[] = [];
  const rbPhases: Record<string, number>[] = [];
  const total = ctx.warmup + ctx.iterations;
  let previous: string | null = null;
  let pid = sb.info().pid!;
  for (let i = 0; i < total; i++) {
    ctx.checkAborted();
    ctx.progress.step(`(${wl.key}) criu CLI + cp -a: dump, copy, restore`, i + 1, total);
    const dir = path.join(root, `ckpt-${i}`);
    const d = await cli.dump(inst, pid, dir);
    const c = await mustExec('cp', ['-a', upper, path.join(dir, 'upper')], 'cp -a of the upper directory');
    // Untimed: write back what the dump and the copy left dirty, as Lockstep's
    // checkpoint does before it returns, so the rollback does not pay for it.
    await e.layers.sync();

    // The peer kills and restores the tree behind Lockstep's back: stop
    // watching the init first, or the manager would mark the sandbox stopped.
    e.inits.untrack(sb.id);
    const t0 = performance.now();
    await e.runtime.killProcesses(inst);
    const t1 = performance.now();
    e.runtime.unmountRoot(inst);
    fs.rmSync(upper, { recursive: true, force: true });
    await mustExec('cp', ['-a', path.join(dir, 'upper'), upper], 'cp -a back of the upper directory');
    const t2 = performance.now();
    await e.runtime.mountRoot(hostOf(e, e.catalog.requireSandbox(sb.id)));
    const t3 = performance.now();
    const r = await cli.restore(inst, dir);
    const t4 = performance.now();

    pid = r.pid;
    e.catalog.updateSandbox(sb.id, { state: 'running', init_pid: pid, init_start: startTime(pid) ?? null });
    e.inits.track(e.catalog.requireSandbox(sb.id));
    const alive = await sb.commands.run(['true'], { timeoutMs: 10_000 });
    if (alive.exitCode !== 0) throw new Error(`the CLI-restored sandbox ${sb.id} does not answer an exec`);
    if (i >= ctx.warmup) {
      dumpMs.push(d);
      cpMs.push(c);
      ckMs.push(d + c);
      rbMs.push(t4 - t0);
      rbPhases.push({ killMs: t1 - t0, layerMs: t2 - t1, mountMs: t3 - t2, restoreMs: t4 - t3, totalMs: t4 - t0 });
    }
    if (previous) fs.rmSync(previous, { recursive: true, force: true });
    previous = dir;
  }
  opts.verify?.('after the last CLI restore');

  // A few more dumps at log level 4, to see where the CLI's time goes (per-step medians).
  const runs: CriuLogAttribution[] = [];
  for (let i = 0; i < 3; i++) {
    ctx.progress.step(`(${wl.key}) criu dump CLI at log level 4 (attribution)`, i + 1, 3);
    const dir4 = path.join(root, `log-level-4-${i}`);
    const wall = await cli.dump(inst, pid, dir4, 4);
    runs.push(attributeCriuDumpLog(fs.readFileSync(path.join(dir4, 'dump.log'), 'utf8'), wall));
    fs.rmSync(dir4, { recursive: true, force: true });
  }
  const attribution = medianAttribution(runs);

  const sys = 'criu CLI + cp -a';
  let freezeCgroupDump: Measurement | undefined;
  if (opts.freezeCgroupRuns) {
    const fz: number[] = [];
    for (let i = 0; i < opts.freezeCgroupRuns; i++) {
      ctx.checkAborted();
      ctx.progress.step(`(${wl.key}) criu dump --freeze-cgroup (variant)`, i + 1, opts.freezeCgroupRuns);
      const dir = path.join(root, `freeze-${i}`);
      fz.push(await cli.dump(inst, pid, dir, 2, true));
      fs.rmSync(dir, { recursive: true, force: true });
    }
    freezeCgroupDump = measurement(
      `${wl.key}.criu-cli.checkpoint:freeze-cgroup`,
      wl.label,
      sys,
      'variant: criu dump --freeze-cgroup',
      fz,
    );
  }
  fs.rmSync(root, { recursive: true, force: true });

  return {
    ...(freezeCgroupDump ? { freezeCgroupDump } : {}),
    attribution,
    measurements: [
      measurement(
        `${wl.key}.criu-cli.checkpoint:dump`,
        wl.label,
        sys,
        'checkpoint: criu dump --leave-running only',
        dumpMs,
      ),
      measurement(`${wl.key}.criu-cli.checkpoint`, wl.label, sys, 'checkpoint: criu dump + cp -a', ckMs, {
        phaseSamples: dumpMs.map((v, i) => ({ dumpMs: v, cpMs: cpMs[i]!, totalMs: v + cpMs[i]! })),
      }),
      measurement(`${wl.key}.criu-cli.rollback`, wl.label, sys, 'rollback: kill, cp -a, mount, criu restore -d', rbMs, {
        phaseSamples: rbPhases,
      }),
    ],
  };
}

/**
 * (c) without Lockstep: copy the writable layer with `cp -a`, 1 GiB and
 * 1 MiB, after the same 1 MiB change. Two destinations: the same btrfs
 * store (coreutils 9 clones extents there by default, --reflink=auto) and
 * ext4 under /var/tmp (a real copy, what most hosts do).
 */
export async function measureCopyPeers(
  ctx: BenchContext,
  ws: { big: Workspace; small: Workspace },
): Promise<Measurement[]> {
  const e = ctx.ls.engine;
  const dests = [
    { key: 'cp-btrfs', system: 'cp -a, same btrfs (reflink)', dir: path.join(e.paths.store, 'bench-copies') },
    { key: 'cp-ext4', system: 'cp -a, to ext4 (full copy)', dir: path.join(e.paths.home, 'bench-copies-ext4') },
  ];
  const out: Measurement[] = [];
  let change = 1000; // offsets the 1 MiB changes from the ones Lockstep's loop made
  for (const dest of dests) {
    fs.mkdirSync(dest.dir, { recursive: true, mode: 0o700 });
    for (const which of ['big', 'small'] as const) {
      const w = ws[which];
      const upper = e.layers.upperDir(instanceOf(ctx.ls, w.sb.id)).upper;
      // A full 1 GiB copy takes seconds: fewer iterations there, stated in the table.
      const n = dest.key === 'cp-ext4' && which === 'big' ? Math.min(ctx.iterations, 10) : ctx.iterations;
      const total = Math.min(ctx.warmup, 1) + n;
      const samples: number[] = [];
      for (let i = 0; i < total; i++) {
        ctx.checkAborted();
        ctx.progress.step(`(c) ${dest.system}, ${w.label} workspace`, i + 1, total);
        await change1MiB(w, change++);
        const target = path.join(dest.dir, `copy-${which}-${i}`);
        const ms = await mustExec('cp', ['-a', upper, target], `cp -a of the ${w.label} upper`, { timeoutMs: 600_000 });
        if (i >= total - n) samples.push(ms);
        fs.rmSync(target, { recursive: true, force: true });
      }
      const label = which === 'big' ? '1 GiB workspace' : '1 MiB workspace';
      out.push(
        measurement(
          `c.${dest.key}.checkpoint-${which === 'big' ? '1g' : '1m'}`,
          'c: 1 MiB changed',
          dest.system,
          `copy, ${label}`,
          samples,
        ),
      );
    }
    fs.rmSync(dest.dir, { recursive: true, force: true });
  }
  return out;
}

/* ------------------------------------------------------------------ */
/* Docker                                                              */
/* ------------------------------------------------------------------ */

/** The engine's own message from a dockerode error. */
function engineMessage(e: unknown): string {
  const err = e as { json?: { message?: string }; message?: string };
  return (err.json?.message ?? err.message ?? String(e)).trim();
}

/** The checkpoint endpoints dockerode 5 has but its typings (4.x) lack. */
interface ContainerCheckpoints {
  createCheckpoint(opts: { CheckpointID: string; Exit: boolean }): Promise<unknown>;
  deleteCheckpoint(id: string, opts?: Record<string, unknown>): Promise<unknown>;
}

export const DOCKER_LABEL = 'dev.lockstep.bench';

/** `docker checkpoint create` on containers made from Lockstep's image root filesystems. */
export class DockerPeer {
  private readonly containers = new Set<string>();
  private readonly images = new Set<string>();
  private constructor(
    readonly docker: Docker,
    readonly version: string,
  ) {}

  /** Connects, starting dockerd (scripts/start-dockerd.sh, --experimental) if it does not answer. */
  static async open(ctx: BenchContext): Promise<DockerPeer | { unavailable: string }> {
    const docker = new Docker({ socketPath: process.env.DOCKER_SOCKET ?? '/var/run/docker.sock' });
    const ping = () =>
      docker.ping().then(
        () => true,
        () => false,
      );
    if (!(await ping())) {
      ctx.progress.note('Docker does not answer: starting dockerd with scripts/start-dockerd.sh');
      const r = await execTimed('bash', [path.join(projectRoot, 'scripts', 'start-dockerd.sh')], { timeoutMs: 60_000 });
      if (r.code !== 0 || !(await ping()))
        return { unavailable: `Docker engine unavailable: ${r.stderr.trim().split('\n').slice(-2).join(' ')}` };
    }
    const v = await docker.version();
    const info = (await docker.info()) as { ExperimentalBuild?: boolean };
    if (!info.ExperimentalBuild)
      return { unavailable: `dockerd ${v.Version} runs without --experimental, so it has no checkpoint API` };
    return new DockerPeer(docker, v.Version);
  }

  async exportImage(ctx: BenchContext, image: string, ref: string): Promise<void> {
    ctx.progress.note(`exporting Lockstep image ${image} to Docker as ${ref}`);
    this.images.add(ref);
    await ctx.ls.images.exportToDocker(image, ref);
  }

  async run(ref: string, cmd: string[]): Promise<Docker.Container> {
    const c = await this.docker.createContainer({
      Image: ref,
      Cmd: cmd,
      Labels: { [DOCKER_LABEL]: String(process.pid) },
      HostConfig: { NetworkMode: 'none' },
    });
    this.containers.add(c.id);
    await c.start();
    return c;
  }

  async hostPid(c: Docker.Container): Promise<number> {
    return (await c.inspect()).State.Pid;
  }

  /**
   * `POST /containers/{id}/checkpoints`, retried when the engine answers
   * "content ...: already exists" (moby/moby#42900: Docker 20.10 commits
   * checkpoint content to containerd and fails when a blob with the same
   * digest is already there). Returns the time of the attempt that worked
   * and how many failed before it; throws the engine's error after 3.
   */
  private async createCheckpoint(
    c: Docker.Container,
    body: { CheckpointID: string; Exit: boolean },
    ready?: () => Promise<void>,
  ): Promise<{ ms: number; retries: string[] }> {
    const api = c as unknown as ContainerCheckpoints;
    const retries: string[] = [];
    for (;;) {
      const t0 = performance.now();
      try {
        await api.createCheckpoint(body);
        return { ms: performance.now() - t0, retries };
      } catch (e) {
        const msg = engineMessage(e);
        if (!/already exists/.test(msg) || retries.length >= 3) throw Object.assign(new Error(msg), { retries });
        retries.push(msg);
        await api.deleteCheckpoint(body.CheckpointID).catch(() => undefined);
        // A failed checkpoint --exit may have stopped the container already: start it again (plainly).
        if (!(await c.inspect()).State.Running) {
          await c.start();
          await ready?.();
        }
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }

  /** Times `docker checkpoint create --leave-running`; each checkpoint is deleted afterwards (untimed). */
  async measureCheckpoint(
    ctx: BenchContext,
    c: Docker.Container,
    wl: { key: string; label: string },
  ): Promise<Measurement> {
    const api = c as unknown as ContainerCheckpoints;
    const samples: number[] = [];
    const failed: string[] = [];
    const total = ctx.warmup + ctx.iterations;
    const sys = `Docker ${this.version}`;
    const op = 'checkpoint create (--leave-running)';
    for (let i = 0; i < total; i++) {
      ctx.checkAborted();
      ctx.progress.step(`(${wl.key}) docker checkpoint create`, i + 1, total);
      const id = `bench-${i}`;
      let r: { ms: number; retries: string[] };
      try {
        r = await this.createCheckpoint(c, { CheckpointID: id, Exit: false });
      } catch (e) {
        const retries = (e as { retries?: string[] }).retries ?? [];
        return unavailable(
          `${wl.key}.docker.checkpoint`,
          wl.label,
          sys,
          op,
          `n/a (fails on Docker ${this.version} here after ${retries.length + 1} attempts and ${samples.length} successes: ${(e as Error).message})`,
        );
      }
      failed.push(...r.retries);
      if (i >= ctx.warmup) samples.push(r.ms);
      await api.deleteCheckpoint(id);
    }
    const note = failed.length
      ? `${failed.length} attempt(s) failed first with "${failed[0]}" (moby/moby#42900) and were retried; only the attempts that worked are timed`
      : undefined;
    return measurement(`${wl.key}.docker.checkpoint`, wl.label, sys, op, samples, note ? { note } : {});
  }

  /**
   * The restore half: checkpoint with Exit: true (untimed; it stops the
   * container), then `start --checkpoint` (timed). Stops at the first
   * failure, whose message it returns; a failed start leaves the container
   * stopped, so it is started again plainly.
   */
  async measureRestore(
    ctx: BenchContext,
    c: Docker.Container,
    wl: { key: string; label: string },
    iterations: number,
    check?: () => Promise<void>,
  ): Promise<{ samples: number[]; failure: string | null; retried: number }> {
    const api = c as unknown as ContainerCheckpoints;
    const samples: number[] = [];
    let retried = 0;
    const total = Math.min(ctx.warmup, 1) + iterations;
    for (let i = 0; i < total; i++) {
      ctx.checkAborted();
      ctx.progress.step(`(${wl.key}) docker checkpoint --exit + start --checkpoint`, i + 1, total);
      const id = `bench-restore-${i}`;
      try {
        const r = await this.createCheckpoint(c, { CheckpointID: id, Exit: true }, check);
        retried += r.retries.length;
      } catch (e) {
        return { samples, failure: `checkpoint --exit: ${(e as Error).message}`, retried };
      }
      const t0 = performance.now();
      try {
        // dockerode sends options as the JSON body unless split: the checkpoint is a query parameter.
        await c.start({ _query: { checkpoint: id }, _body: {} } as unknown as Record<string, unknown>);
      } catch (e) {
        await c.start().catch(() => undefined);
        await api.deleteCheckpoint(id).catch(() => undefined);
        return { samples, failure: engineMessage(e), retried };
      }
      const ms = performance.now() - t0;
      if (i >= total - iterations) samples.push(ms);
      if (!(await c.inspect()).State.Running)
        return { samples, failure: 'the container was not running after start --checkpoint', retried };
      await check?.();
      await api.deleteCheckpoint(id).catch(() => undefined);
    }
    return { samples, failure: null, retried };
  }

  async remove(c: Docker.Container): Promise<void> {
    await c.remove({ force: true }).catch(() => undefined);
    this.containers.delete(c.id);
  }

  /** Removes every container and image this run made (idempotent). */
  async cleanup(): Promise<void> {
    for (const id of this.containers)
      await this.docker
        .getContainer(id)
        .remove({ force: true })
        .catch(() => undefined);
    this.containers.clear();
    for (const ref of this.images)
      await this.docker
        .getImage(ref)
        .remove({ force: true })
        .catch(() => undefined);
    this.images.clear();
  }
}

/**
 * Docker's side of (a) and (b): checkpoint create timed; the restore tried,
 * and timed (at most 10 iterations: each needs a checkpoint --exit first)
 * for as long as it works.
 */
export async function measureDocker(
  ctx: BenchContext,
  peer: DockerPeer,
  wl: { key: string; label: string; image: string; cmd: string[]; needsRss: boolean },
): Promise<Measurement[]> {
  const ref = `lockstep-bench-${wl.image}:latest`;
  await peer.exportImage(ctx, wl.image, ref);
  const c = await peer.run(ref, wl.cmd);
  const sys = `Docker ${peer.version}`;
  const rssCheck = async () => {
    if (!wl.needsRss) return;
    const pid = await peer.hostPid(c);
    await waitFor('python3 in the container to hold 64 MiB RSS', () => rssKiB(pid) >= RSS_MIN_KIB);
  };
  try {
    await rssCheck();
    const m = await peer.measureCheckpoint(ctx, c, wl);
    await rssCheck();
    const n = Math.min(ctx.iterations, 10);
    const { samples, failure, retried } = await peer.measureRestore(ctx, c, wl, n, rssCheck);
    const op = 'rollback: start --checkpoint (after checkpoint --exit)';
    if (failure && samples.length === 0)
      return [
        m,
        unavailable(
          `${wl.key}.docker.rollback`,
          wl.label,
          sys,
          op,
          `n/a (fails on Docker ${peer.version} here: ${failure})`,
        ),
      ];
    const notes = [
      ...(failure ? [`failed after ${samples.length} restores: ${failure}`] : []),
      ...(retried
        ? [`${retried} checkpoint --exit attempt(s) failed with "content … already exists" and were retried`]
        : []),
    ];
    const rb = measurement(
      `${wl.key}.docker.rollback`,
      wl.label,
      sys,
      op,
      samples,
      notes.length ? { note: notes.join('; ') } : {},
    );
    return [m, rb];
  } finally {
    await peer.remove(c);
  }
}

export const DOCKER_WORKLOADS: Record<'a' | 'b', { image: string; cmd: string[]; needsRss: boolean }> = {
  a: { image: 'base', cmd: ['/bin/sh', '-c', IDLE_LOOP], needsRss: false },
  b: { image: 'dev', cmd: ['python3', '-c', PYTHON_64M], needsRss: true },
};
