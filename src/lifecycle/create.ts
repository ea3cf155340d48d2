/** Verb: create a sandbox (cgroup, writable layer, overlay root, namespaces, init). */
import { newId, type SandboxRow } from '../catalog/catalog.js';
import { InvalidArgumentError, InvalidStateError, LimitUnsupportedError } from '../errors.js';
import { CPU_PERIOD_US, type CgroupLimits } from '../host/cgroups.js';
import { validateImageName } from '../images/image-store.js';
import { SANDBOX_LIFETIME_MS } from '../limits.js';
import { hostOf } from './instance-host.js';
import { freeIdBase } from '../instances/id-ranges.js';
import { validateNetworkOptions, type NetworkMode, type NetworkOptions } from '../host/network/policy.js';
import { freeSlot } from '../host/network/addresses.js';
import { attachNewSandbox, forgetNetwork } from '../network/sandbox-network.js';
import { checkLayerQuota, checkSandboxQuota, tenantOf } from '../tenants/quotas.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { Catalog } from '../catalog/catalog.js';
import type { CgroupDriver } from '../host/cgroups.js';
import type { ImageStore } from '../images/image-store.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { LayerPort } from '../ports.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';

/** What create.ts uses of the manager's services (api/engine.ts builds them). */
export interface CreateDeps extends SandboxNetworkDeps {
  catalog: Catalog;
  cgroups: CgroupDriver;
  config: LockstepConfig;
  images: ImageStore;
  inits: InitWatcher;
  layers: LayerPort;
  log: Logger;
  runtime: SandboxRuntime;
  userNamespaces: boolean;
}

export interface CreateOptions extends NetworkOptions {
  image?: string | undefined;
  /** Memory limit in MiB (default 512). */
  memoryMb?: number | undefined;
  /** Maximum number of processes (default 256). */
  pids?: number | undefined;
  /**
   * Relative CPU weight, on the cgroup v2 scale: 1-10000, default 100 (or the
   * tenant's default). Under contention a sandbox with weight 400 gets four
   * times the CPU of one with 100; on cgroup v1 it is written as
   * cpu.shares = weight * 1024 / 100, which keeps the ratios.
   */
  cpuWeight?: number | undefined;
  /** Hard CPU cap in CPUs (0.01-1024, two decimals): 0.5 is half of one core. Default: no cap. */
  cpus?: number | undefined;
  /** Relative I/O weight, 1-1000; refused (LIMIT_UNSUPPORTED) on a host where no weight would take effect. */
  ioWeight?: number | undefined;
  /**
   * Disk quota of the writable layer in MiB: a write past it fails with
   * EDQUOT inside the sandbox. Default: the manager's defaultDiskMb
   * (LOCKSTEP_DEFAULT_DISK_MB, 2048) wherever the store can have quotas.
   */
  diskMb?: number | undefined;
  /** Environment every command in the sandbox gets. */
  envs?: Record<string, string> | undefined;
  metadata?: Record<string, string> | undefined;
  hostname?: string | undefined;
  /** Id (tn_…) of the owning tenant, never its name (names can be reused after a tenant is removed). */
  tenant?: string | null | undefined;
  /** Lifetime: the sandbox is removed this many milliseconds after creation (like E2B's timeoutMs). */
  timeoutMs?: number | undefined;
  /**
   * Progress lines while the image is made on first use (a shipped recipe
   * not yet in this state directory is built, or linked from the build
   * cache, before the sandbox starts). Not called when the image is there.
   */
  onProgress?: ((message: string) => void) | undefined;
  /** Start from a snapshot (id or name) instead of an image: see Lockstep.create. */
  fromSnapshot?: string | undefined;
}

export const LIMITS = {
  memoryMb: { min: 16, max: 1024 * 1024, default: 512 },
  pids: { min: 8, max: 1 << 22, default: 256 },
  cpuWeight: { min: 1, max: 10_000, default: 100 },
  cpus: { min: 0.01, max: 1024 },
  ioWeight: { min: 1, max: 1000 },
  diskMb: { min: 1, max: 1 << 24 },
};

/** The sandbox's resource limits as its catalog row records them (forks, standbys and rollbacks reuse these). */
export function limitsOf(row: SandboxRow): CgroupLimits {
  return {
    memoryBytes: row.memory_bytes ?? undefined,
    pids: row.pids_max ?? undefined,
    cpuWeight: row.cpu_weight ?? undefined,
    cpuQuotaUs: row.cpu_quota_us ?? undefined,
    ioWeight: row.io_weight ?? undefined,
  };
}

/**
 * cpus (0.5) as microseconds of CPU per period; undefined when absent,
 * INVALID_ARGUMENT when not a multiple of 0.01 in range.
 */
function cpuQuota(v: unknown): number | undefined {
  if (v === undefined || v === null) return undefined;
  const centis = typeof v === 'number' ? Math.round(v * 100) : NaN;
  if (
    typeof v !== 'number' ||
    !Number.isFinite(v) ||
    v < LIMITS.cpus.min ||
    v > LIMITS.cpus.max ||
    Math.abs(centis - v * 100) > 1e-6
  ) {
    throw new InvalidArgumentError(
      'cpus',
      `a number of CPUs from ${LIMITS.cpus.min} to ${LIMITS.cpus.max} with at most two decimals`,
      v,
    );
  }
  return (centis * CPU_PERIOD_US) / 100;
}

function intInRange(field: string, v: unknown, min: number, max: number, dflt: number): number {
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new InvalidArgumentError(field, `an integer from ${min} to ${max}`, v);
  }
  return v;
}

/** Validates create options at the edge. */
export function validateCreateOptions(
  opts: CreateOptions,
): Required<Pick<CreateOptions, 'image' | 'memoryMb' | 'pids'>> & CreateOptions {
  const image = validateImageName(opts.image ?? 'base');
  const memoryMb = intInRange(
    'memoryMb',
    opts.memoryMb,
    LIMITS.memoryMb.min,
    LIMITS.memoryMb.max,
    LIMITS.memoryMb.default,
  );
  const pids = intInRange('pids', opts.pids, LIMITS.pids.min, LIMITS.pids.max, LIMITS.pids.default);
  const cpuWeight = intInRange(
    'cpuWeight',
    opts.cpuWeight,
    LIMITS.cpuWeight.min,
    LIMITS.cpuWeight.max,
    LIMITS.cpuWeight.default,
  );
  cpuQuota(opts.cpus);
  if (opts.ioWeight !== undefined) intInRange('ioWeight', opts.ioWeight, LIMITS.ioWeight.min, LIMITS.ioWeight.max, 0);
  if (opts.diskMb !== undefined) intInRange('diskMb', opts.diskMb, LIMITS.diskMb.min, LIMITS.diskMb.max, 0);
  if (
    opts.timeoutMs !== undefined &&
    (typeof opts.timeoutMs !== 'number' ||
      !Number.isInteger(opts.timeoutMs) ||
      opts.timeoutMs < SANDBOX_LIFETIME_MS.min ||
      opts.timeoutMs > SANDBOX_LIFETIME_MS.max)
  ) {
    throw new InvalidArgumentError(
      'timeoutMs',
      'an integer number of milliseconds from 1000 to 30 days',
      opts.timeoutMs,
    );
  }
  if (
    opts.hostname !== undefined &&
    (typeof opts.hostname !== 'string' || !/^[a-zA-Z0-9][a-zA-Z0-9-]{0,62}$/.test(opts.hostname))
  ) {
    throw new InvalidArgumentError('hostname', 'a host name of letters, digits and "-" (at most 63)', opts.hostname);
  }
  for (const [field, obj] of [
    ['envs', opts.envs],
    ['metadata', opts.metadata],
  ] as const) {
    if (obj === undefined) continue;
    if (typeof obj !== 'object' || obj === null || Array.isArray(obj))
      throw new InvalidArgumentError(field, 'an object of string values', obj);
    for (const [k, v] of Object.entries(obj)) {
      if (typeof v !== 'string') throw new InvalidArgumentError(`${field}.${k}`, 'a string', v);
      if (field === 'envs' && !/^[A-Za-z_][A-Za-z0-9_]*$/.test(k))
        throw new InvalidArgumentError(`envs.${k}`, 'a name of letters, digits and "_"', k);
    }
  }
  return { ...opts, image, memoryMb, pids, cpuWeight: opts.cpuWeight === undefined ? undefined : cpuWeight };
}

/**
 * Refuses, before anything is made, a limit this host cannot enforce: an I/O
 * weight where no scheduler honours one, a CPU limit without the cpu
 * controller, a disk quota on a store that cannot have quotas.
 */
function checkEnforceable(engine: CreateDeps, opts: CreateOptions): void {
  if ((opts.cpuWeight !== undefined || opts.cpus !== undefined) && !engine.cgroups.cpuControl) {
    throw new LimitUnsupportedError(
      opts.cpus !== undefined ? 'cpus' : 'cpuWeight',
      'the cpu cgroup controller is not available on this host',
    );
  }
  if (opts.ioWeight !== undefined) {
    const io = engine.cgroups.ioWeightSupport();
    if (!io.ok) throw new LimitUnsupportedError('ioWeight', io.detail);
  }
  if (opts.diskMb !== undefined) {
    const why = engine.layers.quotaUnavailable();
    if (why) throw new LimitUnsupportedError('diskMb', why);
  }
}

/**
 * The disk limit (bytes) of a new writable layer: the create's diskMb, else
 * the manager's default, wherever the store can have quotas (null: none can
 * be had, LOCKSTEP_DISK_QUOTA=off or a host btrfs without them). Forks and
 * starts from a snapshot made without one get the default too.
 */
export function diskBytesFor(engine: CreateDeps, diskBytes: number | null | undefined): number | null {
  if (diskBytes !== undefined && diskBytes !== null) return diskBytes;
  return engine.layers.quotaUnavailable() === undefined ? engine.config.defaultDiskMb * 1024 * 1024 : null;
}

/** The CPU weight a tenant's sandbox gets when the request names none (its tenant's default). */
function defaultCpuWeight(engine: CreateDeps, tenantId: string | null | undefined): number {
  return tenantOf(engine.catalog.db, tenantId ?? null)?.cpuWeight ?? LIMITS.cpuWeight.default;
}

/**
 * The disk limit of a new sandbox that names none: the manager's default,
 * but never more than its tenant's whole maxDiskMb (a tenant capped below
 * the default still creates sandboxes, each as large as its cap allows).
 */
function defaultDiskBytes(engine: CreateDeps, tenantId: string | null | undefined): number | null {
  const bytes = diskBytesFor(engine, undefined);
  const cap = tenantOf(engine.catalog.db, tenantId ?? null)?.maxDiskMb;
  return bytes !== null && cap != null ? Math.min(bytes, cap * 1024 * 1024) : bytes;
}

/**
 * The network policy of a new sandbox: the tenant's default mode when the
 * request names none, refused (NETWORK_NOT_ALLOWED) past the tenant's limit.
 */
export function networkPolicyFor(engine: CreateDeps, opts: NetworkOptions, tenantId: string | null | undefined) {
  const tenant = tenantId ? tenantOf(engine.catalog.db, tenantId) : undefined;
  const policy = validateNetworkOptions(opts, tenant?.network ?? 'none');
  if (policy && tenant?.maxNetwork === 'none')
    throw new InvalidStateError(
      'NETWORK_NOT_ALLOWED',
      `Tenant ${tenant.name} may create sandboxes with network "none" only`,
      { tenant: tenant.name, network: 'egress' satisfies NetworkMode, maxNetwork: tenant.maxNetwork },
    );
  return policy;
}

/** Creates and starts a sandbox; on any failure everything made so far is removed. */
export async function createSandbox(engine: CreateDeps, options: CreateOptions): Promise<SandboxRow> {
  const opts = validateCreateOptions(options);
  if (opts.onProgress !== undefined && typeof opts.onProgress !== 'function')
    throw new InvalidArgumentError('onProgress', 'a function (message) => void', opts.onProgress);
  // Refused before anything is made (an image built on first use included);
  // checked again, for good, in the transaction that inserts the row.
  const cpuWeight = opts.cpuWeight ?? defaultCpuWeight(engine, opts.tenant);
  const memoryBytes = opts.memoryMb * 1024 * 1024;
  const owner = () => tenantOf(engine.catalog.db, opts.tenant ?? null);
  checkSandboxQuota(engine.catalog.db, owner(), { memory_bytes: memoryBytes, cpu_weight: cpuWeight });
  const policy = networkPolicyFor(engine, opts, opts.tenant);
  // A shipped recipe is made on first use; any other missing name is
  // IMAGE_NOT_FOUND (naming the fix) before anything is made.
  const image = await engine.images.forCreate(opts.image, opts.onProgress);
  checkEnforceable(engine, opts);
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
    memory_bytes: memoryBytes,
    pids_max: opts.pids,
    cpu_weight: cpuWeight,
    cpu_quota_us: cpuQuota(opts.cpus) ?? null,
    io_weight: opts.ioWeight ?? null,
    disk_bytes: opts.diskMb === undefined ? defaultDiskBytes(engine, opts.tenant) : opts.diskMb * 1024 * 1024,
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
    id_base: null,
    network: policy ? JSON.stringify(policy) : null,
    net_slot: null,
  };
  // The row goes in first, marked "creating": after a crash the reaper finds
  // it and removes whatever part of the sandbox exists.
  // The tenant's quotas are checked here, in the verb, so that SDK callers and
  // other processes are bounded as HTTP ones are, and in the transaction that
  // inserts the row, which then counts for the next.
  engine.catalog.tx(() => {
    const tenant = owner();
    checkSandboxQuota(engine.catalog.db, tenant, row);
    checkLayerQuota(engine.catalog.db, tenant, row.disk_bytes);
    if (engine.userNamespaces) row.id_base = freeIdBase(engine.catalog);
    if (policy) row.net_slot = freeSlot(engine.catalog, engine.config.networkRange);
    engine.catalog.insertSandbox(row);
  });
  const log = engine.log.child({ sandboxId: id });
  try {
    engine.runtime.prepare(id, limitsOf(row), row.id_base);
    await engine.layers.createUpper(id, row.id_base);
    await engine.runtime.mountRoot(hostOf(engine, row));
    const { pid, start } = await engine.runtime.startInit(hostOf(engine, row));
    await attachNewSandbox(engine, row, pid);
    const created = engine.catalog.tx(() => {
      engine.catalog.insertLayer(`upper_${id}`, 'upper', id);
      return engine.catalog.updateSandbox(id, { state: 'running', init_pid: pid, init_start: start })!;
    });
    log.info({ pid, image: image.name }, 'sandbox created');
    engine.inits.track(created);
    return created;
  } catch (e) {
    log.warn({ err: e }, 'sandbox creation failed; cleaning up');
    await engine.runtime.destroy(id).catch((err) => log.error({ err }, 'cleanup after failed create'));
    await forgetNetwork(engine, row).catch((err) => log.error({ err }, 'network cleanup after failed create'));
    engine.catalog.deleteSandboxRow(id);
    throw e;
  }
}
