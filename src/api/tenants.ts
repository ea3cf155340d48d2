/**
 * The tenants of a state directory as one object, `lockstep.tenants`: what
 * the CLI's `tenant` commands and the HTTP server's authentication, quotas
 * and idempotent replies use, so that no front end touches the catalog's
 * database. The functions it calls (tenants.ts, quotas.ts, purge.ts,
 * replies.ts) hold the rules.
 */
import type { Engine } from './engine.js';
import {
  addTenant,
  authenticate,
  getTenant,
  listTenants,
  removeTenant,
  tenantById,
  type Tenant,
  type TenantQuotas,
} from '../tenants/tenants.js';
import { checkQuota, tenantUsage, type TenantUsage } from '../tenants/quotas.js';
import { purgeTenantOf, type PurgeReport } from '../tenants/purge.js';
import { StoredReplies } from '../tenants/replies.js';

/** Tenants: bearer tokens, quotas, usage, and their stored idempotent replies. */
export class Tenants {
  private storedReplies: StoredReplies | undefined;

  /** @internal */
  constructor(private readonly engine: Engine) {}

  /**
   * What tenants' idempotent requests answered, kept per (tenant id, key) and
   * removed with the tenant. Its table is created on first use.
   */
  get replies(): StoredReplies {
    return (this.storedReplies ??= new StoredReplies(this.engine.catalog.db));
  }

  /** Adds a tenant; returns it with its bearer token, which is not stored and cannot be shown again. */
  add(name: string, quotas: TenantQuotas = {}): { tenant: Tenant; token: string } {
    return addTenant(this.engine.catalog.db, name, quotas);
  }

  /** One tenant by name, or TENANT_NOT_FOUND. */
  get(name: string): Tenant {
    return getTenant(this.engine.catalog.db, name);
  }

  /** The tenant with this id (what its sandboxes and records are keyed by), or undefined. */
  byId(id: string): Tenant | undefined {
    return tenantById(this.engine.catalog.db, id);
  }

  /** Every tenant, by name. */
  list(): Tenant[] {
    return listTenants(this.engine.catalog.db);
  }

  /** What the tenant with this id holds now (sandboxes, memory, CPU weight, checkpoint bytes). */
  usage(id: string): TenantUsage {
    return tenantUsage(this.engine.catalog.db, id);
  }

  /** Throws QUOTA_EXCEEDED if `count` more sandboxes of `memoryMb` (and `cpuWeight`) each would not fit. */
  checkQuota(tenant: Tenant, want: { count: number; memoryMb: number; cpuWeight?: number | undefined }): void {
    checkQuota(this.engine.catalog.db, tenant, want);
  }

  /** The tenant a bearer token belongs to, or undefined. */
  authenticate(token: unknown): Tenant | undefined {
    return authenticate(this.engine.catalog.db, token);
  }

  /** Removes a tenant (its token is revoked at once); TENANT_HAS_SANDBOXES while it has any. */
  remove(name: string): void {
    removeTenant(this.engine.catalog.db, name);
  }

  /**
   * Removes a tenant with everything it has (`tenant rm --force`): token first, then
   * its sandboxes, then the tenant.
   */
  purge(name: string): Promise<PurgeReport> {
    return purgeTenantOf(this.engine, name);
  }
}
