/**
 * Cgroups for sandboxes: limits, freeze/thaw and kill, on cgroup v1 (one
 * hierarchy per controller) or v2 (one unified hierarchy), detected at run
 * time. Every cgroup lives at lockstep/<homeTag>/<sandboxId>, so a reaper can
 * find the ones its state directory made and nothing else.
 */
import fs from 'node:fs';
import path from 'node:path';
import { HostError, InvalidStateError } from '../errors.js';

export interface CgroupLimits {
  memoryBytes?: number | undefined;
  pids?: number | undefined;
  /**
   * Relative CPU weight on the cgroup v2 scale (1-10000, kernel default 100); v1
   * gets cpu.shares = weight * 1024 / 100.
   */
  cpuWeight?: number | undefined;
  /** Hard CPU cap: microseconds of CPU time per 100 ms period (cpus * 100000). */
  cpuQuotaUs?: number | undefined;
  /** Relative I/O weight (1-10000, default 100); only where ioWeightSupport() says it takes effect. */
  ioWeight?: number | undefined;
}

/** The CFS period every CPU cap is expressed against (the kernel default). */
export const CPU_PERIOD_US = 100_000;

/**
 * cgroup v1 cpu.shares for a v2-scale weight: linear, so ratios between sandboxes
 * are kept (100 -> 1024, the kernel default).
 */
export function sharesForWeight(weight: number): number {
  return Math.max(2, Math.round((weight * 1024) / 100));
}

/** Whether a relative I/O weight would take effect here, and through which file. */
export type IoWeightSupport = { ok: true; file: string; detail: string } | { ok: false; detail: string };

/** Block devices whose active I/O scheduler is BFQ (the only one that honours blkio/io.bfq.weight). */
function bfqDevices(sysBlock = '/sys/block'): string[] {
  try {
    return fs.readdirSync(sysBlock).filter((d) => {
      try {
        return /\[bfq\]/.test(fs.readFileSync(path.join(sysBlock, d, 'queue', 'scheduler'), 'utf8'));
      } catch {
        return false;
      }
    });
  } catch {
    return [];
  }
}

/** What the sandbox code needs from a cgroup hierarchy. */
export interface CgroupDriver {
  readonly version: 1 | 2;
  create(name: string, limits: CgroupLimits): void;
  /** Files a process writes its pid into to join the cgroup (one per hierarchy). */
  procsFiles(name: string): string[];
  /** The path CRIU's freeze_cgroup option takes. */
  freezerPath(name: string): string;
  freeze(name: string, timeoutMs?: number): Promise<void>;
  thaw(name: string): void;
  isFrozen(name: string): boolean;
  pids(name: string): number[];
  /** SIGKILL every process and wait until the cgroup is empty. */
  kill(name: string, timeoutMs?: number): Promise<void>;
  remove(name: string): void;
  /** Names of the children of a group (for the reaper). */
  children(group: string): string[];
  oomKills(name: string): number;
  /** True when CPU weights and caps can be set (the cpu controller is there). */
  readonly cpuControl: boolean;
  /** Total CPU time the cgroup's processes used, in microseconds (cpuacct.usage / cpu.stat usage_usec). */
  cpuUsageUsec(name: string): number;
  /** Anonymous and shared memory charged to the cgroup, in bytes (memory.stat): what a copy of its processes costs. */
  memoryBytes(name: string): number;
  ioWeightSupport(): IoWeightSupport;
}

/** Sums the named fields of a memory.stat file; 0 when it cannot be read (the cgroup is gone). */
function memoryStat(file: string, fields: string[]): number {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return 0;
  }
  let n = 0;
  for (const line of text.split('\n')) {
    const [k, v] = line.split(' ');
    if (k && fields.includes(k)) n += Number(v);
  }
  return n;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function readTrim(file: string): string {
  return fs.readFileSync(file, 'utf8').trim();
}

function readPids(file: string): number[] {
  try {
    return readTrim(file).split('\n').filter(Boolean).map(Number);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
}

function rmdirIfExists(dir: string): void {
  try {
    fs.rmdirSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== 'ENOENT') throw e;
  }
}

async function waitFor(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  // Freezing a small tree usually completes within a fraction of a
  // millisecond: poll synchronously for 2 ms before yielding to the event
  // loop (a timer tick would cost more than the wait itself).
  const spinUntil = performance.now() + 2;
  while (performance.now() < spinUntil) if (cond()) return;
  const deadline = Date.now() + timeoutMs;
  let delay = 0;
  while (!cond()) {
    if (Date.now() > deadline)
      throw new InvalidStateError('CGROUP_TIMEOUT', `Timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(delay);
    delay = Math.min(delay + 1, 10);
  }
}

/**
 * A freeze that times out is undone before the error goes up: otherwise the
 * sandbox would stay half frozen (v1 FREEZING) with nobody left to thaw it.
 */
async function undoOnFailure(wait: Promise<void>, undo: () => void): Promise<void> {
  try {
    await wait;
  } catch (e) {
    try {
      undo();
    } catch {
      /* the cgroup is gone: nothing left frozen */
    }
    throw e;
  }
}

/**
 * Kills the cgroup's processes and removes it, however long they take to
 * die: a process inside a slow system call (a sandbox helper in
 * unshare(CLONE_NEWNET) on a loaded host, which a create that timed out
 * leaves behind) dies only when the call returns, and an rmdir before that
 * fails with EBUSY, which left the cgroup and the process behind for good.
 * A missing cgroup is success.
 */
export async function killAndRemove(cgroups: CgroupDriver, name: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let killError: unknown;
    await cgroups.kill(name, Math.max(1, deadline - Date.now())).catch((e: unknown) => (killError = e));
    try {
      cgroups.remove(name);
      return;
    } catch (e) {
      // EBUSY: a process joined after the kill looked (a helper that was still starting).
      if ((e as NodeJS.ErrnoException).code !== 'EBUSY' || Date.now() >= deadline) throw killError ?? e;
    }
    await sleep(20);
  }
}

/**
 * cgroup v1: pids, memory and freezer hierarchies, plus cpu, cpuacct and
 * blkio where they are mounted (separately or co-mounted as "cpu,cpuacct":
 * the per-controller paths are then symlinks to one directory).
 */
export class CgroupV1 implements CgroupDriver {
  readonly version = 1 as const;
  static readonly controllers = ['pids', 'memory', 'freezer'] as const;
  /** Hierarchies used when mounted; a sandbox joins each of them. */
  private readonly hierarchies: string[];
  readonly cpuControl: boolean;
  constructor(
    private readonly root = '/sys/fs/cgroup',
    private readonly sysBlock = '/sys/block',
  ) {
    const optional = ['cpu', 'cpuacct', 'blkio'].filter((c) => fs.existsSync(path.join(root, c, 'cgroup.procs')));
    this.hierarchies = [...CgroupV1.controllers, ...optional];
    this.cpuControl = fs.existsSync(path.join(root, 'cpu', 'cpu.shares'));
  }

  private dir(ctrl: string, name: string) {
    return path.join(this.root, ctrl, name);
  }

  create(name: string, limits: CgroupLimits): void {
    for (const c of this.hierarchies) fs.mkdirSync(this.dir(c, name), { recursive: true, mode: 0o755 });
    if (limits.pids !== undefined) fs.writeFileSync(path.join(this.dir('pids', name), 'pids.max'), String(limits.pids));
    if (limits.memoryBytes !== undefined) {
      fs.writeFileSync(path.join(this.dir('memory', name), 'memory.limit_in_bytes'), String(limits.memoryBytes));
    }
    if (limits.cpuWeight !== undefined || limits.cpuQuotaUs !== undefined) {
      if (!this.cpuControl)
        throw new HostError('CGROUP_CONTROLLERS', `The cpu cgroup controller is not mounted under ${this.root}`);
      const cpu = this.dir('cpu', name);
      if (limits.cpuWeight !== undefined)
        fs.writeFileSync(path.join(cpu, 'cpu.shares'), String(sharesForWeight(limits.cpuWeight)));
      if (limits.cpuQuotaUs !== undefined) {
        fs.writeFileSync(path.join(cpu, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
        fs.writeFileSync(path.join(cpu, 'cpu.cfs_quota_us'), String(limits.cpuQuotaUs));
      }
    }
    if (limits.ioWeight !== undefined) {
      const io = this.ioWeightSupport();
      if (!io.ok) throw new HostError('CGROUP_CONTROLLERS', `I/O weight unavailable: ${io.detail}`);
      fs.writeFileSync(
        path.join(this.dir('blkio', name), io.file),
        String(
          io.file === 'blkio.weight'
            ? Math.max(10, Math.min(1000, limits.ioWeight))
            : Math.max(1, Math.min(1000, limits.ioWeight)),
        ),
      );
    }
  }

  procsFiles(name: string): string[] {
    return this.hierarchies.map((c) => path.join(this.dir(c, name), 'cgroup.procs'));
  }

  memoryBytes(name: string): number {
    return memoryStat(path.join(this.dir('memory', name), 'memory.stat'), ['rss', 'shmem']);
  }

  cpuUsageUsec(name: string): number {
    const acct = fs.existsSync(path.join(this.root, 'cpuacct')) ? 'cpuacct' : 'cpu';
    return Math.floor(Number(readTrim(path.join(this.dir(acct, name), 'cpuacct.usage'))) / 1000);
  }

  ioWeightSupport(): IoWeightSupport {
    const blkio = path.join(this.root, 'blkio');
    if (!fs.existsSync(path.join(blkio, 'cgroup.procs')))
      return { ok: false, detail: 'the blkio cgroup controller is not mounted' };
    const bfq = bfqDevices(this.sysBlock);
    if (fs.existsSync(path.join(blkio, 'blkio.bfq.weight'))) {
      if (bfq.length)
        return { ok: true, file: 'blkio.bfq.weight', detail: `blkio.bfq.weight on ${bfq.join(', ')} (BFQ)` };
      return { ok: false, detail: 'blkio.bfq.weight exists but no block device uses the BFQ scheduler' };
    }
    if (fs.existsSync(path.join(blkio, 'blkio.weight')))
      return { ok: true, file: 'blkio.weight', detail: 'blkio.weight' };
    return {
      ok: false,
      detail: "this kernel's blkio (v1) hierarchy has no weight file (no blkio.weight or blkio.bfq.weight)",
    };
  }

  freezerPath(name: string): string {
    return this.dir('freezer', name);
  }

  async freeze(name: string, timeoutMs = 5000): Promise<void> {
    const state = path.join(this.dir('freezer', name), 'freezer.state');
    fs.writeFileSync(state, 'FROZEN');
    await undoOnFailure(
      waitFor(() => readTrim(state) === 'FROZEN', timeoutMs, `cgroup ${name} to freeze`),
      () => this.thaw(name),
    );
  }

  thaw(name: string): void {
    fs.writeFileSync(path.join(this.dir('freezer', name), 'freezer.state'), 'THAWED');
  }

  isFrozen(name: string): boolean {
    try {
      return readTrim(path.join(this.dir('freezer', name), 'freezer.state')) !== 'THAWED';
    } catch {
      return false;
    }
  }

  pids(name: string): number[] {
    return readPids(path.join(this.dir('pids', name), 'cgroup.procs'));
  }

  async kill(name: string, timeoutMs = 5000): Promise<void> {
    if (!fs.existsSync(this.dir('freezer', name))) return;
    // Freeze first so nothing can fork while we kill; SIGKILL is delivered
    // to frozen tasks once they thaw. A task that does not freeze soon is in
    // a long system call: kill it without waiting for that.
    await this.freeze(name, Math.min(timeoutMs, 1000)).catch(() => undefined);
    for (const pid of this.pids(name)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
    this.thaw(name);
    await waitFor(() => this.pids(name).length === 0, timeoutMs, `cgroup ${name} to empty`);
  }

  remove(name: string): void {
    for (const c of this.hierarchies) rmdirIfExists(this.dir(c, name));
  }

  children(group: string): string[] {
    try {
      return fs
        .readdirSync(this.dir('pids', group), { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name);
    } catch {
      return [];
    }
  }

  oomKills(name: string): number {
    try {
      const m = /oom_kill (\d+)/.exec(
        fs.readFileSync(path.join(this.dir('memory', name), 'memory.oom_control'), 'utf8'),
      );
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }
}

/** cgroup v2: one unified hierarchy, controllers enabled down the path. */
export class CgroupV2 implements CgroupDriver {
  readonly version = 2 as const;
  readonly cpuControl: boolean;
  private readonly available: string[];
  constructor(
    private readonly root = '/sys/fs/cgroup',
    private readonly sysBlock = '/sys/block',
  ) {
    try {
      this.available = readTrim(path.join(root, 'cgroup.controllers')).split(/\s+/);
    } catch {
      this.available = [];
    }
    this.cpuControl = this.available.includes('cpu');
  }

  private dir(name: string) {
    return path.join(this.root, name);
  }

  create(name: string, limits: CgroupLimits): void {
    // Enable memory and pids (and cpu, io where the hierarchy has them) for
    // every ancestor's children, top-down.
    const wanted = ['memory', 'pids', ...['cpu', 'io'].filter((c) => this.available.includes(c))];
    const parts = name.split('/');
    let cur = this.root;
    for (const part of parts) {
      try {
        fs.writeFileSync(path.join(cur, 'cgroup.subtree_control'), wanted.map((c) => `+${c}`).join(' '));
      } catch (e) {
        throw new HostError('CGROUP_CONTROLLERS', `Cannot enable the ${wanted.join(', ')} controllers in ${cur}`, {
          cause: e,
        });
      }
      cur = path.join(cur, part);
      fs.mkdirSync(cur, { recursive: true, mode: 0o755 });
    }
    if (limits.cpuWeight !== undefined || limits.cpuQuotaUs !== undefined) {
      if (!this.cpuControl)
        throw new HostError('CGROUP_CONTROLLERS', `The cpu controller is not available in ${this.root}`);
      if (limits.cpuWeight !== undefined) fs.writeFileSync(path.join(cur, 'cpu.weight'), String(limits.cpuWeight));
      if (limits.cpuQuotaUs !== undefined)
        fs.writeFileSync(path.join(cur, 'cpu.max'), `${limits.cpuQuotaUs} ${CPU_PERIOD_US}`);
    }
    if (limits.ioWeight !== undefined) {
      const io = this.ioWeightSupport();
      if (!io.ok) throw new HostError('CGROUP_CONTROLLERS', `I/O weight unavailable: ${io.detail}`);
      fs.writeFileSync(
        path.join(cur, io.file),
        io.file === 'io.bfq.weight' ? String(Math.min(1000, limits.ioWeight)) : `default ${limits.ioWeight}`,
      );
    }
    if (limits.pids !== undefined) fs.writeFileSync(path.join(cur, 'pids.max'), String(limits.pids));
    if (limits.memoryBytes !== undefined) {
      fs.writeFileSync(path.join(cur, 'memory.max'), String(limits.memoryBytes));
      try {
        fs.writeFileSync(path.join(cur, 'memory.swap.max'), '0');
      } catch {
        /* no swap accounting */
      }
    }
  }

  procsFiles(name: string): string[] {
    return [path.join(this.dir(name), 'cgroup.procs')];
  }

  memoryBytes(name: string): number {
    return memoryStat(path.join(this.dir(name), 'memory.stat'), ['anon', 'shmem']);
  }

  freezerPath(name: string): string {
    return this.dir(name);
  }

  async freeze(name: string, timeoutMs = 5000): Promise<void> {
    fs.writeFileSync(path.join(this.dir(name), 'cgroup.freeze'), '1');
    const events = path.join(this.dir(name), 'cgroup.events');
    await undoOnFailure(
      waitFor(() => /frozen 1/.test(fs.readFileSync(events, 'utf8')), timeoutMs, `cgroup ${name} to freeze`),
      () => this.thaw(name),
    );
  }

  thaw(name: string): void {
    fs.writeFileSync(path.join(this.dir(name), 'cgroup.freeze'), '0');
  }

  isFrozen(name: string): boolean {
    try {
      return readTrim(path.join(this.dir(name), 'cgroup.freeze')) === '1';
    } catch {
      return false;
    }
  }

  pids(name: string): number[] {
    return readPids(path.join(this.dir(name), 'cgroup.procs'));
  }

  async kill(name: string, timeoutMs = 5000): Promise<void> {
    if (!fs.existsSync(this.dir(name))) return;
    fs.writeFileSync(path.join(this.dir(name), 'cgroup.kill'), '1');
    await waitFor(() => this.pids(name).length === 0, timeoutMs, `cgroup ${name} to empty`);
  }

  remove(name: string): void {
    rmdirIfExists(this.dir(name));
  }

  children(group: string): string[] {
    try {
      return fs
        .readdirSync(this.dir(group), { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name);
    } catch {
      return [];
    }
  }

  oomKills(name: string): number {
    try {
      const m = /oom_kill (\d+)/.exec(fs.readFileSync(path.join(this.dir(name), 'memory.events'), 'utf8'));
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }

  cpuUsageUsec(name: string): number {
    const m = /^usage_usec (\d+)$/m.exec(fs.readFileSync(path.join(this.dir(name), 'cpu.stat'), 'utf8'));
    return m ? Number(m[1]) : 0;
  }

  ioWeightSupport(): IoWeightSupport {
    if (!this.available.includes('io'))
      return {
        ok: false,
        detail: `the io controller is not available in ${this.root} (bound to a v1 hierarchy, or not built)`,
      };
    // io.weight only acts when io.cost is enabled on a device; io.bfq.weight only under BFQ.
    const bfq = bfqDevices(this.sysBlock);
    if (bfq.length) return { ok: true, file: 'io.bfq.weight', detail: `io.bfq.weight on ${bfq.join(', ')} (BFQ)` };
    let qos = '';
    try {
      qos = fs.readFileSync(path.join(this.root, 'io.cost.qos'), 'utf8');
    } catch {
      /* no iocost */
    }
    if (/enable=1/.test(qos)) return { ok: true, file: 'io.weight', detail: 'io.weight (io.cost enabled)' };
    return {
      ok: false,
      detail:
        'no block device uses the BFQ scheduler and io.cost is not enabled, so an I/O weight would have no effect',
    };
  }
}

/** Picks v2 when the unified hierarchy is mounted at the root, else v1 (needs pids, memory, freezer). */
export function detectCgroups(root = '/sys/fs/cgroup'): CgroupDriver {
  if (fs.existsSync(path.join(root, 'cgroup.controllers'))) return new CgroupV2(root);
  const missing = CgroupV1.controllers.filter((c) => !fs.existsSync(path.join(root, c, 'cgroup.procs')));
  if (missing.length) {
    throw new HostError('CGROUP_UNAVAILABLE', `cgroup v1 controllers not mounted under ${root}: ${missing.join(', ')}`);
  }
  return new CgroupV1(root);
}
