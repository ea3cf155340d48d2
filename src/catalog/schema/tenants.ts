/**
 * Tenants of a shared Lockstep (src/tenants/tenants.ts): an immutable id, a
 * name, the hash of a bearer token, and quotas.
 */
import type Database from 'better-sqlite3';
import { randomBytes } from 'node:crypto';
import { addColumn, hasTable } from './columns.js';

/** A new tenant id: "tn_" and 20 random base32 characters (100 bits). */
export function newTenantId(): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';
  return 'tn_' + [...randomBytes(20)].map((b) => alphabet[b & 31]).join('');
}

/**
 * Creates the tenants table, or brings one made by an older Lockstep to its
 * current columns (quotas added over time, then the id). Idempotent.
 *
 * Catalogs from before tenant ids: each tenant gets an id, and its
 * sandboxes and stored responses are re-keyed from its name to that id.
 * Rows left by a tenant removed before (keyed by a name no tenant has) keep
 * that name, which no id can equal: no tenant ever sees them.
 */
export function tenantsTable(db: Database.Database): void {
  db.exec(`
CREATE TABLE IF NOT EXISTS tenants (
  name          TEXT PRIMARY KEY,
  token_hash    BLOB NOT NULL UNIQUE,
  created_at    INTEGER NOT NULL,
  max_sandboxes INTEGER,
  max_memory_mb INTEGER,
  id            TEXT
);`);
  // CPU and checkpoint quotas came later, maxDiskMb (issue 23) later still.
  for (const col of ['default_cpu_weight', 'max_cpu_weight', 'max_checkpoint_mb', 'max_disk_mb'])
    addColumn(db, 'tenants', col, 'INTEGER');
  // Network modes (issue 13).
  for (const col of ['default_network', 'max_network']) addColumn(db, 'tenants', col, 'TEXT');
  addColumn(db, 'tenants', 'id', 'TEXT');
  db.exec('CREATE UNIQUE INDEX IF NOT EXISTS tenants_id ON tenants(id)');
  const unkeyed = db.prepare('SELECT name FROM tenants WHERE id IS NULL').all() as { name: string }[];
  if (unkeyed.length === 0) return;
  const rekey = ['sandboxes', 'http_idempotency'].filter((t) => hasTable(db, t));
  for (const { name } of unkeyed) {
    const id = newTenantId();
    db.prepare('UPDATE tenants SET id = ? WHERE name = ?').run(id, name);
    for (const table of rekey) db.prepare(`UPDATE ${table} SET tenant = ? WHERE tenant = ?`).run(id, name);
  }
}
