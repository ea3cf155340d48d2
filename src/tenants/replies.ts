/**
 * Stored replies of tenants' idempotent requests (the HTTP API's
 * Idempotency-Key): one row per (tenant id, key) with a hash of the request
 * and what it answered. The table lives in the catalog beside the tenants,
 * so that removing a tenant removes its replies in the same transaction
 * (tenants.ts). The rules of replaying (how long, what counts as the same
 * request, a key still in use) are the HTTP layer's (src/http/idempotency.ts).
 */
import type Database from 'better-sqlite3';

/** What a request answered. */
export interface StoredResponse {
  status: number;
  body: string;
  /** The request asked for a stream; body holds the JSON of its final result. */
  streamed: boolean;
}

/** A stored reply with the hash of the request it answered and when (ms since the epoch). */
export interface StoredReply extends StoredResponse {
  requestHash: string;
  createdAt: number;
}

/** Creates the replies table (idempotent). */
export function migrateIdempotency(db: Database.Database): void {
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
}

/** The replies table of one catalog. */
export class StoredReplies {
  constructor(private readonly db: Database.Database) {
    migrateIdempotency(db);
  }

  /** The reply stored for (tenant, key), or undefined. */
  find(tenant: string, key: string): StoredReply | undefined {
    const row = this.db
      .prepare(
        'SELECT request_hash, status, body, streamed, created_at FROM http_idempotency WHERE tenant = ? AND key = ?',
      )
      .get(tenant, key) as
      { request_hash: string; status: number; body: string; streamed: number; created_at: number } | undefined;
    if (!row) return undefined;
    return {
      requestHash: row.request_hash,
      status: row.status,
      body: row.body,
      streamed: row.streamed === 1,
      createdAt: row.created_at,
    };
  }

  /** Stores (or replaces) the reply for (tenant, key). */
  put(tenant: string, key: string, requestHash: string, res: StoredResponse, createdAt: number): void {
    this.db
      .prepare(
        'INSERT OR REPLACE INTO http_idempotency (tenant, key, request_hash, ' +
          'status, body, streamed, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)',
      )
      .run(tenant, key, requestHash, res.status, res.body, res.streamed ? 1 : 0, createdAt);
  }

  /** Deletes the replies created at or before `createdAt`; returns how many. */
  deleteUpTo(createdAt: number): number {
    return this.db.prepare('DELETE FROM http_idempotency WHERE created_at <= ?').run(createdAt).changes;
  }

  /** Deletes a tenant's replies. */
  forgetTenant(tenant: string): void {
    this.db.prepare('DELETE FROM http_idempotency WHERE tenant = ?').run(tenant);
  }
}
