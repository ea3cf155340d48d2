/**
 * Durable, deduplicated storage of agent-context snapshots.
 *
 * Contexts grow by appending, and a checkpoint is typically taken after every turn, so storing
 * each snapshot whole would cost O(turns²). Instead:
 * - every item (message, response item) is stored once, content-addressed by the sha256 of its
 *   msgpack bytes, with a reference count;
 * - a snapshot stores its header (the context minus its items, itself a content-addressed item)
 *   and its item list as a reference to the longest stored snapshot whose list is a prefix of
 *   ours (found through a rolling digest of the hash list, one indexed lookup per candidate
 *   length) plus the tail of new 32-byte hashes.
 * A 200-turn conversation checkpointed after every turn thus stores each message once and each
 * hash once. Reads walk the base chain, which is bounded (MAX_DEPTH, like git's delta depth):
 * past it the snapshot stores its whole hash list as a keyframe, costing 32 bytes per item.
 */
import { createHash, randomBytes } from 'node:crypto';
import type BetterSqlite3 from 'better-sqlite3';
import { Packr } from 'msgpackr';
import { NotFoundError } from '../errors.js';
import { ensureTables } from '../catalog/migrations.js';
import { type AgentContext, contextHeader, contextItems, rebuild, validateContext } from './formats.js';

type Database = BetterSqlite3.Database;

/** Longest base chain a read walks before a snapshot is stored as a keyframe. */
export const MAX_DEPTH = 50;
const HASH = 32;
// Candidate prefix lengths probed per query, longest first.
const PROBE = 128;

// No records extension: the same item must always encode to the same bytes. structuredClone
// keeps typed arrays, Dates and undefined as they were; copyBuffers detaches decoded bytes from
// the row buffer.
const packr = new Packr({ useRecords: false, structuredClone: true, copyBuffers: true });

/** What one put() cost. */
export interface PutResult {
  contextId: string;
  /** Size of the snapshot if stored whole (header + every item, msgpack). */
  logicalBytes: number;
  /** Bytes this put actually added (new items + header if new + hash-list tail). */
  storedBytes: number;
  itemCount: number;
}

/** Space accounting over every live snapshot. */
export interface ContextStoreStats {
  snapshots: number;
  /** Deleted snapshots kept because a live snapshot's hash list is built on theirs. */
  retainedDeleted: number;
  items: number;
  /** Sum of logicalBytes over live snapshots: the cost of storing each one whole. */
  logicalBytes: number;
  /** Item bytes + hash-list bytes actually stored (SQLite page overhead not counted). */
  storedBytes: number;
}

interface SnapshotRow {
  id: string;
  format: string;
  header_hash: Buffer;
  base_id: string | null;
  tail: Buffer;
  item_count: number;
  depth: number;
  dependents: number;
  deleted: number;
}

/** Stores agent contexts so that appending turns costs only the new turns. */
export class ContextStore {
  private readonly db: Database;
  private readonly clock: () => number;
  private readonly stmt;
  private readonly probes = new Map<number, BetterSqlite3.Statement>();

  constructor(db: Database, clock: () => number = Date.now) {
    this.db = db;
    this.clock = clock;
    ensureTables(db, 'agent-state');
    this.stmt = {
      addItem: db.prepare(`INSERT OR IGNORE INTO agent_context_items(hash, data, refs) VALUES (?, ?, 1)`),
      refItem: db.prepare(`UPDATE agent_context_items SET refs = refs + 1 WHERE hash = ?`),
      unrefItem: db.prepare(`UPDATE agent_context_items SET refs = refs - 1 WHERE hash = ?`),
      dropItem: db.prepare(`DELETE FROM agent_context_items WHERE hash = ? AND refs <= 0`),
      item: db.prepare(`SELECT data FROM agent_context_items WHERE hash = ?`).pluck(),
      insert: db.prepare(`INSERT INTO agent_context_snapshots
        (id, format, header_hash, base_id, tail, item_count, depth, list_digest, logical_bytes, created_at)
        VALUES (@id, @format, @header_hash, @base_id, @tail, @item_count, @depth, @list_digest, @logical_bytes,
          @created_at)`),
      row: db.prepare(`SELECT id, format, header_hash, base_id, tail, item_count, depth, dependents, deleted
        FROM agent_context_snapshots WHERE id = ?`),
      addDependent: db.prepare(`UPDATE agent_context_snapshots SET dependents = dependents + 1 WHERE id = ?`),
      dropDependent: db.prepare(`UPDATE agent_context_snapshots SET dependents = dependents - 1 WHERE id = ?`),
      markDeleted: db.prepare(`UPDATE agent_context_snapshots SET deleted = 1 WHERE id = ?`),
      remove: db.prepare(`DELETE FROM agent_context_snapshots WHERE id = ?`),
      liveStats: db.prepare(`SELECT count(*) AS n, coalesce(sum(logical_bytes), 0) AS logical
        FROM agent_context_snapshots WHERE deleted = 0`),
      rowStats:
        db.prepare(`SELECT count(*) AS n, coalesce(sum(deleted), 0) AS deleted, coalesce(sum(length(tail)), 0) AS tail
        FROM agent_context_snapshots`),
      itemStats: db.prepare(`SELECT count(*) AS n, coalesce(sum(length(data)), 0) AS bytes FROM agent_context_items`),
    };
  }

  /** Validates and stores a context snapshot; returns its id and what storing it cost. */
  put(context: unknown): PutResult {
    const ctx = validateContext(context);
    const header = Buffer.from(packr.pack(contextHeader(ctx)));
    const encoded = contextItems(ctx).map((it) => Buffer.from(packr.pack(it)));
    const hashes = encoded.map(sha256);
    const digests = rollingDigests(hashes);
    const logicalBytes = header.length + encoded.reduce((n, b) => n + b.length, 0);

    return this.db.transaction((): PutResult => {
      let base = this.longestPrefix(digests);
      if (base !== undefined && base.depth + 1 > MAX_DEPTH) base = undefined;
      const from = base?.item_count ?? 0;
      let storedBytes = 0;
      const headerHash = sha256(header);
      storedBytes += this.ref(headerHash, header);
      for (let i = from; i < hashes.length; i++) storedBytes += this.ref(hashes[i]!, encoded[i]!);
      const tail = Buffer.concat(hashes.slice(from));
      storedBytes += tail.length;

      const contextId = `ctx_${randomBytes(10).toString('hex')}`;
      this.stmt.insert.run({
        id: contextId,
        format: ctx.format,
        header_hash: headerHash,
        base_id: base?.id ?? null,
        tail,
        item_count: hashes.length,
        depth: base === undefined ? 0 : base.depth + 1,
        list_digest: digests[hashes.length]!,
        logical_bytes: logicalBytes,
        created_at: this.clock(),
      });
      if (base !== undefined) this.stmt.addDependent.run(base.id);
      return { contextId, logicalBytes, storedBytes, itemCount: hashes.length };
    })();
  }

  /** Returns a deep-equal copy of the context stored under `contextId`. */
  get(contextId: string): AgentContext {
    const row = this.row(contextId);
    if (row === undefined || row.deleted) throw new NotFoundError('context', contextId);
    const tails: Buffer[] = [];
    for (
      let r: SnapshotRow | undefined = row;
      r !== undefined;
      r = r.base_id === null ? undefined : this.row(r.base_id)
    ) {
      tails.push(r.tail);
    }
    const list = Buffer.concat(tails.reverse());
    const items: unknown[] = new Array(list.length / HASH);
    for (let i = 0; i < items.length; i++) items[i] = this.unpackItem(list.subarray(i * HASH, (i + 1) * HASH));
    return rebuild(this.unpackItem(row.header_hash) as AgentContext, items);
  }

  /** True if a live snapshot has this id. */
  has(contextId: string): boolean {
    const row = this.row(contextId);
    return row !== undefined && !row.deleted;
  }

  /**
   * Deletes a snapshot and garbage-collects items no longer referenced. A snapshot other
   * snapshots build on keeps its hash list (not its visibility) until they are gone.
   * Returns false if there was nothing to delete, which is not an error.
   */
  delete(contextId: string): boolean {
    return this.db.transaction((): boolean => {
      const row = this.row(contextId);
      if (row === undefined || row.deleted) return false;
      this.stmt.markDeleted.run(contextId);
      let r: SnapshotRow | undefined = { ...row, deleted: 1 };
      while (r !== undefined && r.deleted && r.dependents === 0) {
        this.unref(r.header_hash);
        for (let i = 0; i < r.tail.length; i += HASH) this.unref(r.tail.subarray(i, i + HASH));
        this.stmt.remove.run(r.id);
        if (r.base_id === null) break;
        this.stmt.dropDependent.run(r.base_id);
        r = this.row(r.base_id);
      }
      return true;
    })();
  }

  /** Logical bytes (every snapshot stored whole) versus bytes actually stored. */
  stats(): ContextStoreStats {
    const live = this.stmt.liveStats.get() as { n: number; logical: number };
    const rows = this.stmt.rowStats.get() as { n: number; deleted: number; tail: number };
    const items = this.stmt.itemStats.get() as { n: number; bytes: number };
    return {
      snapshots: live.n,
      retainedDeleted: rows.deleted,
      items: items.n,
      logicalBytes: live.logical,
      storedBytes: items.bytes + rows.tail,
    };
  }

  private row(id: string): SnapshotRow | undefined {
    return this.stmt.row.get(id) as SnapshotRow | undefined;
  }

  private unpackItem(hash: Buffer): unknown {
    const data = this.stmt.item.get(hash) as Buffer | undefined;
    // Items are only removed when no snapshot row references them; a miss is corruption.
    if (data === undefined) throw new NotFoundError('context', `item ${hash.toString('hex')}`);
    return packr.unpack(data);
  }

  /** Takes a reference on an item, inserting it if new; returns the bytes added. */
  private ref(hash: Buffer, data: Buffer): number {
    if (this.stmt.addItem.run(hash, data).changes === 1) return data.length;
    this.stmt.refItem.run(hash);
    return 0;
  }

  private unref(hash: Buffer): void {
    this.stmt.unrefItem.run(hash);
    this.stmt.dropItem.run(hash);
  }

  /** The stored snapshot (live or retained) with the longest item list that prefixes ours. */
  private longestPrefix(digests: Buffer[]): { id: string; item_count: number; depth: number } | undefined {
    for (let hi = digests.length - 1; hi >= 1; hi -= PROBE) {
      const lo = Math.max(1, hi - PROBE + 1);
      const batch = digests.slice(lo, hi + 1);
      const rows = this.probe(batch.length).all(...batch) as {
        id: string;
        item_count: number;
        depth: number;
        list_digest: Buffer;
      }[];
      let best: (typeof rows)[number] | undefined;
      for (const r of rows) {
        // The digest commits to the length too; the item_count check is belt and braces.
        if (!r.list_digest.equals(digests[r.item_count] ?? Buffer.alloc(0))) continue;
        if (
          best === undefined ||
          r.item_count > best.item_count ||
          (r.item_count === best.item_count && r.depth < best.depth)
        )
          best = r;
      }
      if (best !== undefined) return best;
    }
    return undefined;
  }

  private probe(n: number): BetterSqlite3.Statement {
    let s = this.probes.get(n);
    if (s === undefined) {
      s = this.db.prepare(`SELECT id, item_count, depth, list_digest FROM agent_context_snapshots
        WHERE list_digest IN (${new Array(n).fill('?').join(',')})`);
      this.probes.set(n, s);
    }
    return s;
  }
}

function sha256(b: Uint8Array): Buffer {
  return createHash('sha256').update(b).digest();
}

/** d[0] = sha256(""), d[k] = sha256(d[k-1] || h[k-1]): d[k] identifies the first k hashes. */
function rollingDigests(hashes: Buffer[]): Buffer[] {
  const d: Buffer[] = [sha256(new Uint8Array(0))];
  for (const h of hashes)
    d.push(
      createHash('sha256')
        .update(d[d.length - 1]!)
        .update(h)
        .digest(),
    );
  return d;
}
