/** Verb: create a sandbox (cgroup, writable layer, overlay root, namespaces, init). */
import { newId, type SandboxRow } from '../catalog/catalog.js';
import { InvalidArgumentError } from '../errors.js';
import type { Engine } from '../engine.js';
import { validateImageName } from '../images/image-store.js';
import { hostOf } from '../engine.js';
import { freeIdBase } from './id-ranges.js';

export interface CreateOptions {
  image?: string | undefined;
  /** Memory limit in MiB (default 512). */
  memoryMb?: number | undefined;
  /** Maximum number of processes (default 256). */
  pids?: number | undefined;
  /** Environment every command in the sandbox gets. */
  envs?: Record<string, string> | undefined;
  metadata?: Record<string, string> | undefined;
  hostname?: string | undefined;
  tenant?: string | null | undefined;
  /** Lifetime: the sandbox is removed this many milliseconds after creation (like E2B's timeoutMs). */
  timeoutMs?: number | undefined;
}

export const LIMITS = {
  memoryMb: { min: 16, max: 1024 * 1024, default: 512 },
  pids: { min: 8, max: 1 << 22, default: 256 },
};

function intInRange(field: string, v: unknown, min: number, max: number, dflt: number): number {
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new InvalidArgumentError(field, `an integer from ${min} to ${max}`, v);
  }
  return v;
}

/** Validates create options at the edge. */
export function validateCreateOptions(opts: CreateOptions): Required<Pick<CreateOptions, 'image' | 'memoryMb' | 'pids'>> & CreateOptions {
  const image = validateImageName(opts.image ?? 'base');
  const memoryMb = intInRange('memoryMb', opts.memoryMb, LIMITS.memoryMb.min, LIMITS.memoryMb.max, LIMITS.memoryMb.default);
  const pids = intInRange('pids', opts.pids, LIMITS.pids.min, LIMITS.pids.max, LIMITS.pids.default);
  if (opts.timeoutMs !== undefined && (typeof opts.timeoutMs !== 'number' || !Number.isInteger(opts.timeoutMs) || opts.timeoutMs < 1000 || opts.timeoutMs > 30 * 24 * 3600 * 1000)) {
    throw new InvalidArgumentError('timeoutMs', 'an integer number of milliseconds from 1000 to 30 days', opts.timeoutMs);
  }
  if (opts.hostname !== undefined && (typeof opts.hostname !== 'string' || !/^[a-zA-Z0-9][a-zA-Z0-9-]{0,62}$/.test(opts.hostname))) {
    throw new InvalidArgumentError('hostname', 'a host name of letters, digits and "-" (at most 63)', opts.hostname);
  }
  for (const [field, obj] of [['envs', opts.envs], ['metadata', opts.metadata]] as const) {
    if (obj === undefined) continue;
    if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) throw new InvalidArgumentError(field, 'an object of string values', obj);
    for (const [k, v] of Object.entries(obj)) {
      if (typeof v !== 'string') throw new InvalidArgumentError(`${field}.${k}`, 'a string', v);
      if (field === 'envs' && !/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new InvalidArgumentError(`envs.${k}`, 'a name of letters, digits and "_"', k);
    }
  }
  return { ...opts, image, memoryMb, pids };
}

/** Creates and starts a sandbox; on any failure everything made so far is removed. */
export async function createSandbox(engine: Engine, options: CreateOptions): Promise<SandboxRow> {
  const opts = validateCreateOptions(options);
  const image = engine.images.get(opts.image); // IMAGE_NOT_FOUND before anything is made
  const id = newId('sbx');
  const runtimeLayer = engine.runtime.ensureRuntimeLayer();
  const row: SandboxRow = {
    id,
    tenant: opts.tenant ?? null,
    image: image.name,
    runtime_layer: runtimeLayer,
    state: 'creating',
    init_pid: null,
    init_start: null,
    memory_bytes: opts.memoryMb * 1024 * 1024,
    pids_max: opts.pids,
    hostname: opts.hostname ?? id.replace(/_/g, '-'),
    lineage_id: newId('lin'),
    branch_id: newId('br'),
    head_checkpoint_id: null,
    forked_from: null,
    env: JSON.stringify(opts.envs ?? {}),
    metadata: JSON.stringify(opts.metadata ?? {}),
    created_at: Date.now(),
    expires_at: opts.timeoutMs ? Date.now() + opts.timeoutMs : null,
    instance: id,
    standby_instance: null,
    standby_checkpoint: null,
    standby_pid: null,
    standby_start: null,
    id_base: null,
  };
  // The row goes in first, marked "creating": after a crash the reaper finds
  // it and removes whatever part of the sandbox exists.
  engine.catalog.tx(() => {
    if (engine.userNamespaces) row.id_base = freeIdBase(engine.catalog);
    engine.catalog.insertSandbox(row);
  });
  const log = engine.log.child({ sandboxId: id });
  try {
    engine.runtime.prepare(id, { memoryBytes: row.memory_bytes ?? undefined, pids: row.pids_max ?? undefined }, row.id_base);
    engine.layers.createUpper(id, row.id_base);
    engine.runtime.mountRoot(hostOf(engine, row));
    const { pid, start } = await engine.runtime.startInit(hostOf(engine, row));
    engine.catalog.tx(() => {
      engine.catalog.insertLayer(`upper_${id}`, 'upper', id);
      engine.catalog.updateSandbox(id, { state: 'running', init_pid: pid, init_start: start });
    });
    log.info({ pid, image: image.name }, 'sandbox created');
    return engine.catalog.sandbox(id)!;
  } catch (e) {
    log.warn({ err: e }, 'sandbox creation failed; cleaning up');
    await engine.runtime.destroy(id).catch((err) => log.error({ err }, 'cleanup after failed create'));
    engine.catalog.deleteSandboxRow(id);
    throw e;
  }
}
