/**
 * Per-tenant quotas: how many sandboxes a tenant may have; how much memory
 * its running sandboxes and their warm standbys may be granted in total (the
 * sum of their memory limits, which is what the host has promised them);
 * the sum of its sandboxes' CPU weights; and the bytes its checkpoints and
 * snapshots keep in the store (maxCheckpointMb counts both: snapshots
 * outlive their sandboxes, so their bytes must not escape the quota).
 */
import type Database from 'better-sqlite3';
import { LockstepError } from '../errors.js';
import { tenantById, type Tenant } from './tenants.js';

/** The quota a refusal names. */
export type QuotaName = 'maxSandboxes' | 'maxMemoryMb' | 'maxCpuWeight' | 'maxCheckpointMb';

const UNITS: Record<QuotaName, string> = {
  maxSandboxes: 'sandboxes',
  maxMemoryMb: 'MiB of memory',
  maxCpuWeight: 'CPU weight in total',
  maxCheckpointMb: 'MiB of checkpoints and snapshots',
};

/** The request would take a tenant past one of its quotas. */
export class QuotaExceededError extends LockstepError {
  constructor(tenant: string, quota: QuotaName, limit: number, used: number, requested: number) {
    const what = UNITS[quota];
    const note = quota === 'maxMemoryMb' ? ' (running sandboxes and their warm standbys count)' : '';
    super(
      'QUOTA_EXCEEDED',
      `Tenant ${tenant} may have at most ${limit} ${what}; it has ${used} and asked for ${requested} more${note}`,
      {
        details: { tenant, quota, limit, used, requested },
      },
    );
  }
}

/** What a tenant holds now. */
export interface TenantUsage {
  sandboxes: number;
  /** Memory limits of its running (and creating) sandboxes, MiB. */
  memoryMb: number;
  /** Memory limits of its sandboxes' warm standbys, MiB (they count against maxMemoryMb too). */
  standbyMemoryMb: number;
  /** Sum of the CPU weights of its running (and creating) sandboxes. */
  cpuWeight: number;
  /** Bytes its checkpoints keep in the store (process images plus layer sizes), MiB, rounded up. */
  checkpointMb: number;
  /**
   * Bytes its snapshots keep beyond those (a snapshot of a checkpoint that still
   * exists shares its files and adds nothing until the checkpoint goes), MiB, rounded up.
   */
  snapshotMb: number;
}

const MiB = 1024 * 1024;

/**
 * Sandboxes count while they exist; memory and CPU weight while they are (or
 * are becoming) running; a warm standby's memory while it exists (it is a
 * whole restored copy of the sandbox, frozen); a checkpoint's bytes until it
 * is deleted. A checkpoint's bytes are its process image plus the bytes its
 * layer referenced when it was taken (recorded in its sizes).
 */
export function tenantUsage(db: Database.Database, tenant: string /* the tenant's id */): TenantUsage {
  const r = db
    .prepare(
      `SELECT COUNT(*) AS n,
              COALESCE(SUM(CASE WHEN state IN ('creating', 'running') THEN memory_bytes ELSE 0 END), 0) AS bytes,
              COALESCE(SUM(CASE WHEN standby_instance IS NOT NULL THEN memory_bytes ELSE 0 END), 0) AS standby,
              COALESCE(SUM(CASE WHEN state IN ('creating', 'running')
                                THEN COALESCE(cpu_weight, 100) ELSE 0 END), 0) AS cpu
         FROM sandboxes WHERE tenant = ? AND state != 'removing'`,
    )
    .get(tenant) as { n: number; bytes: number; standby: number; cpu: number };
  return {
    sandboxes: r.n,
    memoryMb: Math.ceil(r.bytes / MiB),
    standbyMemoryMb: Math.ceil(r.standby / MiB),
    cpuWeight: r.cpu,
    checkpointMb: Math.ceil(checkpointBytes(db, tenant) / MiB),
    snapshotMb: Math.ceil(snapshotBytes(db, tenant) / MiB),
  };
}

/**
 * Bytes the tenant's snapshots hold that no checkpoint of it counts already:
 * an imported or pulled snapshot's files are its own; a snapshot made from a
 * checkpoint shares that checkpoint's layer and image, and counts once the
 * checkpoint (or its sandbox) is gone; two snapshots of one checkpoint count once.
 */
export function snapshotBytes(db: Database.Database, tenant: string): number {
  const r = db
    .prepare(
      `SELECT COALESCE(SUM(bytes), 0) AS bytes FROM (
         SELECT MAX(p.size_bytes) AS bytes FROM snapshots p
          WHERE p.tenant = ?
            AND NOT EXISTS (SELECT 1 FROM checkpoints c JOIN sandboxes s ON s.id = c.sandbox_id
                             WHERE c.id = p.process_image AND s.tenant = p.tenant)
          GROUP BY p.process_image)`,
    )
    .get(tenant) as { bytes: number };
  return r.bytes;
}

/** Everything maxCheckpointMb counts: checkpoints and snapshots. */
export function storedBytes(db: Database.Database, tenant: string): number {
  return checkpointBytes(db, tenant) + snapshotBytes(db, tenant);
}

/** Bytes a new snapshot of the tenant may still hold (Infinity without a quota). */
export function snapshotAllowance(db: Database.Database, tenant: Tenant): number {
  if (tenant.maxCheckpointMb === null) return Infinity;
  return Math.max(0, tenant.maxCheckpointMb * MiB - storedBytes(db, tenant.id));
}

/** Bytes the tenant's checkpoints keep in the store (removed sandboxes' checkpoints go with them). */
export function checkpointBytes(db: Database.Database, tenant: string): number {
  const r = db
    .prepare(
      `SELECT COALESCE(SUM(COALESCE(json_extract(c.sizes, '$.processImageBytes'), 0)
                        + COALESCE(json_extract(c.sizes, '$.layerBytes'), 0)), 0) AS bytes
         FROM checkpoints c JOIN sandboxes s ON s.id = c.sandbox_id WHERE s.tenant = ?`,
    )
    .get(tenant) as { bytes: number };
  return r.bytes;
}

/** Throws QUOTA_EXCEEDED if `count` more sandboxes of `memoryMb` (and `cpuWeight`) each would not fit. */
export function checkQuota(
  db: Database.Database,
  tenant: Tenant,
  want: { count: number; memoryMb: number; cpuWeight?: number | undefined },
): void {
  const used = tenantUsage(db, tenant.id);
  if (tenant.maxSandboxes !== null && used.sandboxes + want.count > tenant.maxSandboxes) {
    throw new QuotaExceededError(tenant.name, 'maxSandboxes', tenant.maxSandboxes, used.sandboxes, want.count);
  }
  const mem = want.count * want.memoryMb;
  const memUsed = used.memoryMb + used.standbyMemoryMb;
  if (tenant.maxMemoryMb !== null && memUsed + mem > tenant.maxMemoryMb) {
    throw new QuotaExceededError(tenant.name, 'maxMemoryMb', tenant.maxMemoryMb, memUsed, mem);
  }
  const cpu = want.count * (want.cpuWeight ?? tenant.cpuWeight ?? 100);
  if (tenant.maxCpuWeight !== null && used.cpuWeight + cpu > tenant.maxCpuWeight) {
    throw new QuotaExceededError(tenant.name, 'maxCpuWeight', tenant.maxCpuWeight, used.cpuWeight, cpu);
  }
}

/** Throws QUOTA_EXCEEDED (maxMemoryMb) if a warm standby of a sandbox with this memory limit would not fit. */
export function checkStandbyQuota(db: Database.Database, tenant: Tenant, memoryBytes: number): void {
  if (tenant.maxMemoryMb === null) return;
  const used = tenantUsage(db, tenant.id);
  const want = Math.ceil(memoryBytes / MiB);
  if (used.memoryMb + used.standbyMemoryMb + want > tenant.maxMemoryMb) {
    throw new QuotaExceededError(
      tenant.name,
      'maxMemoryMb',
      tenant.maxMemoryMb,
      used.memoryMb + used.standbyMemoryMb,
      want,
    );
  }
}

/**
 * Throws QUOTA_EXCEEDED (maxCheckpointMb) if `bytes` more stored (a new
 * checkpoint, an imported or pulled snapshot) would take the tenant past its
 * stored bytes (checkpoints and snapshots); a tenant already over it gets
 * nothing more, not even a snapshot that shares a checkpoint's files (0 bytes).
 */
export function checkStoredQuota(db: Database.Database, tenant: Tenant, bytes: number): void {
  if (tenant.maxCheckpointMb === null) return;
  const used = storedBytes(db, tenant.id);
  if (used + bytes > tenant.maxCheckpointMb * MiB) {
    throw new QuotaExceededError(
      tenant.name,
      'maxCheckpointMb',
      tenant.maxCheckpointMb,
      Math.ceil(used / MiB),
      Math.ceil(bytes / MiB),
    );
  }
}

/**
 * The tenant of a sandbox, when it has one that is still registered (the SDK may
 * name tenants the table does not know).
 */
export function tenantOf(db: Database.Database, tenantId: string | null): Tenant | undefined {
  return tenantId === null ? undefined : tenantById(db, tenantId);
}

/**
 * Serialises check-then-create per tenant within this process, so that two
 * concurrent creates cannot both pass the check and together overshoot.
 * (Another process creating sandboxes for the same tenant is not covered;
 * the HTTP server is the only place tenants create sandboxes.)
 */
export class QuotaGate {
  private readonly chains = new Map<string, Promise<unknown>>();

  async run<T>(tenant: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.chains.get(tenant) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(fn);
    const tail = next.catch(() => undefined);
    this.chains.set(tenant, tail);
    try {
      return await next;
    } finally {
      if (this.chains.get(tenant) === tail) this.chains.delete(tenant);
    }
  }
}
