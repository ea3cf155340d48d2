/**
 * What a state directory holds on the host and in its catalog, read from the
 * kernel and the file system (not from Lockstep's own bookkeeping), so that
 * `bench:load` can say whether a load run left anything behind: mounts,
 * cgroups, btrfs subvolumes, process images, run folders, the supervisor's
 * children, catalog rows, journal entries and context snapshots.
 */
import fs from 'node:fs';
import type { Lockstep } from '../src/index.js';
// The integration tests' reader of a state directory (independent of the code under test); the bench reads more kinds.
import { cgroupChildren, listDir, mountPointsUnder } from '../test/fixtures/host-state.js';

/** Sorted names per kind of resource; compare two with leftBehind(). */
export type Footprint = Record<string, string[]>;

/** Processes whose parent is `ppid`, as "pid comm state". */
function childrenOf(ppid: number): string[] {
  const out: string[] = [];
  for (const name of listDir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const [state, parent] = stat.slice(close + 2).split(' ');
      if (Number(parent) === ppid) out.push(`${name} ${stat.slice(stat.indexOf('(') + 1, close)} ${state}`);
    } catch {
      /* exited meanwhile */
    }
  }
  return out.sort();
}

export function footprint(ls: Lockstep): Footprint {
  const { paths, catalog } = ls.engine;
  let supervisor = 0;
  try {
    supervisor = Number(fs.readFileSync(paths.supervisorPidfile, 'utf8').trim());
  } catch {
    /* not started */
  }
  const count = (sql: string) => String((catalog.db.prepare(sql).get() as { n: number }).n);
  return {
    mounts: mountPointsUnder(ls.home),
    cgroups: cgroupChildren(ls),
    writableLayers: listDir(paths.uppers),
    checkpointLayers: listDir(paths.layers),
    processImages: listDir(paths.processImages),
    runFolders: listDir(paths.sandboxesRun),
    // Sandbox inits and anything else the supervisor is the parent of (zombies included); the CRIU service stays.
    supervisorChildren: supervisor ? childrenOf(supervisor).map((c) => c.replace(/^\d+ /, '')) : [],
    sandboxRows: catalog.allSandboxes().map((r) => r.id),
    checkpointRows: catalog.allCheckpoints().map((r) => r.id),
    openOperations: catalog.operations().map((o) => `${o.kind}:${o.id}`),
    contextSnapshots: [count('SELECT count(*) AS n FROM agent_context_snapshots')],
    contextItems: [count('SELECT count(*) AS n FROM agent_context_items')],
  };
}

/** Kinds that are a row count rather than names. */
const COUNTS = new Set(['contextSnapshots', 'contextItems']);

/** What `after` has that `before` had not (per kind; counts compare as values); empty when nothing was left. */
export function leftBehind(before: Footprint, after: Footprint): Footprint {
  const out: Footprint = {};
  for (const [kind, items] of Object.entries(after)) {
    const had = before[kind] ?? [];
    if (COUNTS.has(kind)) {
      if (Number(items[0]) > Number(had[0] ?? 0)) out[kind] = [`${had[0] ?? 0} before, ${items[0]} after`];
      continue;
    }
    const extra = kind === 'supervisorChildren' ? multisetMinus(items, had) : items.filter((x) => !had.includes(x));
    if (extra.length) out[kind] = extra;
  }
  return out;
}

/** Process names compare as a multiset: one more "lockstep-init" is a leak even if one was there before. */
function multisetMinus(a: string[], b: string[]): string[] {
  const left = [...b];
  return a.filter((x) => {
    const i = left.indexOf(x);
    if (i < 0) return true;
    left.splice(i, 1);
    return false;
  });
}
