/** Tenants of a shared Lockstep: bearer tokens and quotas. */
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
} from './tenants.js';
export {
  QuotaExceededError,
  QuotaGate,
  checkQuota,
  checkStandbyQuota,
  checkStoredQuota,
  tenantUsage,
  type TenantUsage,
  type QuotaName,
} from './quotas.js';
export { purgeTenant, type PurgeReport } from './purge.js';
export { Tenants } from './registry.js';
export { StoredReplies, type StoredReply, type StoredResponse } from './replies.js';
