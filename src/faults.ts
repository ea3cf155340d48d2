/**
 * Fault injection for crash-safety tests. LOCKSTEP_FAULT=<point> makes the
 * manager kill itself with SIGKILL when it reaches that point, exactly as a
 * crash would (no cleanup, no finally blocks). Points are named
 * "<operation>:<step>", e.g. "checkpoint:snapshotted". Tests of failure paths
 * pass a hook that throws instead (OpenOptions.fault): the operation then
 * fails at that point, in process, with its own error handling running.
 */
import { HostError } from './errors.js';
import { envValue } from './config.js';

/** Every fault point, so that a test can crash the manager at each of them. */
export const FAULT_POINTS = {
  checkpoint: ['begin', 'frozen', 'snapshotted', 'dumped', 'delta', 'persisted', 'committed'],
  /** The background step after a checkpoint's commit (durability.ts). */
  durable: ['begin', 'synced', 'committed'],
  deleteCheckpoint: ['flattened'],
  rollback: ['begin', 'killed', 'layer-reset', 'mounted', 'restored', 'commit', 'committed'],
  fork: ['begin', 'prepared', 'layer-ready', 'restored', 'committed'],
  remove: ['marked'],
  snapshot: ['begin', 'committed'],
  deleteSnapshot: ['committed'],
  importSnapshot: ['received', 'committed'],
  open: ['catalog', 'reaped'],
} as const;

/** One fault point, "<operation>:<step>": a misspelled point does not compile. */
export type FaultPoint = {
  [Op in keyof typeof FAULT_POINTS]: `${Op}:${(typeof FAULT_POINTS)[Op][number]}`;
}[keyof typeof FAULT_POINTS];

/** Every fault point as a flat list, in the order the operations reach them. */
export const ALL_FAULT_POINTS: readonly FaultPoint[] = Object.entries(FAULT_POINTS).flatMap(([op, steps]) =>
  steps.map((s) => `${op}:${s}` as FaultPoint),
);

/** True for a string naming a fault point (a LOCKSTEP_FAULT value that names none is refused). */
export function isFaultPoint(point: string): point is FaultPoint {
  return (ALL_FAULT_POINTS as readonly string[]).includes(point);
}

export type FaultHook = (point: FaultPoint) => void;

/** Kills the process at the configured point; a no-op otherwise. */
export function envFaultHook(spec: string | undefined = envValue('LOCKSTEP_FAULT')): FaultHook {
  if (!spec) return () => undefined;
  // A crash test whose point is misspelled would pass without ever crashing.
  if (!isFaultPoint(spec))
    throw new HostError(
      'CONFIG_INVALID',
      `LOCKSTEP_FAULT=${JSON.stringify(spec)} names no fault point; the points are ${ALL_FAULT_POINTS.join(', ')}`,
    );
  return (point) => {
    if (point === spec) process.kill(process.pid, 'SIGKILL');
  };
}
