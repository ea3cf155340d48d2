/**
 * Per-tenant quotas: how many sandboxes a tenant may have; how much memory
 * its running sandboxes and their warm standbys may be granted in total (the
 * sum of their memory limits, which is what the host has promised them);
 * the sum of its sandboxes' CPU weights; and the bytes its checkpoints and
 * snapshots keep in the store (maxCheckpointMb counts both: snapshots
 * outlive their sandboxes, so their bytes must not escape the quota); and
 * everything it may hold in the layer store (maxDiskMb: its writable
 * layers' disk limits, what they may grow to, plus those stored bytes).
 *
 * The checks run inside the verbs (create, fork, checkpoint, import, start
 * from a snapshot), in the catalog transaction that records what they make,
 * so that SDK callers are bounded as HTTP ones are and two concurrent verbs
 * cannot both fit the last room. An import's bytes are not in the catalog
 * until it commits: while it spools, they are held as a reservation
 * (StoreReservation), which every check counts.
 */
import type Database from 'better-sqlite3';
import { LimitUnsupportedError, LockstepError } from '../errors.js';
import { tenantById, type Tenant } from './tenants.js';

/** The quota a refusal names. */
export type QuotaName = 'maxSandboxes' | 'maxMemoryMb' | 'maxCpuWeight' | 'maxCheckpointMb' | 'maxDiskMb';

const UNITS: Record<QuotaName, string> = {
  maxSandboxes: 'sandboxes',
  maxMemoryMb: 'MiB of memory',
  maxCpuWeight: 'CPU weight in total',
  maxCheckpointMb: 'MiB of checkpoints and snapshots',
  maxDiskMb: "MiB of disk (writable layers' limits, checkpoints and snapshots)",
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
  /** Bytes imports of it now spooling have reserved, MiB, rounded up. */
  importingMb: number;
  /** What maxDiskMb counts: its writable layers' disk limits, checkpoints, snapshots and imports, MiB, rounded up. */
  diskMb: number;
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
              COALESCE(SUM(CASE WHEN EXISTS (SELECT 1 FROM instances i WHERE i.sandbox_id = sandboxes.id AND i.role = 'standby')
                                THEN memory_bytes ELSE 0 END), 0) AS standby,
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
    importingMb: Math.ceil(reservedBytes(db, tenant) / MiB),
    diskMb: Math.ceil(diskBytes(db, tenant) / MiB),
  };
}

/**
 * Bytes in the store that an import still spooling holds for a tenant: its
 * bundle's claimed size at first, grown as more arrives, released when the
 * import commits (its snapshot's row counts from then on) or fails. One per
 * import; every quota check of the tenant counts all of them but the
 * caller's own.
 */
export class StoreReservation {
  private held = 0;
  private released = false;

  constructor(
    private readonly db: Database.Database,
    readonly tenant: Tenant,
  ) {}

  /** Bytes held now. */
  get bytes(): number {
    return this.held;
  }

  /**
   * Grows the reservation to `bytes`, in steps of at least RESERVE_STEP (so
   * that the check runs once a MiB, not once a chunk); throws QUOTA_EXCEEDED
   * (and keeps what it held) when even `bytes` would not fit.
   */
  grow(bytes: number): void {
    if (this.released) throw new Error('the reservation was released');
    if (bytes <= this.held) return;
    checkStoredQuota(this.db, this.tenant, bytes, this);
    let want = Math.max(bytes, this.held + RESERVE_STEP);
    try {
      checkStoredQuota(this.db, this.tenant, want, this);
    } catch {
      want = bytes; // the step does not fit, the bytes themselves do
    }
    this.held = want;
    held(this.db, this.tenant.id).set(this, want);
  }

  /** Lets go of the bytes (idempotent). */
  release(): void {
    this.released = true;
    this.held = 0;
    const m = reservations.get(this.db)?.get(this.tenant.id);
    m?.delete(this);
    if (m?.size === 0) reservations.get(this.db)!.delete(this.tenant.id);
  }
}

const RESERVE_STEP = MiB;

/** Per catalog, per tenant id: the reservations of imports in flight (this process: imports run in it). */
const reservations = new WeakMap<Database.Database, Map<string, Map<StoreReservation, number>>>();

function held(db: Database.Database, tenant: string): Map<StoreReservation, number> {
  let byTenant = reservations.get(db);
  if (!byTenant) reservations.set(db, (byTenant = new Map()));
  let m = byTenant.get(tenant);
  if (!m) byTenant.set(tenant, (m = new Map()));
  return m;
}

/** Bytes the tenant's imports in flight hold, but for `except` (the caller's own). */
export function reservedBytes(db: Database.Database, tenant: string, except?: StoreReservation): number {
  let n = 0;
  for (const [r, bytes] of reservations.get(db)?.get(tenant) ?? []) if (r !== except) n += bytes;
  return n;
}

/**
 * The disk limits of the tenant's writable layers (a sandbox's layer may
 * grow to its limit, so that is what it holds of the store). A sandbox
 * without one (made before every sandbox had a limit) counts nothing: a
 * tenant with maxDiskMb gets no new sandbox without a limit (create.ts).
 */
export function layerLimitBytes(db: Database.Database, tenant: string): number {
  const r = db
    .prepare(`SELECT COALESCE(SUM(disk_bytes), 0) AS bytes FROM sandboxes WHERE tenant = ? AND state != 'removing'`)
    .get(tenant) as { bytes: number };
  return r.bytes;
}

/** Everything maxDiskMb counts: writable layers' limits, checkpoints, snapshots, imports in flight. */
export function diskBytes(db: Database.Database, tenant: string, except?: StoreReservation): number {
  return layerLimitBytes(db, tenant) + storedBytes(db, tenant) + reservedBytes(db, tenant, except);
}

/**
 * Throws QUOTA_EXCEEDED (maxDiskMb) if `bytes` more of the store (new
 * writable layers' limits, a checkpoint, an import) would take the tenant
 * past maxDiskMb.
 */
export function checkDiskQuota(db: Database.Database, tenant: Tenant, bytes: number, own?: StoreReservation): void {
  if (tenant.maxDiskMb === null) return;
  const used = diskBytes(db, tenant.id, own);
  if (used + bytes > tenant.maxDiskMb * MiB) {
    throw new QuotaExceededError(
      tenant.name,
      'maxDiskMb',
      tenant.maxDiskMb,
      Math.ceil(used / MiB),
      Math.ceil(bytes / MiB),
    );
  }
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

/**
 * Throws QUOTA_EXCEEDED (maxSandboxes, maxMemoryMb, maxCpuWeight) if `count`
 * new sandboxes with this row's limits (a create's one, a fork's or a
 * start's children) would not fit, counted as tenantUsage counts them once
 * inserted. The verbs call it in the transaction that inserts the rows
 * (Catalog.tx, BEGIN IMMEDIATE: it holds SQLite's write lock from the count
 * on), so no other verb, in this process or another on the same catalog,
 * can take the room in between.
 */
export function checkSandboxQuota(
  db: Database.Database,
  tenant: Tenant | undefined,
  row: { memory_bytes: number | null; cpu_weight: number | null },
  count = 1,
): void {
  if (!tenant) return;
  checkQuota(db, tenant, {
    count,
    memoryMb: Math.ceil((row.memory_bytes ?? 0) / MiB),
    cpuWeight: row.cpu_weight ?? 100,
  });
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
 * Throws QUOTA_EXCEEDED (maxDiskMb) if `count` new writable layers of
 * `diskBytes` each would not fit; LIMIT_UNSUPPORTED when the tenant has
 * maxDiskMb and the layers would have no limit (a store without quotas):
 * such a layer could fill the store, so it cannot be counted.
 */
export function checkLayerQuota(
  db: Database.Database,
  tenant: Tenant | undefined,
  diskBytes: number | null,
  count = 1,
): void {
  if (!tenant || tenant.maxDiskMb === null) return;
  if (diskBytes === null)
    throw new LimitUnsupportedError(
      'diskMb',
      `tenant ${tenant.name} has a disk quota (maxDiskMb), and this store cannot limit a writable layer`,
    );
  checkDiskQuota(db, tenant, count * diskBytes);
}

/**
 * Throws QUOTA_EXCEEDED (maxCheckpointMb, then maxDiskMb) if `bytes` more
 * stored (a new checkpoint, an imported or pulled snapshot) would take the
 * tenant past its stored bytes (checkpoints, snapshots and the reservations
 * of imports in flight but `own`) or its disk; a tenant already over either
 * gets nothing more, not even a snapshot that shares a checkpoint's files (0 bytes).
 */
export function checkStoredQuota(db: Database.Database, tenant: Tenant, bytes: number, own?: StoreReservation): void {
  if (tenant.maxCheckpointMb === null) return checkDiskQuota(db, tenant, bytes, own);
  const used = storedBytes(db, tenant.id) + reservedBytes(db, tenant.id, own);
  if (used + bytes > tenant.maxCheckpointMb * MiB) {
    throw new QuotaExceededError(
      tenant.name,
      'maxCheckpointMb',
      tenant.maxCheckpointMb,
      Math.ceil(used / MiB),
      Math.ceil(bytes / MiB),
    );
  }
  checkDiskQuota(db, tenant, bytes, own);
}

/**
 * The tenant of a sandbox, when it has one that is still registered (the SDK may
 * name tenants the table does not know).
 */
export function tenantOf(db: Database.Database, tenantId: string | null): Tenant | undefined {
  return tenantId === null ? undefined : tenantById(db, tenantId);
}

/**
 * Serialises async work per tenant within this process. The quotas do not
 * need it: the verbs check them in the transaction that inserts the rows
 * (checkSandboxQuota), which also covers other processes.
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
