/** Tenants of a shared Lockstep: bearer tokens and quotas. */
import type { Lockstep } from './lockstep.js';
import type { PurgeReport } from '../tenants/purge.js';
export {
  migrateTenants,
  addTenant,
  removeTenant,
  revokeTenantToken,
  newTenantId,
  listTenants,
  getTenant,
  authenticate,
  validateTenantName,
  TOKEN_PREFIX,
  type Tenant,
  type TenantQuotas,
} from '../tenants/tenants.js';
export {
  QuotaExceededError,
  QuotaGate,
  checkQuota,
  checkStandbyQuota,
  checkStoredQuota,
  tenantUsage,
  type TenantUsage,
  type QuotaName,
} from '../tenants/quotas.js';
export type { PurgeReport } from '../tenants/purge.js';
export { Tenants } from './tenants.js';
export { StoredReplies, type StoredReply, type StoredResponse } from '../tenants/replies.js';

/** Removes a tenant with everything it has (the same as `ls.tenants.purge(name)`). */
export function purgeTenant(ls: Lockstep, name: string): Promise<PurgeReport> {
  return ls.tenants.purge(name);
}
