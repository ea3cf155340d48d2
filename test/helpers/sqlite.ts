/** A throwaway SQLite database (WAL, like the catalog) for unit tests of the agent-state stores. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import type { ExecutionContext } from 'ava';

export function openTestDb(t: ExecutionContext, label = 'db'): Database.Database {
  const dir = mkdtempSync(join(tmpdir(), `lockstep-${label}-`));
  const db = new Database(join(dir, 'state.db'));
  db.pragma('journal_mode = WAL');
  t.teardown(() => {
    db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return db;
}
