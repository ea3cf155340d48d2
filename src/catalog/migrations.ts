/**
 * The catalog's schema versions: one ordered chain of steps under SQLite's
 * `user_version`, for every table in the catalog database (the table
 * definitions are in src/catalog/schema/). Extensions outside the catalog's
 * floor keep their own chains (src/catalog/extensions.ts).
 *
 * Each numbered step moves a catalog from the previous version to its own,
 * in a transaction of its own that also records the new version, so a
 * crash leaves the catalog at a whole version. Opening runs the steps a
 * catalog lacks; a catalog from a newer Lockstep is refused
 * (CATALOG_TOO_NEW), never guessed at.
 *
 * To change the schema: append a step with the next number (and say in
 * CHANGELOG.md whether the on-disk change is breaking). Never edit or
 * reorder a step that has shipped: catalogs already past it will not run it
 * again. Steps are idempotent (CREATE ... IF NOT EXISTS, addColumn skips
 * existing columns), because catalogs written before versions were recorded
 * start at 0 with some of the later tables and columns already in place,
 * and the agent-state, tenant and reply tables were made outside this chain
 * until version 9.
 */
import type Database from 'better-sqlite3';
import { LockstepError } from '../errors.js';
import { addColumn } from './schema/columns.js';
import { instancesAndHolds } from './schema/instances.js';
import { CORE_TABLES } from './schema/sandboxes.js';
import { SNAPSHOTS_TABLE } from './schema/snapshots.js';
import { EXPOSURES_TABLE } from './schema/exposures.js';
import {
  AGENT_STATE_TABLES,
  addEffectRunner,
  addVerdictTimelines,
  dropAgentStateMeta,
  refuseNewerAgentState,
} from './schema/agent-state.js';
import { tenantsTable } from './schema/tenants.js';
import { repliesTable } from './schema/replies.js';
import { EXTENSIONS_TABLE } from './schema/extensions.js';

/** Tables whose modules may also make them on a database the catalog did not open (ensureTables). */
export type TableGroup = 'agent-state' | 'tenants' | 'replies';

/** One forward step of the catalog schema. */
export interface CatalogMigration {
  version: number;
  /** What the step adds, for logs and the changelog. */
  description: string;
  /** The group of tables the step belongs to, if any (ensureTables runs a group's steps). */
  group?: TableGroup;
  up(db: Database.Database): void;
}

/** Every schema step, in order; the last one's number is SCHEMA_VERSION. */
export const MIGRATIONS: readonly CatalogMigration[] = [
  {
    version: 1,
    description: 'images, sandboxes, layers, checkpoints and the operation journal',
    up: (db) => db.exec(CORE_TABLES),
  },
  {
    version: 2,
    description: 'sandbox lifetimes (sandboxes.expires_at)',
    up: (db) => addColumn(db, 'sandboxes', 'expires_at', 'INTEGER'),
  },
  {
    version: 3,
    description: 'instances and warm standbys',
    up: (db) => {
      for (const [col, type] of [
        ['instance', 'TEXT'],
        ['standby_instance', 'TEXT'],
        ['standby_checkpoint', 'TEXT'],
        ['standby_pid', 'INTEGER'],
        ['standby_start', 'INTEGER'],
      ] as const) {
        addColumn(db, 'sandboxes', col, type);
      }
      db.exec('UPDATE sandboxes SET instance = id WHERE instance IS NULL');
    },
  },
  {
    version: 4,
    description: 'checksums recorded at checkpoint time (checkpoints.checksums)',
    up: (db) => addColumn(db, 'checkpoints', 'checksums', 'TEXT'),
  },
  {
    version: 5,
    description:
      'checkpoints made durable after they are runnable (checkpoints.durable_at, boot_id); standby LRU order (sandboxes.standby_at)',
    up: (db) => {
      addColumn(db, 'checkpoints', 'durable_at', 'INTEGER');
      addColumn(db, 'checkpoints', 'boot_id', 'TEXT');
      // The standby policy's LRU order (src/checkpoints/standby-policy.ts).
      addColumn(db, 'sandboxes', 'standby_at', 'INTEGER');
      // Every checkpoint before this step was durable when its row committed.
      db.exec('UPDATE checkpoints SET durable_at = created_at WHERE durable_at IS NULL');
    },
  },
  {
    version: 6,
    description: 'named snapshots that outlive their sandbox (snapshots)',
    up: (db) => db.exec(SNAPSHOTS_TABLE),
  },
  {
    version: 7,
    description:
      'network modes (sandboxes.network, sandboxes.net_slot) and the outside connections a checkpoint held (checkpoints.connections)',
    up: (db) => {
      addColumn(db, 'sandboxes', 'network', 'TEXT');
      addColumn(db, 'sandboxes', 'net_slot', 'INTEGER');
      db.exec('CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_net_slot ON sandboxes(net_slot)');
      addColumn(db, 'checkpoints', 'connections', 'TEXT');
    },
  },
  {
    version: 8,
    description: 'exposed ports of sandboxes, reached through the manager (exposures; tokens kept as sha256 hashes)',
    up: (db) => db.exec(EXPOSURES_TABLE),
  },
  {
    version: 9,
    description:
      'resource limits beyond memory and pids (sandboxes.cpu_weight, cpu_quota_us, io_weight, disk_bytes) and user-namespace id ranges (sandboxes.id_base)',
    up: (db) => {
      // Added on every open, outside the numbered steps, before version 9.
      for (const col of ['cpu_weight', 'cpu_quota_us', 'io_weight', 'disk_bytes'])
        addColumn(db, 'sandboxes', col, 'INTEGER');
      addColumn(db, 'sandboxes', 'id_base', 'INTEGER');
      db.exec('CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_id_base ON sandboxes(id_base)');
    },
  },
  {
    version: 10,
    description: 'agent-state tables: contexts, observations, verdicts, effects (agent_state_meta version 1)',
    group: 'agent-state',
    up: (db) => {
      refuseNewerAgentState(db);
      db.exec(AGENT_STATE_TABLES);
    },
  },
  {
    version: 11,
    description: 'the process that runs an effect (agent_effects.runner; agent_state_meta version 2)',
    group: 'agent-state',
    up: addEffectRunner,
  },
  {
    version: 12,
    description:
      'verdict timelines (agent_verdicts.sealed_by, abandoned_by; agent_state_meta version 3); agent_state_meta dropped',
    group: 'agent-state',
    up: (db) => {
      addVerdictTimelines(db);
      dropAgentStateMeta(db);
    },
  },
  {
    version: 13,
    description: 'tenants, with quotas and ids (rows keyed by a tenant name are re-keyed by its id)',
    group: 'tenants',
    up: tenantsTable,
  },
  {
    version: 14,
    description: 'stored replies of idempotent requests, with their bytes (http_idempotency)',
    group: 'replies',
    up: repliesTable,
  },
  {
    version: 15,
    description: 'schema versions of catalog extensions (catalog_extensions)',
    up: (db) => db.exec(EXTENSIONS_TABLE),
  },
  {
    version: 16,
    description:
      'process instances of sandboxes (instances, replacing sandboxes.standby_*) and who holds layers and images (holds), kept by triggers',
    up: instancesAndHolds,
  },
];

/** The schema version this build of Lockstep writes. */
export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

/** The catalog (or one extension's tables in it) was written by a newer Lockstep than this one; nothing was changed. */
export class CatalogVersionError extends LockstepError {
  constructor(file: string, found: number, supported: number, extension?: string) {
    super(
      'CATALOG_TOO_NEW',
      extension === undefined
        ? `The catalog ${file} has schema version ${found}, newer than version ${supported} that ` +
            `this Lockstep understands: upgrade Lockstep (downgrades are not supported)`
        : `The catalog ${file} has the tables of extension ${extension} at version ${found}, newer than ` +
            `version ${supported} that this Lockstep understands: upgrade Lockstep (downgrades are not supported)`,
      {
        details: extension === undefined ? { file, found, supported } : { file, extension, found, supported },
      },
    );
  }
}

/**
 * Brings a catalog database forward to the last step of `steps`, one
 * transaction per step; returns the version it started from.
 * Refuses (CatalogVersionError) a catalog newer than the last step.
 */
export function migrateCatalog(
  db: Database.Database,
  steps: readonly CatalogMigration[] = MIGRATIONS,
  file = db.name,
): number {
  const target = steps[steps.length - 1]!.version;
  const current = () => db.pragma('user_version', { simple: true }) as number;
  const from = current();
  if (from > target) throw new CatalogVersionError(file, from, target);
  for (const step of steps) {
    // IMMEDIATE: take the write lock up front, so concurrent managers opening
    // the same directory wait (busy_timeout) and then see the step done,
    // instead of failing to upgrade a read transaction ("database is locked").
    db.transaction(() => {
      const v = current();
      if (v > target) throw new CatalogVersionError(file, v, target);
      if (v >= step.version) return;
      step.up(db);
      db.pragma(`user_version = ${step.version}`);
    }).immediate();
  }
  return from;
}

/**
 * Makes one group's tables on a database the catalog did not open (a store
 * over a bare SQLite file, as unit tests make): runs that group's steps, all
 * idempotent, in one transaction (a savepoint inside the caller's). A
 * catalog already past those steps is left as it is. The user_version is not
 * changed: opening the file as a catalog later runs the whole chain.
 */
export function ensureTables(db: Database.Database, group: TableGroup): void {
  const steps = MIGRATIONS.filter((m) => m.group === group);
  const last = steps[steps.length - 1]!.version;
  if ((db.pragma('user_version', { simple: true }) as number) >= last) return;
  db.transaction(() => {
    for (const step of steps) step.up(db);
  })();
}
