/**
 * Stored replies of tenants' idempotent requests (src/tenants/replies.ts):
 * one row per (tenant id, key), with the bytes it costs.
 */
import type Database from 'better-sqlite3';

/** What a row costs beside its body: the key, the hash, and SQLite's own bytes of a row (about). */
export const ROW_OVERHEAD = 64;

/**
 * Creates the replies table, or brings one made by an older Lockstep to its
 * current columns (byte accounting, issue 23: older rows are measured once). Idempotent.
 */
export function repliesTable(db: Database.Database): void {
  db.exec(`
CREATE TABLE IF NOT EXISTS http_idempotency (
  tenant       TEXT NOT NULL,
  key          TEXT NOT NULL,
  request_hash TEXT NOT NULL,
  status       INTEGER NOT NULL,
  body         TEXT NOT NULL,
  streamed     INTEGER NOT NULL DEFAULT 0,
  created_at   INTEGER NOT NULL,
  PRIMARY KEY (tenant, key)
);
CREATE INDEX IF NOT EXISTS http_idempotency_created ON http_idempotency(created_at);`);
  const cols = db.prepare('PRAGMA table_info(http_idempotency)').all() as { name: string }[];
  if (!cols.some((c) => c.name === 'bytes')) {
    db.exec(`ALTER TABLE http_idempotency ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE http_idempotency ADD COLUMN kept INTEGER NOT NULL DEFAULT 1;
ALTER TABLE http_idempotency ADD COLUMN reply_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE http_idempotency SET reply_bytes = length(CAST(body AS BLOB)),
  bytes = length(CAST(body AS BLOB)) + length(key) + length(request_hash) + ${ROW_OVERHEAD};`);
  }
  db.exec('CREATE INDEX IF NOT EXISTS http_idempotency_tenant ON http_idempotency(tenant, created_at)');
}
