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
    if (Date.now() > deadline) throw new InvalidStateError('CGROUP_TIMEOUT', `Timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(delay);
    delay = Math.min(delay + 1, 10);
  }
}

/** cgroup v1: pids, memory and freezer hierarchies. */
export class CgroupV1 implements CgroupDriver {
  readonly version = 1 as const;
  static readonly controllers = ['pids', 'memory', 'freezer'] as const;
  constructor(private readonly root = '/sys/fs/cgroup') {}

  private dir(ctrl: string, name: string) {
    return path.join(this.root, ctrl, name);
  }

  create(name: string, limits: CgroupLimits): void {
    for (const c of CgroupV1.controllers) fs.mkdirSync(this.dir(c, name), { recursive: true, mode: 0o755 });
    if (limits.pids !== undefined) fs.writeFileSync(path.join(this.dir('pids', name), 'pids.max'), String(limits.pids));
    if (limits.memoryBytes !== undefined) {
      fs.writeFileSync(path.join(this.dir('memory', name), 'memory.limit_in_bytes'), String(limits.memoryBytes));
    }
  }

  procsFiles(name: string): string[] {
    return CgroupV1.controllers.map((c) => path.join(this.dir(c, name), 'cgroup.procs'));
  }

  freezerPath(name: string): string {
    return this.dir('freezer', name);
  }

  async freeze(name: string, timeoutMs = 5000): Promise<void> {
    const state = path.join(this.dir('freezer', name), 'freezer.state');
    fs.writeFileSync(state, 'FROZEN');
    await waitFor(() => readTrim(state) === 'FROZEN', timeoutMs, `cgroup ${name} to freeze`);
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
    // to frozen tasks once they thaw.
    await this.freeze(name, timeoutMs).catch(() => undefined);
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
    for (const c of CgroupV1.controllers) rmdirIfExists(this.dir(c, name));
  }

  children(group: string): string[] {
    try {
      return fs.readdirSync(this.dir('pids', group), { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
    } catch {
      return [];
    }
  }

  oomKills(name: string): number {
    try {
      const m = /oom_kill (\d+)/.exec(fs.readFileSync(path.join(this.dir('memory', name), 'memory.oom_control'), 'utf8'));
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }
}

/** cgroup v2: one unified hierarchy, controllers enabled down the path. */
export class CgroupV2 implements CgroupDriver {
  readonly version = 2 as const;
  constructor(private readonly root = '/sys/fs/cgroup') {}

  private dir(name: string) {
    return path.join(this.root, name);
  }

  create(name: string, limits: CgroupLimits): void {
    // Enable memory and pids for every ancestor's children, top-down.
    const parts = name.split('/');
    let cur = this.root;
    for (const part of parts) {
      try {
        fs.writeFileSync(path.join(cur, 'cgroup.subtree_control'), '+memory +pids');
      } catch (e) {
        throw new HostError('CGROUP_CONTROLLERS', `Cannot enable memory and pids controllers in ${cur}`, { cause: e });
      }
      cur = path.join(cur, part);
      fs.mkdirSync(cur, { recursive: true, mode: 0o755 });
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

  freezerPath(name: string): string {
    return this.dir(name);
  }

  async freeze(name: string, timeoutMs = 5000): Promise<void> {
    fs.writeFileSync(path.join(this.dir(name), 'cgroup.freeze'), '1');
    const events = path.join(this.dir(name), 'cgroup.events');
    await waitFor(() => /frozen 1/.test(fs.readFileSync(events, 'utf8')), timeoutMs, `cgroup ${name} to freeze`);
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
      return fs.readdirSync(this.dir(group), { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
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
