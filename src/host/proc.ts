/** Small /proc readers shared by the reaper, the supervisor client and sandboxes. */
import fs from 'node:fs';

/** True when pid exists and is not a zombie. */
export function isAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Process start time in clock ticks since boot: with the pid, it identifies a process across pid reuse. */
export function startTime(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return Number(fields[19]);
  } catch {
    return undefined;
  }
}

/** The pid of a host process as seen inside its innermost pid namespace (NSpid's last field). */
/**
 * The few lines of /proc/<pid>/status that say whether a process can still
 * run and what is pending for it (State, PPid, TracerPid, SigPnd, ShdPnd),
 * one line, or 'gone'. For error reports: a task killed while its cgroup is
 * frozen lives on until the thaw, and these show it.
 */
export function processVitals(pid: number): string {
  try {
    const want = /^(State|PPid|TracerPid|SigPnd|ShdPnd):\s*(.*)$/;
    return fs
      .readFileSync(`/proc/${pid}/status`, 'utf8')
      .split('\n')
      .map((l) => want.exec(l))
      .filter((m) => m !== null)
      .map((m) => `${m[1]}=${m[2]}`)
      .join(' ');
  } catch {
    return 'gone';
  }
}

export function namespacePid(pid: number): number | undefined {
  try {
    const m = /^NSpid:\s+(.+)$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    if (!m) return undefined;
    const parts = m[1]!.trim().split(/\s+/);
    return Number(parts[parts.length - 1]);
  } catch {
    return undefined;
  }
}

/** Mount points (field 5 of mountinfo) under a prefix, deepest first so they can be unmounted in order. */
export function mountsUnder(prefix: string): string[] {
  const text = fs.readFileSync('/proc/self/mountinfo', 'utf8');
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const mp = line.split(' ')[4];
    if (!mp) continue;
    const decoded = mp.replace(/\\(\d{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (decoded === prefix || decoded.startsWith(prefix + '/')) out.push(decoded);
  }
  return out.sort((a, b) => b.length - a.length);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Propagation of a mount point: "shared", "slave", "private", or undefined when it is not a mount point. */
export function mountPropagation(mountPoint: string): 'shared' | 'slave' | 'private' | undefined {
  const text = fs.readFileSync('/proc/self/mountinfo', 'utf8');
  let found: 'shared' | 'slave' | 'private' | undefined;
  for (const line of text.split('\n')) {
    const fields = line.split(' ');
    if (fields[4] !== mountPoint) continue;
    const optional = fields.slice(6, fields.indexOf('-'));
    found = optional.some((f) => f.startsWith('shared:'))
      ? 'shared'
      : optional.some((f) => f.startsWith('master:'))
        ? 'slave'
        : 'private';
  }
  return found;
}
