/**
 * Which host process is a sandbox's init. CRIU and the catalog name
 * processes by pid, and a pid is reused once its process has exited, so a
 * pid alone never identifies a sandbox: the start time recorded with it does,
 * together with membership of the sandbox's cgroup.
 */
import type { CgroupDriver } from '../host/cgroups.js';
import type { ProcessTable } from '../ports.js';
import type { SandboxRuntime } from './runtime.js';
import { InvalidStateError } from '../errors.js';

/** What telling a sandbox's init needs: process start times, cgroup members, the instance's cgroup name. */
export interface IdentityDeps {
  cgroups: Pick<CgroupDriver, 'pids'>;
  runtime: Pick<SandboxRuntime, 'cgroupName'>;
  proc: Pick<ProcessTable, 'startTime'>;
}

/**
 * True when pid is the process that started at `start` and is in the
 * instance's cgroup. Meant for a frozen cgroup, whose members cannot exit on
 * their own: the answer then stays true until the caller thaws it. The start
 * time is read on both sides of the membership check, so a pid that changed
 * hands in between is not taken for the init.
 */
export function isInitOf(engine: IdentityDeps, instance: string, pid: number | null, start: number | null): boolean {
  if (pid === null || start === null) return false;
  if (engine.proc.startTime(pid) !== start) return false;
  if (!engine.cgroups.pids(engine.runtime.cgroupName(instance)).includes(pid)) return false;
  return engine.proc.startTime(pid) === start;
}

/** Throws SANDBOX_NOT_RUNNING unless the row's init is still the process it names (see isInitOf). */
export function assertInit(
  engine: IdentityDeps,
  row: { id: string; instance: string; init_pid: number | null; init_start: number | null },
): void {
  if (!isInitOf(engine, row.instance, row.init_pid, row.init_start)) {
    throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${row.id} is not running (its init has exited)`, {
      sandboxId: row.id,
    });
  }
}
