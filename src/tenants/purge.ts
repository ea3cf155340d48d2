/**
 * `tenant rm --force`: removes a tenant together with everything it has.
 * Its token is revoked first (so it cannot create more while this runs),
 * then each of its sandboxes is torn down like `lockstep rm` does
 * (processes, mounts, layers, checkpoints, rows), and only then does the
 * tenant row go. If a sandbox cannot be removed the tenant stays (revoked),
 * and running the command again finishes the job.
 */
import { InvalidStateError } from '../errors.js';
import { removeSandbox } from '../lifecycle/remove.js';
import { deleteSnapshot } from '../snapshots/snapshots.js';
import { SnapshotRows } from '../snapshots/snapshot-rows.js';
import { removeTenant, revokeTenantToken } from './tenants.js';
import type { RemoveDeps } from '../lifecycle/remove.js';
import type { SnapshotsDeps } from '../snapshots/snapshots.js';
import type { Catalog } from '../catalog/catalog.js';
import type { Logger } from '../log.js';

/** What purge.ts uses of the manager's services (api/engine.ts builds them). */
export interface PurgeDeps extends RemoveDeps, SnapshotsDeps {
  catalog: Catalog;
  log: Logger;
  withSandboxLock<T>(id: string, fn: () => Promise<T>, opts?: { timeoutMs?: number }): Promise<T>;
}

/** What a purge removed. */
export interface PurgeReport {
  tenant: string;
  tenantId: string;
  sandboxes: string[];
}

/** Removes a tenant with everything it has (Tenants.purge, `tenant rm --force`). */
export async function purgeTenantOf(engine: PurgeDeps, name: string): Promise<PurgeReport> {
  const db = engine.catalog.db;
  const tenant = revokeTenantToken(db, name);
  const removed: string[] = [];
  const failed: string[] = [];
  const ofTenant = () =>
    (
      db.prepare('SELECT id FROM sandboxes WHERE tenant = ? ORDER BY created_at').all(tenant.id) as { id: string }[]
    ).map((r) => r.id);
  // A create that had passed authentication before the revocation may still
  // land a sandbox: go round until none is left (bounded).
  for (let round = 0; round < 3; round++) {
    const ids = ofTenant().filter((id) => !failed.includes(id));
    if (ids.length === 0) break;
    for (const id of ids) {
      try {
        // Any state, 'removing' included: finish what an earlier attempt began.
        await engine.withSandboxLock(id, () => removeSandbox(engine, id));
        removed.push(id);
      } catch (err) {
        engine.log.warn(
          { err, sandboxId: id, tenant: tenant.name },
          'could not remove a sandbox of a tenant being removed',
        );
        failed.push(id);
      }
    }
  }
  const left = ofTenant();
  if (left.length > 0) {
    throw new InvalidStateError(
      'TENANT_HAS_SANDBOXES',
      `Tenant ${name} is revoked, but ${left.length} of its sandboxes could not ` +
        `be removed (${left.join(', ')}); run the removal again`,
      {
        tenant: name,
        sandboxes: left.length,
      },
    );
  }
  // Its snapshots too: nobody else could ever see them (their files go once nothing holds them).
  for (const snap of new SnapshotRows(db).list(tenant.id)) await deleteSnapshot(engine, snap.id, tenant.id);
  removeTenant(db, name);
  return { tenant: tenant.name, tenantId: tenant.id, sandboxes: removed };
}
