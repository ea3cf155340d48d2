/**
 * Verb: fork. New sandboxes start from a checkpoint: each gets a writable
 * snapshot of the checkpoint's layer (btrfs copy-on-write, so they share
 * data without depending on each other), its own cgroup, network namespace
 * and run folder, and CRIU restores the process tree into it. One result per
 * fork: a failed fork does not sink the others.
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
import { checkLayerQuota, tenantOf } from '../tenants/quotas.js';
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

export type ForkResult =
  { ok: true; id: string; pid: number; ms: number } | { ok: false; error: { code: string; message: string } };

export function validateForkCount(count: unknown): number {
  if (count === undefined) return 1;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORKS)
    throw new InvalidArgumentError('count', `an integer from 1 to ${MAX_FORKS}`, count);
  return count;
}

async function forkOne(
  engine: ForkDeps,
  parent: SandboxRow,
  ckpt: CheckpointRow,
  onCreated?: (child: SandboxRow) => void,
): Promise<ForkResult> {
  const started = performance.now();
  const { catalog } = engine;
  const id = newId('sbx');
  const opId = newId('op');
  const child: SandboxRow = {
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
  // Not fsynced: a host crash that loses this row also ends everything made
  // for the fork, and the reaper removes what is left as orphans (unknown
  // instance keys); the fsynced commit below carries it to disk.
  // A fork the quota refuses is that fork's result; nothing was made for it.
  try {
    catalog.unsynced(() =>
      catalog.tx(() => {
        // Each fork's writable layer counts against the tenant's disk quota from its row on.
        checkLayerQuota(catalog.db, tenantOf(catalog.db, parent.tenant), child.disk_bytes);
        // A fork of a sandbox with a user namespace gets a range of its own.
        if (parent.id_base !== null) child.id_base = freeIdBase(catalog);
        // An egress fork gets an address of its own and a copy of the policy under it.
        if (parent.net_slot != null) child.net_slot = freeSlot(catalog, engine.config.networkRange);
        catalog.insertSandbox(child);
        catalog.beginOperation({
          id: opId,
          kind: 'fork',
          sandbox_id: id,
          phase: 'started',
          payload: JSON.stringify({ parent: parent.id, checkpointId: ckpt.id }),
        });
      }),
    );
  } catch (e) {
    if (e instanceof LockstepError) return { ok: false, error: { code: e.code, message: e.message } };
    throw e;
  }
  engine.fault('fork:begin');
  try {
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
  const error =
    e instanceof LockstepError
      ? { code: e.code, message: e.message }
      : { code: 'FORK_FAILED', message: (e as Error).message };
  return { ok: false, error };
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
  await engine.criu.ensureRunning();
  // Once for all the forks, before any is made: a damaged checkpoint makes none.
  await verifyCheckpoint(engine, await ensureDurable(engine, ckpt));
  const results: ForkResult[] = new Array(count);
  let next = 0;
  let done = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      // Aborting stops forks that have not started; the ones running finish (or clean up) whole.
      if (opts.signal?.aborted) {
        results[i] = { ok: false, error: { code: 'FORK_ABORTED', message: 'The fork was aborted before it started' } };
        opts.onProgress?.(++done, count);
        continue;
      }
      results[i] = await forkOne(engine, parent, ckpt, opts.onCreated);
      opts.onProgress?.(++done, count);
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency ?? 4, count) }, worker));
  return results;
}
