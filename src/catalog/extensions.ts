/**
 * Catalog extensions: modules above the catalog's floor (the LangGraph
 * saver) that keep tables of their own in the catalog database. An
 * extension registers its ordered schema steps under a name; its tables
 * are made when it asks for the database (Lockstep.extensionDatabase), not
 * when the catalog opens, so the catalog never imports it. The version of
 * each extension is a row of `catalog_extensions` (made by step 15 of
 * src/catalog/migrations.ts); the same rules as the main chain apply: steps
 * numbered from 1, appended, never edited, one transaction each.
 */
import type Database from 'better-sqlite3';
import { InvalidArgumentError } from '../errors.js';
import { CatalogVersionError } from './migrations.js';

/** One forward step of an extension's tables. */
export interface ExtensionMigration {
  version: number;
  /** What the step adds. */
  description: string;
  up(db: Database.Database): void;
}

/** An extension's name and its schema steps, in order (versions 1, 2, ...). */
export interface CatalogExtension {
  name: string;
  migrations: readonly ExtensionMigration[];
}

const NAME = /^[a-z][a-z0-9_-]{0,62}$/;
const registered = new Map<string, CatalogExtension>();

/**
 * Registers an extension's schema steps under its name (at import of the
 * extension's module). Registering the same steps again is a no-op; other
 * steps under a registered name are refused.
 */
export function registerExtension(extension: CatalogExtension): void {
  if (!NAME.test(extension.name))
    throw new InvalidArgumentError(
      'name',
      'an extension name of lower-case letters, digits, "-" and "_"',
      extension.name,
    );
  extension.migrations.forEach((m, i) => {
    if (m.version !== i + 1)
      throw new InvalidArgumentError('migrations', `steps numbered 1, 2, ... in order (step ${i + 1})`, m.version);
  });
  const known = registered.get(extension.name);
  if (known && known !== extension)
    throw new InvalidArgumentError('name', 'a name no other extension registered', extension.name);
  registered.set(extension.name, extension);
}

/** The version of an extension's tables in this database (0: none yet). */
export function extensionVersion(db: Database.Database, name: string): number {
  const v = db.prepare('SELECT version FROM catalog_extensions WHERE name = ?').pluck().get(name) as number | undefined;
  return v ?? 0;
}

/**
 * Brings a registered extension's tables forward to its last step, one
 * IMMEDIATE transaction per step that also records the new version in
 * `catalog_extensions`; returns the version it started from. Refuses an
 * unregistered name (InvalidArgumentError) and tables newer than the last
 * step (CATALOG_TOO_NEW).
 */
export function migrateExtension(db: Database.Database, name: string): number {
  const extension = registered.get(name);
  if (!extension)
    throw new InvalidArgumentError(
      'name',
      `a registered catalog extension (${[...registered.keys()].join(', ') || 'none is'})`,
      name,
    );
  const steps = extension.migrations;
  const target = steps.length === 0 ? 0 : steps[steps.length - 1]!.version;
  const from = extensionVersion(db, name);
  if (from > target) throw new CatalogVersionError(db.name, from, target, name);
  if (from === target) return from;
  for (const step of steps) {
    db.transaction(() => {
      const v = extensionVersion(db, name);
      if (v > target) throw new CatalogVersionError(db.name, v, target, name);
      if (v >= step.version) return;
      step.up(db);
      db.prepare(
        `INSERT INTO catalog_extensions (name, version) VALUES (?, ?)
         ON CONFLICT(name) DO UPDATE SET version = excluded.version`,
      ).run(name, step.version);
    }).immediate();
  }
  return from;
}
