/**
 * Stored replies of tenants' idempotent requests (the HTTP API's
 * Idempotency-Key): one row per (tenant id, key) with a hash of the request
 * and what it answered. The table lives in the catalog beside the tenants,
 * so that removing a tenant removes its replies in the same transaction
 * (tenants.ts). The rules of replaying (how long, what counts as the same
 * request, a key still in use, how many bytes are kept) are the HTTP layer's
 * (src/http/idempotency.ts).
 *
 * Each row records the bytes it costs (body, key and hash), so that the
 * bytes a tenant's replies keep, and all tenants' together, can be bounded
 * without reading the bodies. A row may hold no body ("not kept"): the
 * request ran, but its reply was too large to keep.
 */
import type Database from 'better-sqlite3';
import { ensureTables } from '../catalog/migrations.js';
import { ROW_OVERHEAD } from '../catalog/schema/replies.js';

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
  /** False: the request ran, its reply was not kept (body is empty); replayBytes is how large it was. */
  kept: boolean;
  replyBytes: number;
}

export { ROW_OVERHEAD };

/** The bytes a row costs: its body (none when not kept), key and hash, and the row's own. */
export function rowBytes(key: string, requestHash: string, bodyBytes: number): number {
  return bodyBytes + Buffer.byteLength(key) + requestHash.length + ROW_OVERHEAD;
}

/**
 * Makes the replies table on a database the catalog did not open (idempotent).
 * The catalog makes and upgrades it itself (src/catalog/schema/replies.ts, a
 * step of src/catalog/migrations.ts): on a catalog this does nothing.
 */
export function migrateIdempotency(db: Database.Database): void {
  ensureTables(db, 'replies');
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
        'SELECT request_hash, status, body, streamed, created_at, kept, reply_bytes ' +
          'FROM http_idempotency WHERE tenant = ? AND key = ?',
      )
      .get(tenant, key) as
      | {
          request_hash: string;
          status: number;
          body: string;
          streamed: number;
          created_at: number;
          kept: number;
          reply_bytes: number;
        }
      | undefined;
    if (!row) return undefined;
    return {
      requestHash: row.request_hash,
      status: row.status,
      body: row.body,
      streamed: row.streamed === 1,
      createdAt: row.created_at,
      kept: row.kept === 1,
      replyBytes: row.reply_bytes,
    };
  }

  /**
   * Stores (or replaces) the reply for (tenant, key); with `kept` false only
   * that the request ran (and how large its reply was), not the reply.
   */
  put(tenant: string, key: string, requestHash: string, res: StoredResponse, createdAt: number, kept = true): number {
    const replyBytes = Buffer.byteLength(res.body);
    const body = kept ? res.body : '';
    const bytes = rowBytes(key, requestHash, kept ? replyBytes : 0);
    const old = this.db.prepare('SELECT bytes FROM http_idempotency WHERE tenant = ? AND key = ?').get(tenant, key) as
      { bytes: number } | undefined;
    this.db
      .prepare(
        'INSERT OR REPLACE INTO http_idempotency (tenant, key, request_hash, ' +
          'status, body, streamed, created_at, bytes, kept, reply_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
      )
      .run(
        tenant,
        key,
        requestHash,
        res.status,
        body,
        res.streamed ? 1 : 0,
        createdAt,
        bytes,
        kept ? 1 : 0,
        replyBytes,
      );
    return bytes - (old?.bytes ?? 0);
  }

  /** Bytes the rows keep, per tenant id (one pass over the table: callers keep the sums). */
  usage(): Map<string, number> {
    const rows = this.db.prepare('SELECT tenant, SUM(bytes) AS n FROM http_idempotency GROUP BY tenant').all() as {
      tenant: string;
      n: number;
    }[];
    return new Map(rows.map((r) => [r.tenant, r.n]));
  }

  /** When the oldest row of a tenant (or of all, without one) was stored (ms), or null. */
  oldest(tenant?: string): number | null {
    const r = (
      tenant === undefined
        ? this.db.prepare('SELECT MIN(created_at) AS t FROM http_idempotency').get()
        : this.db.prepare('SELECT MIN(created_at) AS t FROM http_idempotency WHERE tenant = ?').get(tenant)
    ) as { t: number | null };
    return r.t;
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
