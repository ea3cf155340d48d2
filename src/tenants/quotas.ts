/**
 * Per-tenant quotas: how many sandboxes a tenant may have, and how much
 * memory its running sandboxes may be granted in total (the sum of their
 * memory limits, which is what the host has promised them).
 */
import type Database from 'better-sqlite3';
import { LockstepError } from '../errors.js';
import type { Tenant } from './tenants.js';

/** The request would take a tenant past one of its quotas. */
export class QuotaExceededError extends LockstepError {
  constructor(tenant: string, quota: 'maxSandboxes' | 'maxMemoryMb', limit: number, used: number, requested: number) {
    const what = quota === 'maxSandboxes' ? 'sandboxes' : 'MiB of memory';
    super('QUOTA_EXCEEDED', `Tenant ${tenant} may have at most ${limit} ${what}; it has ${used} and asked for ${requested} more`, {
      details: { tenant, quota, limit, used, requested },
    });
  }
}

/** What a tenant holds now. */
export interface TenantUsage {
  sandboxes: number;
  memoryMb: number;
}

/** Sandboxes count while they exist; memory counts while they are (or are becoming) running. `tenantId` is the tenant's id. */
export function tenantUsage(db: Database.Database, tenantId: string): TenantUsage {
  const r = db
    .prepare(
      `SELECT COUNT(*) AS n,
              COALESCE(SUM(CASE WHEN state IN ('creating', 'running') THEN memory_bytes ELSE 0 END), 0) AS bytes
         FROM sandboxes WHERE tenant = ? AND state != 'removing'`,
    )
    .get(tenantId) as { n: number; bytes: number };
  return { sandboxes: r.n, memoryMb: Math.ceil(r.bytes / (1024 * 1024)) };
}

/** Throws QUOTA_EXCEEDED if `count` more sandboxes of `memoryMb` each would not fit. */
export function checkQuota(db: Database.Database, tenant: Tenant, want: { count: number; memoryMb: number }): void {
  const used = tenantUsage(db, tenant.id);
  if (tenant.maxSandboxes !== null && used.sandboxes + want.count > tenant.maxSandboxes) {
    throw new QuotaExceededError(tenant.name, 'maxSandboxes', tenant.maxSandboxes, used.sandboxes, want.count);
  }
  const mem = want.count * want.memoryMb;
  if (tenant.maxMemoryMb !== null && used.memoryMb + mem > tenant.maxMemoryMb) {
    throw new QuotaExceededError(tenant.name, 'maxMemoryMb', tenant.maxMemoryMb, used.memoryMb, mem);
  }
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
