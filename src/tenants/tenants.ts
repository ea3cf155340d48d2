/**
 * Tenants of a shared Lockstep: an immutable id, a name, the hash of a
 * bearer token, and quotas. The token is shown once, when the tenant is
 * added; only its sha256 is stored. Tokens are 32 random bytes, so a fast
 * hash is enough: slow password hashes (scrypt, argon2) exist for
 * low-entropy secrets a person chose, and would only slow down every request
 * here.
 *
 * The table lives in the catalog database next to the sandboxes. Everything
 * a tenant owns (the sandboxes' `tenant` column, stored idempotent
 * responses) is keyed by the tenant's id (`tn_…`, random, fixed when the
 * tenant is added), never by its name: a tenant removed and added again
 * under the same name is a new tenant and sees nothing of the old one.
 */
import type Database from 'better-sqlite3';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { AlreadyExistsError, InvalidArgumentError, InvalidStateError, NotFoundError } from '../errors.js';
import { NETWORK_MODES, type NetworkMode } from '../host/network/policy.js';
import { ensureTables } from '../catalog/migrations.js';
import { newTenantId } from '../catalog/schema/tenants.js';

/** A tenant as callers see it (never the token or its hash). */
export interface Tenant {
  /** Immutable, random: what the tenant's sandboxes and records are keyed by. */
  id: string;
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
  /**
   * Most MiB of the layer store it may hold in all: its writable layers' disk
   * limits plus its checkpoints' and snapshots' bytes (null: no limit).
   */
  maxDiskMb: number | null;
  /** Network mode of its sandboxes that name none (null: "none"). */
  network: NetworkMode | null;
  /** The widest network mode its sandboxes may have: "none" refuses egress (null: no limit). */
  maxNetwork: NetworkMode | null;
}

/** Quotas given when a tenant is added. */
export interface TenantQuotas {
  maxSandboxes?: number | null | undefined;
  maxMemoryMb?: number | null | undefined;
  cpuWeight?: number | null | undefined;
  maxCpuWeight?: number | null | undefined;
  maxCheckpointMb?: number | null | undefined;
  maxDiskMb?: number | null | undefined;
  network?: NetworkMode | null | undefined;
  maxNetwork?: NetworkMode | null | undefined;
}

interface TenantRow {
  id: string;
  name: string;
  token_hash: Buffer;
  created_at: number;
  max_sandboxes: number | null;
  max_memory_mb: number | null;
  default_cpu_weight: number | null;
  max_cpu_weight: number | null;
  max_checkpoint_mb: number | null;
  max_disk_mb?: number | null;
  default_network?: string | null;
  max_network?: string | null;
}

/** Prefix of every token, so that secret scanners and people can recognise one. */
export const TOKEN_PREFIX = 'lst_';
const NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export { newTenantId };

/**
 * Makes the tenants table on a database the catalog did not open (idempotent).
 * The catalog makes and upgrades it itself (src/catalog/schema/tenants.ts, a
 * step of src/catalog/migrations.ts): on a catalog this does nothing.
 */
export function migrateTenants(db: Database.Database): void {
  ensureTables(db, 'tenants');
}

/** Checks a tenant name: lower-case letters, digits, "-" and "_", at most 63 characters. */
export function validateTenantName(name: unknown, field = 'name'): string {
  if (typeof name !== 'string' || !NAME.test(name))
    throw new InvalidArgumentError(
      field,
      'a tenant name of lower-case letters, digits, "-" and "_" (1-63, starting with a letter or digit)',
      name,
    );
  return name;
}

function quota(v: unknown, field: string, max: number, min = 0): number | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
    throw new InvalidArgumentError(field, `an integer from ${min} to ${max}, or null for no limit`, v);
  return v;
}

function hashToken(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

function toTenant(r: TenantRow): Tenant {
  return {
    id: r.id,
    name: r.name,
    createdAt: new Date(r.created_at).toISOString(),
    maxSandboxes: r.max_sandboxes,
    maxMemoryMb: r.max_memory_mb,
    cpuWeight: r.default_cpu_weight ?? null,
    maxCpuWeight: r.max_cpu_weight ?? null,
    maxCheckpointMb: r.max_checkpoint_mb ?? null,
    maxDiskMb: r.max_disk_mb ?? null,
    network: (r.default_network as NetworkMode | null | undefined) ?? null,
    maxNetwork: (r.max_network as NetworkMode | null | undefined) ?? null,
  };
}

function networkMode(v: unknown, field: string): NetworkMode | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'string' || !NETWORK_MODES.includes(v as NetworkMode))
    throw new InvalidArgumentError(field, `one of ${NETWORK_MODES.map((m) => `"${m}"`).join(', ')}, or null`, v);
  return v as NetworkMode;
}

/** Adds a tenant; returns it with its bearer token, which is not stored and cannot be shown again. */
export function addTenant(
  db: Database.Database,
  name: string,
  quotas: TenantQuotas = {},
  clock: () => number = Date.now,
): { tenant: Tenant; token: string } {
  validateTenantName(name);
  const maxSandboxes = quota(quotas.maxSandboxes, 'maxSandboxes', 1_000_000);
  const maxMemoryMb = quota(quotas.maxMemoryMb, 'maxMemoryMb', 1 << 30);
  const cpuWeight = quota(quotas.cpuWeight, 'cpuWeight', 10_000, 1);
  const maxCpuWeight = quota(quotas.maxCpuWeight, 'maxCpuWeight', 1 << 30);
  const maxCheckpointMb = quota(quotas.maxCheckpointMb, 'maxCheckpointMb', 1 << 30);
  const maxDiskMb = quota(quotas.maxDiskMb, 'maxDiskMb', 1 << 30);
  const network = networkMode(quotas.network, 'network');
  const maxNetwork = networkMode(quotas.maxNetwork, 'maxNetwork');
  if (network === 'egress' && maxNetwork === 'none')
    throw new InvalidArgumentError('network', 'a default within maxNetwork ("none")', network);
  const token = TOKEN_PREFIX + randomBytes(32).toString('base64url');
  const row: TenantRow = {
    id: newTenantId(),
    name,
    token_hash: hashToken(token),
    created_at: clock(),
    max_sandboxes: maxSandboxes,
    max_memory_mb: maxMemoryMb,
    default_cpu_weight: cpuWeight,
    max_cpu_weight: maxCpuWeight,
    max_checkpoint_mb: maxCheckpointMb,
    max_disk_mb: maxDiskMb,
    default_network: network,
    max_network: maxNetwork,
  };
  try {
    db.prepare(
      `INSERT INTO tenants (id, name, token_hash, created_at, max_sandboxes, max_memory_mb, default_cpu_weight,
       max_cpu_weight, max_checkpoint_mb, max_disk_mb, default_network, max_network)
       VALUES (@id, @name, @token_hash, @created_at, @max_sandboxes, @max_memory_mb, @default_cpu_weight,
         @max_cpu_weight, @max_checkpoint_mb, @max_disk_mb, @default_network, @max_network)`,
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

/** The tenant with this id (what sandboxes and other tenant-scoped rows hold), or undefined. */
export function tenantById(db: Database.Database, id: string): Tenant | undefined {
  const row = db.prepare('SELECT * FROM tenants WHERE id = ?').get(id) as TenantRow | undefined;
  return row ? toTenant(row) : undefined;
}

export function listTenants(db: Database.Database): Tenant[] {
  return (db.prepare('SELECT * FROM tenants ORDER BY name').all() as TenantRow[]).map(toTenant);
}

/**
 * Removes a tenant, which revokes its token at once. Refused with
 * TENANT_HAS_SANDBOXES while any sandbox of it still exists (even one being
 * removed): `purgeTenant` (tenants/purge.ts, `tenant rm --force`) removes
 * them first.
 */
export function removeTenant(db: Database.Database, name: string): void {
  validateTenantName(name);
  db.transaction(() => {
    const { id } = getTenant(db, name);
    const n = (db.prepare('SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ?').get(id) as { n: number }).n;
    if (n > 0)
      throw new InvalidStateError(
        'TENANT_HAS_SANDBOXES',
        `Tenant ${name} still has ${n} sandbox(es); remove them first or force the removal`,
        { tenant: name, sandboxes: n },
      );
    db.prepare('DELETE FROM tenants WHERE id = ?').run(id);
    const idem = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'http_idempotency'").get();
    if (idem) db.prepare('DELETE FROM http_idempotency WHERE tenant = ?').run(id);
  })();
}

/**
 * Revokes a tenant's token without removing the tenant (the first step of a
 * forced removal, so that it cannot create sandboxes while they are torn
 * down): the stored hash becomes random bytes, which no token hashes to.
 */
export function revokeTenantToken(db: Database.Database, name: string): Tenant {
  const tenant = getTenant(db, validateTenantName(name));
  db.prepare('UPDATE tenants SET token_hash = ? WHERE id = ?').run(randomBytes(32), tenant.id);
  return tenant;
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
