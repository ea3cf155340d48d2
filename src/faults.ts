/**
 * Fault injection for crash-safety tests. LOCKSTEP_FAULT=<point> makes the
 * manager kill itself with SIGKILL when it reaches that point, exactly as a
 * crash would (no cleanup, no finally blocks). Points are named
 * "<operation>:<step>", e.g. "checkpoint:snapshotted". Tests of failure paths
 * pass a hook that throws instead (OpenOptions.fault): the operation then
 * fails at that point, in process, with its own error handling running.
 */

/** Every fault point, so that a test can crash the manager at each of them. */
export const FAULT_POINTS = {
  checkpoint: ['begin', 'frozen', 'snapshotted', 'dumped', 'delta', 'persisted', 'committed'],
  deleteCheckpoint: ['flattened'],
  rollback: ['begin', 'killed', 'layer-reset', 'mounted', 'restored', 'commit', 'committed'],
  fork: ['begin', 'prepared', 'layer-ready', 'restored', 'committed'],
  remove: ['marked'],
  open: ['catalog', 'reaped'],
} as const;

export type FaultHook = (point: string) => void;

/** Kills the process at the configured point; a no-op otherwise. */
export function envFaultHook(spec = process.env.LOCKSTEP_FAULT): FaultHook {
  if (!spec) return () => undefined;
  return (point) => {
    if (point === spec) process.kill(process.pid, 'SIGKILL');
  };
}
