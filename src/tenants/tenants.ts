/**
 * Tenants of a shared Lockstep: a name, the hash of a bearer token, and
 * quotas. The token is shown once, when the tenant is added; only its
 * sha256 is stored. Tokens are 32 random bytes, so a fast hash is enough:
 * slow password hashes (scrypt, argon2) exist for low-entropy secrets a
 * person chose, and would only slow down every request here.
 *
 * The table lives in the catalog database next to the sandboxes, whose
 * `tenant` column holds the tenant's name.
 */
import type Database from 'better-sqlite3';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { AlreadyExistsError, InvalidArgumentError, InvalidStateError, NotFoundError } from '../errors.js';

/** A tenant as callers see it (never the token or its hash). */
export interface Tenant {
  name: string;
  createdAt: string;
  /** Most sandboxes the tenant may have at once (null: no limit). */
  maxSandboxes: number | null;
  /** Most memory (MiB) its running sandboxes and their warm standbys may be granted in total (null: no limit). */
  maxMemoryMb: number | null;
  /** CPU weight of its sandboxes that name none (null: the default, 100). */
  cpuWeight: number | null;
  /** Most CPU weight its running sandboxes may have in total (null: no limit). */
  maxCpuWeight: number | null;
  /** Most MiB its checkpoints may keep in the store (null: no limit). */
  maxCheckpointMb: number | null;
}

/** Quotas given when a tenant is added. */
export interface TenantQuotas {
  maxSandboxes?: number | null | undefined;
  maxMemoryMb?: number | null | undefined;
  cpuWeight?: number | null | undefined;
  maxCpuWeight?: number | null | undefined;
  maxCheckpointMb?: number | null | undefined;
}

interface TenantRow {
  name: string;
  token_hash: Buffer;
  created_at: number;
  max_sandboxes: number | null;
  max_memory_mb: number | null;
  default_cpu_weight: number | null;
  max_cpu_weight: number | null;
  max_checkpoint_mb: number | null;
}

/** Prefix of every token, so that secret scanners and people can recognise one. */
export const TOKEN_PREFIX = 'lst_';
const NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/**
 * Creates the tenants table (idempotent). The catalog runs it inside its
 * migration transaction; callers that open a database the catalog did not
 * migrate may run it themselves.
 */
export function migrateTenants(db: Database.Database): void {
  db.exec(`
CREATE TABLE IF NOT EXISTS tenants (
  name          TEXT PRIMARY KEY,
  token_hash    BLOB NOT NULL UNIQUE,
  created_at    INTEGER NOT NULL,
  max_sandboxes INTEGER,
  max_memory_mb INTEGER
);`);
  // CPU and checkpoint quotas came later: tables made before lack them.
  const cols = (db.prepare('PRAGMA table_info(tenants)').all() as { name: string }[]).map((c) => c.name);
  for (const col of ['default_cpu_weight', 'max_cpu_weight', 'max_checkpoint_mb']) {
    if (!cols.includes(col)) db.exec(`ALTER TABLE tenants ADD COLUMN ${col} INTEGER`);
  }
}

/** Checks a tenant name: lower-case letters, digits, "-" and "_", at most 63 characters. */
export function validateTenantName(name: unknown, field = 'name'): string {
  if (typeof name !== 'string' || !NAME.test(name)) throw new InvalidArgumentError(field, 'a tenant name of lower-case letters, digits, "-" and "_" (1-63, starting with a letter or digit)', name);
  return name;
}

function quota(v: unknown, field: string, max: number, min = 0): number | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw new InvalidArgumentError(field, `an integer from ${min} to ${max}, or null for no limit`, v);
  return v;
}

function hashToken(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

function toTenant(r: TenantRow): Tenant {
  return {
    name: r.name,
    createdAt: new Date(r.created_at).toISOString(),
    maxSandboxes: r.max_sandboxes,
    maxMemoryMb: r.max_memory_mb,
    cpuWeight: r.default_cpu_weight ?? null,
    maxCpuWeight: r.max_cpu_weight ?? null,
    maxCheckpointMb: r.max_checkpoint_mb ?? null,
  };
}

/** Adds a tenant; returns it with its bearer token, which is not stored and cannot be shown again. */
export function addTenant(db: Database.Database, name: string, quotas: TenantQuotas = {}, clock: () => number = Date.now): { tenant: Tenant; token: string } {
  validateTenantName(name);
  const maxSandboxes = quota(quotas.maxSandboxes, 'maxSandboxes', 1_000_000);
  const maxMemoryMb = quota(quotas.maxMemoryMb, 'maxMemoryMb', 1 << 30);
  const cpuWeight = quota(quotas.cpuWeight, 'cpuWeight', 10_000, 1);
  const maxCpuWeight = quota(quotas.maxCpuWeight, 'maxCpuWeight', 1 << 30);
  const maxCheckpointMb = quota(quotas.maxCheckpointMb, 'maxCheckpointMb', 1 << 30);
  const token = TOKEN_PREFIX + randomBytes(32).toString('base64url');
  const row: TenantRow = {
    name,
    token_hash: hashToken(token),
    created_at: clock(),
    max_sandboxes: maxSandboxes,
    max_memory_mb: maxMemoryMb,
    default_cpu_weight: cpuWeight,
    max_cpu_weight: maxCpuWeight,
    max_checkpoint_mb: maxCheckpointMb,
  };
  try {
    db.prepare(
      `INSERT INTO tenants (name, token_hash, created_at, max_sandboxes, max_memory_mb, default_cpu_weight, max_cpu_weight, max_checkpoint_mb)
       VALUES (@name, @token_hash, @created_at, @max_sandboxes, @max_memory_mb, @default_cpu_weight, @max_cpu_weight, @max_checkpoint_mb)`,
    ).run(row);
  } catch (e) {
    if ((e as { code?: string }).code === 'SQLITE_CONSTRAINT_PRIMARYKEY') throw new AlreadyExistsError('tenant', name);
    throw e;
  }
  return { tenant: toTenant(row), token };
}

/** One tenant, or TENANT_NOT_FOUND. */
export function getTenant(db: Database.Database, name: string): Tenant {
  const row = db.prepare('SELECT * FROM tenants WHERE name = ?').get(name) as TenantRow | undefined;
  if (!row) throw new NotFoundError('tenant', name);
  return toTenant(row);
}

export function listTenants(db: Database.Database): Tenant[] {
  return (db.prepare('SELECT * FROM tenants ORDER BY name').all() as TenantRow[]).map(toTenant);
}

/**
 * Removes a tenant, which revokes its token at once. Refused with
 * TENANT_HAS_SANDBOXES while it still has sandboxes, unless `force` is set:
 * then they stay, reachable only by an administrator (`lockstep rm`).
 */
export function removeTenant(db: Database.Database, name: string, opts: { force?: boolean } = {}): void {
  validateTenantName(name);
  db.transaction(() => {
    getTenant(db, name);
    const n = (db.prepare("SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ? AND state != 'removing'").get(name) as { n: number }).n;
    if (n > 0 && !opts.force) throw new InvalidStateError('TENANT_HAS_SANDBOXES', `Tenant ${name} still has ${n} sandbox(es); remove them first or force the removal`, { tenant: name, sandboxes: n });
    db.prepare('DELETE FROM tenants WHERE name = ?').run(name);
    // Stored idempotent responses are keyed by tenant name: a tenant added
    // later under the same name must not be answered with them.
    const idem = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'http_idempotency'").get();
    if (idem) db.prepare('DELETE FROM http_idempotency WHERE tenant = ?').run(name);
  })();
}

/** The tenant a bearer token belongs to, or undefined. */
export function authenticate(db: Database.Database, token: unknown): Tenant | undefined {
  if (typeof token !== 'string' || !token.startsWith(TOKEN_PREFIX) || token.length > 200) return undefined;
  const hash = hashToken(token);
  const row = db.prepare('SELECT * FROM tenants WHERE token_hash = ?').get(hash) as TenantRow | undefined;
  // The lookup is by the hash of a 256-bit secret, which tells an attacker
  // nothing; the comparison is constant-time all the same.
  if (!row || row.token_hash.length !== hash.length || !timingSafeEqual(row.token_hash, hash)) return undefined;
  return toTenant(row);
}
