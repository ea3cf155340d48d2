/**
 * Verb: fork. New sandboxes start from a checkpoint: each gets a writable
 * snapshot of the checkpoint's layer (btrfs copy-on-write, so they share
 * data without depending on each other), its own cgroup, network namespace
 * and run folder, and CRIU restores the process tree into it. One result per
 * fork: a failed fork does not sink the others. All the children's rows go
 * in at once, with the tenant's quotas on sandboxes checked for all of them:
 * a fork past them is refused whole (QUOTA_EXCEEDED) and makes none.
 */
import { newId, type CheckpointRow, type SandboxRow } from '../catalog/catalog.js';
import { InvalidArgumentError, LockstepError } from '../errors.js';
import { restoreNewInstance } from './process-image.js';
import { freeIdBase } from '../instances/id-ranges.js';
import { verifyCheckpoint } from './integrity.js';
import { ensureDurable } from './durability.js';
import { freeSlot } from '../host/network/addresses.js';
import { addForkPolicy, forgetNetwork } from '../network/sandbox-network.js';
import { diskBytesFor } from '../lifecycle/create.js';
import { checkLayerQuota, checkSandboxQuota, tenantOf } from '../tenants/quotas.js';
import type { ProcessImageDeps } from './process-image.js';
import type { IntegrityDeps } from './integrity.js';
import type { DurabilityDeps } from './durability.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { CreateDeps } from '../lifecycle/create.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { Catalog } from '../catalog/catalog.js';
import type { CriuClient, ProcessTable } from '../ports.js';
import type { FaultHook } from '../faults.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';

/** What fork.ts uses of the manager's services (api/engine.ts builds them). */
export interface ForkDeps extends ProcessImageDeps, IntegrityDeps, DurabilityDeps, SandboxNetworkDeps, CreateDeps {
  agent: AgentState;
  catalog: Catalog;
  config: LockstepConfig;
  criu: CriuClient;
  fault: FaultHook;
  inits: InitWatcher;
  log: Logger;
  proc: ProcessTable;
  runtime: SandboxRuntime;
}

export const MAX_FORKS = 64;

/**
 * One fork's outcome, in the order asked for: the child's id, its init's host
 * pid and how long it took, or the typed error's code, message and details
 * (`field` for bad input, for one).
 */
export type ForkResult =
  | { ok: true; id: string; pid: number; ms: number }
  | { ok: false; error: { code: string; message: string; details?: Record<string, unknown> } };

/** A failed fork's result from a typed error (its details kept when it has any). */
export function forkFailure(e: LockstepError): ForkResult {
  const details = Object.keys(e.details).length ? { details: { ...e.details } } : {};
  return { ok: false, error: { code: e.code, message: e.message, ...details } };
}

export function validateForkCount(count: unknown): number {
  if (count === undefined) return 1;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORKS)
    throw new InvalidArgumentError('count', `an integer from 1 to ${MAX_FORKS}`, count);
  return count;
}

/** The row of a fork's child before it is reserved: the parent's, with what is the child's own. */
function childRow(engine: ForkDeps, parent: SandboxRow, ckpt: CheckpointRow): SandboxRow {
  const id = newId('sbx');
  return {
    ...parent,
    id,
    image: ckpt.image,
    runtime_layer: ckpt.runtime_layer,
    state: 'creating',
    init_pid: null,
    init_start: null,
    hostname: parent.hostname,
    branch_id: newId('br'),
    head_checkpoint_id: null,
    forked_from: ckpt.id,
    created_at: Date.now(),
    expires_at: parent.expires_at,
    instance: id,
    id_base: null,
    net_slot: null,
    // A parent made before every layer had a limit: its forks get the default.
    disk_bytes: diskBytesFor(engine, parent.disk_bytes),
  };
}

/** A child whose row and fork journal entry are in the catalog ("creating"); nothing of it is on the host yet. */
export interface ReservedChild {
  child: SandboxRow;
  opId: string;
}

/**
 * Inserts the rows of new children (a fork's, or a start's from a snapshot),
 * each "creating" with its fork journal entry, in one transaction that
 * first checks the tenant's quotas on sandboxes for all of them: past
 * maxSandboxes, maxMemoryMb or maxCpuWeight the whole lot is refused
 * (QUOTA_EXCEEDED, thrown) and nothing is inserted. A refusal of one child
 * alone (its writable layer past maxDiskMb, no id range or address left) is
 * that child's result; the others are reserved. The children are alike
 * (same limits, same tenant).
 */
export function reserveChildren(
  engine: ForkDeps,
  tenantId: string | null,
  children: SandboxRow[],
  opts: { idRange: boolean; netSlot: boolean; payload: string },
): Array<ReservedChild | ForkResult> {
  const { catalog } = engine;
  // Not fsynced: a host crash that loses these rows also ends everything made
  // for the children, and the reaper removes what is left as orphans (unknown
  // instance keys); each child's fsynced commit carries them to disk.
  return catalog.unsynced(() =>
    catalog.tx(() => {
      const tenant = tenantOf(catalog.db, tenantId);
      if (children.length) checkSandboxQuota(catalog.db, tenant, children[0]!, children.length);
      return children.map((child): ReservedChild | ForkResult => {
        const opId = newId('op');
        try {
          // A savepoint of its own: a child refused here leaves nothing.
          catalog.tx(() => {
            // Each child's writable layer counts against the tenant's disk quota from its row on.
            checkLayerQuota(catalog.db, tenant, child.disk_bytes);
            // A child of a sandbox with a user namespace gets a range of its own.
            if (opts.idRange) child.id_base = freeIdBase(catalog);
            // An egress child gets an address of its own (and a copy of the policy under it).
            if (opts.netSlot) child.net_slot = freeSlot(catalog, engine.config.networkRange);
            catalog.insertSandbox(child);
            // The fork journal: the reaper removes a child whose start did not commit.
            catalog.beginOperation({
              id: opId,
              kind: 'fork',
              sandbox_id: child.id,
              phase: 'started',
              payload: opts.payload,
            });
          });
          return { child, opId };
        } catch (e) {
          if (e instanceof LockstepError) return forkFailure(e);
          throw e;
        }
      });
    }),
  );
}

/** Lets go of a reserved child that was never started (its row and journal entry). */
export function releaseChild(engine: ForkDeps, reserved: ReservedChild): void {
  engine.catalog.tx(() => {
    engine.catalog.deleteSandboxRow(reserved.child.id);
    engine.catalog.endOperation(reserved.opId);
  });
}

async function forkOne(
  engine: ForkDeps,
  parent: SandboxRow,
  ckpt: CheckpointRow,
  { child, opId }: ReservedChild,
  onCreated?: (child: SandboxRow) => void,
): Promise<ForkResult> {
  const started = performance.now();
  const { catalog } = engine;
  const id = child.id;
  try {
    // Inside the try: a failure at this child's start is its result, not the whole fork's.
    engine.fault('fork:begin');
    const pid = await restoreNewInstance(engine, id, child, ckpt, (point) => engine.fault(`fork:${point}`));
    engine.fault('fork:restored');
    await addForkPolicy(engine, child);
    const running = catalog.tx(() => {
      catalog.insertLayer(`upper_${id}`, 'upper', id);
      const r = catalog.updateSandbox(id, {
        state: 'running',
        init_pid: pid,
        init_start: engine.proc.startTime(pid) ?? null,
      })!;
      engine.agent.onFork(parent, ckpt, r);
      onCreated?.(r);
      catalog.endOperation(opId);
      return r;
    });
    engine.fault('fork:committed');
    engine.inits.track(running);
    return { ok: true, id, pid, ms: performance.now() - started };
  } catch (e) {
    engine.log.warn({ err: e, sandboxId: id }, 'fork failed; removing it');
    return abandonChild(engine, child, opId, e);
  }
}

/**
 * A child sandbox whose restore failed (a fork, or a start from a snapshot):
 * everything made for it goes (processes, mounts, layer, network policy, row)
 * and its journal entry closes; the failure becomes its result.
 */
export async function abandonChild(engine: ForkDeps, child: SandboxRow, opId: string, e: unknown): Promise<ForkResult> {
  await engine.runtime.destroy(child.id).catch(() => undefined);
  await forgetNetwork(engine, child).catch(() => undefined);
  engine.catalog.tx(() => {
    engine.catalog.deleteSandboxRow(child.id);
    engine.catalog.endOperation(opId);
  });
  if (e instanceof LockstepError) return forkFailure(e);
  return { ok: false, error: { code: 'FORK_FAILED', message: (e as Error).message } };
}

/** Starts `count` sandboxes from a checkpoint, a few at a time. */
export async function forkSandbox(
  engine: ForkDeps,
  parent: SandboxRow,
  ckpt: CheckpointRow,
  count: number,
  opts: {
    concurrency?: number;
    onProgress?: (done: number, total: number) => void;
    onCreated?: (child: SandboxRow) => void;
    signal?: AbortSignal;
  } = {},
): Promise<ForkResult[]> {
  const children = Array.from({ length: count }, () => childRow(engine, parent, ckpt));
  // Refused before anything is made; checked again, for good, when the rows go in.
  checkSandboxQuota(engine.catalog.db, tenantOf(engine.catalog.db, parent.tenant), children[0]!, count);
  await engine.criu.ensureRunning();
  // Once for all the forks, before any is made: a damaged checkpoint makes none.
  await verifyCheckpoint(engine, await ensureDurable(engine, ckpt));
  // All the children's rows in one transaction: a fork past the tenant's quota makes none.
  const reserved = reserveChildren(engine, parent.tenant, children, {
    idRange: parent.id_base !== null,
    netSlot: parent.net_slot != null,
    payload: JSON.stringify({ parent: parent.id, checkpointId: ckpt.id }),
  });
  const results: ForkResult[] = new Array(count);
  let next = 0;
  let done = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const r = reserved[i]!;
      if (!('child' in r)) {
        results[i] = r;
        opts.onProgress?.(++done, count);
        continue;
      }
      // Aborting stops forks that have not started; the ones running finish (or clean up) whole.
      if (opts.signal?.aborted) {
        releaseChild(engine, r);
        results[i] = { ok: false, error: { code: 'FORK_ABORTED', message: 'The fork was aborted before it started' } };
        opts.onProgress?.(++done, count);
        continue;
      }
      results[i] = await forkOne(engine, parent, ckpt, r, opts.onCreated);
      opts.onProgress?.(++done, count);
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency ?? 4, count) }, worker));
  return results;
}
