/**
 * Verdicts bound to file content: "src/pkg.tgz scanned clean", "tests pass on src/app.ts".
 *
 * A verdict is a judgement about bytes, so it is recorded with the content hash it was made on
 * and holds exactly as long as the file still has that hash, whatever timeline, rollback or fork
 * the sandbox is on. This stops a rollback from re-attaching a genuine judgement to content that
 * was never judged (restore the unscanned file, keep the "scan passed" belief). The module is
 * pure bookkeeping: the core hashes the sandbox's files and passes the lookup in.
 */
import { randomBytes } from 'node:crypto';
import type BetterSqlite3 from 'better-sqlite3';
import { InvalidArgumentError } from '../errors.js';
import { migrateAgentState } from '../agent-state/schema.js';

type Database = BetterSqlite3.Database;

/** What record() needs. */
export interface VerdictInput {
  sandboxId: string;
  branchId: string;
  path: string;
  /** Hash of the file content the verdict was made on (same hash function as the core's lookup). */
  contentHash: string;
  /** The judgement, e.g. 'malware-scan:clean', 'tests:pass'. */
  verdict: string;
  toolCallId?: string;
  observationId?: string;
}

/** A verdict as stored. */
export interface Verdict {
  id: string;
  seq: number;
  sandboxId: string;
  branchId: string;
  path: string;
  contentHash: string;
  verdict: string;
  toolCallId: string | null;
  observationId: string | null;
  /** For a fork's copy: the id of the original verdict. */
  inheritedFrom: string | null;
  createdAt: number;
}

/** A stale verdict and what the file holds now (null: the file is gone). */
export interface StaleVerdict extends Verdict {
  currentHash: string | null;
}

interface VerdictRow {
  seq: number;
  id: string;
  sandbox_id: string;
  branch_id: string;
  path: string;
  content_hash: string;
  verdict: string;
  tool_call_id: string | null;
  observation_id: string | null;
  inherited_from: string | null;
  created_at: number;
}

/** Hash of a path's current content in the sandbox, or null if it does not exist. */
export type CurrentHashOf = (path: string) => string | null;

/** Records verdicts and tells which no longer match the files they judged. */
export class VerdictLog {
  private readonly db: Database;
  private readonly clock: () => number;
  private readonly stmt;

  constructor(db: Database, clock: () => number = Date.now) {
    this.db = db;
    this.clock = clock;
    migrateAgentState(db);
    this.stmt = {
      insert: db.prepare(`INSERT INTO agent_verdicts
        (id, sandbox_id, branch_id, path, content_hash, verdict, tool_call_id, observation_id, inherited_from, created_at)
        VALUES (@id, @sandbox_id, @branch_id, @path, @content_hash, @verdict, @tool_call_id, @observation_id, @inherited_from, @created_at)
        RETURNING *`),
      bySandbox: db.prepare(`SELECT * FROM agent_verdicts WHERE sandbox_id = ? ORDER BY seq`),
      origins: db.prepare(`SELECT inherited_from FROM agent_verdicts WHERE sandbox_id = ? AND inherited_from IS NOT NULL`).pluck(),
    };
  }

  /** Records a verdict on the given content of a file. */
  record(input: VerdictInput): Verdict {
    if (typeof input !== 'object' || input === null) throw new InvalidArgumentError('verdict', 'an object', input);
    const row = this.stmt.insert.get({
      id: `vrd_${randomBytes(10).toString('hex')}`,
      sandbox_id: nonEmpty(input.sandboxId, 'verdict.sandboxId'),
      branch_id: nonEmpty(input.branchId, 'verdict.branchId'),
      path: nonEmpty(input.path, 'verdict.path'),
      content_hash: nonEmpty(input.contentHash, 'verdict.contentHash'),
      verdict: nonEmpty(input.verdict, 'verdict.verdict'),
      tool_call_id: optional(input.toolCallId, 'verdict.toolCallId'),
      observation_id: optional(input.observationId, 'verdict.observationId'),
      inherited_from: null,
      created_at: this.clock(),
    }) as VerdictRow;
    return toVerdict(row);
  }

  /** Every verdict of the sandbox, in seq order. */
  list(sandboxId: string): Verdict[] {
    return (this.stmt.bySandbox.all(nonEmpty(sandboxId, 'sandboxId')) as VerdictRow[]).map(toVerdict);
  }

  /**
   * Verdicts whose file now has different content or is gone. By default only the latest
   * verdict per (path, verdict) is considered: an older "tests:pass" superseded by a newer one
   * is history, not a belief the agent still holds.
   */
  staleVerdicts(sandboxId: string, currentHashOf: CurrentHashOf, opts: { includeSuperseded?: boolean } = {}): StaleVerdict[] {
    const lookup = memo(currentHashOf);
    const out: StaleVerdict[] = [];
    for (const v of this.candidates(sandboxId, opts.includeSuperseded === true)) {
      const currentHash = lookup(v.path);
      if (currentHash !== v.contentHash) out.push({ ...v, currentHash });
    }
    return out;
  }

  /** The latest verdict `verdict` on `path` that still matches the file's content, or null. */
  currentVerdict(sandboxId: string, path: string, verdict: string, currentHash: string | null): Verdict | null {
    nonEmpty(path, 'path');
    nonEmpty(verdict, 'verdict');
    if (currentHash === null) return null;
    const matching = this.list(sandboxId).filter((v) => v.path === path && v.verdict === verdict && v.contentHash === currentHash);
    return matching.at(-1) ?? null;
  }

  /**
   * Copies the parent's verdicts into a new fork. Verdicts are bound to content, not to time,
   * so all of them can be inherited: ones made after the fork point on content the fork does
   * not have are simply stale there. Idempotent; returns how many were copied.
   */
  inheritForFork(parentSandboxId: string, childSandboxId: string, childBranchId: string): number {
    nonEmpty(parentSandboxId, 'parentSandboxId');
    nonEmpty(childSandboxId, 'childSandboxId');
    nonEmpty(childBranchId, 'childBranchId');
    return this.db.transaction(() => {
      const have = new Set(this.stmt.origins.all(childSandboxId) as string[]);
      let n = 0;
      for (const r of this.stmt.bySandbox.all(parentSandboxId) as VerdictRow[]) {
        const origin = r.inherited_from ?? r.id;
        if (have.has(origin)) continue;
        const { seq: _seq, ...facts } = r;
        this.stmt.insert.get({ ...facts, id: `vrd_${randomBytes(10).toString('hex')}`, sandbox_id: childSandboxId, branch_id: childBranchId, inherited_from: origin });
        n++;
      }
      return n;
    })();
  }

  private candidates(sandboxId: string, includeSuperseded: boolean): Verdict[] {
    const all = this.list(sandboxId);
    if (includeSuperseded) return all;
    const latest = new Map<string, Verdict>();
    for (const v of all) latest.set(JSON.stringify([v.path, v.verdict]), v);
    return [...latest.values()].sort((a, b) => a.seq - b.seq);
  }
}

function toVerdict(r: VerdictRow): Verdict {
  return {
    id: r.id,
    seq: r.seq,
    sandboxId: r.sandbox_id,
    branchId: r.branch_id,
    path: r.path,
    contentHash: r.content_hash,
    verdict: r.verdict,
    toolCallId: r.tool_call_id,
    observationId: r.observation_id,
    inheritedFrom: r.inherited_from,
    createdAt: r.created_at,
  };
}

function nonEmpty(v: unknown, field: string): string {
  if (typeof v !== 'string' || v === '') throw new InvalidArgumentError(field, 'a non-empty string', v);
  return v;
}

function optional(v: unknown, field: string): string | null {
  return v === undefined || v === null ? null : nonEmpty(v, field);
}

function memo(fn: CurrentHashOf): CurrentHashOf {
  if (typeof fn !== 'function') throw new InvalidArgumentError('currentHashOf', 'a function', fn);
  const cache = new Map<string, string | null>();
  return (path) => {
    if (!cache.has(path)) cache.set(path, fn(path));
    return cache.get(path)!;
  };
}
