/**
 * Verdicts bound to file content: "pkg.tgz scanned clean", "tests pass on app.ts".
 *
 * A verdict is a judgement about bytes, so it is recorded with the content hash it was made on
 * and holds exactly as long as the file still has that hash, whatever timeline, rollback or fork
 * the sandbox is on. This stops a rollback from re-attaching a genuine judgement to content that
 * was never judged (restore the unscanned file, keep the "scan passed" belief). The module is
 * pure bookkeeping: the core hashes the sandbox's files and passes the lookup in.
 *
 * A verdict also belongs to the timeline it was made on, like an observation: it is sealed by
 * the first checkpoint taken after it, and a rollback abandons the verdicts that are not part of
 * the target's history (and brings back those that are). A rollback judges every verdict of the
 * restored timeline, and every verdict it abandons, against the restored bytes: no verdict hides
 * or supersedes another, since the agent's restored context holds all of the first kind and the
 * agent just held all of the second. Verdicts abandoned by an earlier rollback were reported then.
 */
import { randomBytes } from 'node:crypto';
import type BetterSqlite3 from 'better-sqlite3';
import { InvalidArgumentError } from '../errors.js';
import { ensureTables } from '../catalog/migrations.js';
import { memo } from './memo.js';

type Database = BetterSqlite3.Database;

/**
 * How a verdict's contentHash starts when it is about a file too large to
 * hash (over VERDICT_HASH_MAX_BYTES, 64 MiB): the file's size, mtime, ctime
 * and inode stand for its content (SandboxFiles.verdictHash).
 */

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
  /** Checkpoint that sealed it into its timeline; null while after the latest checkpoint. */
  sealedBy: string | null;
  /** Rollback that took it off the sandbox's timeline; null while on it. */
  abandonedBy: string | null;
  createdAt: number;
}

/** What a rollback did to the verdicts: the ones it restored and the ones it abandoned. */
export interface VerdictTimelines {
  /** Verdicts of the restored timeline (sealed into the target's history). */
  restored: Verdict[];
  /** Verdicts that were on the sandbox's timeline before the rollback and are not any more. */
  abandoned: Verdict[];
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
  sealed_by: string | null;
  abandoned_by: string | null;
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
    ensureTables(db, 'agent-state');
    this.stmt = {
      insert: db.prepare(`INSERT INTO agent_verdicts
        (id, sandbox_id, branch_id, path, content_hash, verdict, tool_call_id, observation_id, inherited_from,
          sealed_by, created_at)
        VALUES (@id, @sandbox_id, @branch_id, @path, @content_hash, @verdict, @tool_call_id, @observation_id,
          @inherited_from, @sealed_by, @created_at)
        RETURNING *`),
      bySandbox: db.prepare(`SELECT * FROM agent_verdicts WHERE sandbox_id = ? ORDER BY seq`),
      origins: db
        .prepare(`SELECT inherited_from FROM agent_verdicts WHERE sandbox_id = ? AND inherited_from IS NOT NULL`)
        .pluck(),
      // Abandoned unsealed verdicts belong to a timeline nobody is on any more: never seal them.
      seal: db.prepare(
        `UPDATE agent_verdicts SET sealed_by = ? WHERE sandbox_id = ? AND sealed_by IS NULL AND abandoned_by IS NULL`,
      ),
      abandon: db.prepare(`UPDATE agent_verdicts SET abandoned_by = ? WHERE id = ?`),
      restore: db.prepare(`UPDATE agent_verdicts SET abandoned_by = NULL WHERE id = ?`),
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
      sealed_by: null,
      created_at: this.clock(),
    }) as VerdictRow;
    return toVerdict(row);
  }

  /** Every verdict of the sandbox, in seq order. */
  list(sandboxId: string): Verdict[] {
    return (this.stmt.bySandbox.all(nonEmpty(sandboxId, 'sandboxId')) as VerdictRow[]).map(toVerdict);
  }

  /**
   * Every verdict recorded in the sandbox, on any timeline, whose file now has different content
   * or is gone. None supersedes another: an older "tests:pass" on other bytes is still a claim
   * someone may rely on, and a newer one on an abandoned timeline says nothing about it.
   */
  staleVerdicts(sandboxId: string, currentHashOf: CurrentHashOf): StaleVerdict[] {
    return judge(this.list(sandboxId), currentHashOf);
  }

  /**
   * Seals the sandbox's unsealed verdicts on its current timeline into a new
   * checkpoint (in the checkpoint transaction).
   */
  seal(sandboxId: string, checkpointId: string): number {
    return this.stmt.seal.run(nonEmpty(checkpointId, 'checkpointId'), nonEmpty(sandboxId, 'sandboxId')).changes;
  }

  /**
   * The rollback step (inside the rollback transaction): verdicts sealed by an ancestor-or-self
   * of the target make up the restored timeline (ones an earlier rollback abandoned come back);
   * the others that were on the timeline until now are abandoned. Returns both sets; judge them
   * with staleAfterRollback() once the target's files are in place.
   */
  applyRollback(
    sandboxId: string,
    isAncestorOrSelf: (checkpointId: string) => boolean,
    rollbackId: string,
  ): VerdictTimelines {
    nonEmpty(rollbackId, 'rollbackId');
    const anc = memo(isAncestorOrSelf);
    return this.db.transaction(() => {
      const restored: Verdict[] = [];
      const abandoned: Verdict[] = [];
      for (const v of this.list(sandboxId)) {
        if (v.sealedBy !== null && anc(v.sealedBy)) {
          if (v.abandonedBy !== null) this.stmt.restore.run(v.id);
          restored.push({ ...v, abandonedBy: null });
        } else if (v.abandonedBy === null) {
          this.stmt.abandon.run(rollbackId, v.id);
          abandoned.push({ ...v, abandonedBy: rollbackId });
        }
      }
      return { restored, abandoned };
    })();
  }

  /** Of the verdicts a rollback restored or abandoned, those that do not hold on the restored bytes, in seq order. */
  staleAfterRollback(timelines: VerdictTimelines, currentHashOf: CurrentHashOf): StaleVerdict[] {
    return judge(
      [...timelines.restored, ...timelines.abandoned].sort((a, b) => a.seq - b.seq),
      currentHashOf,
    );
  }

  /** The latest verdict `verdict` on `path` that still matches the file's content, or null. */
  currentVerdict(sandboxId: string, path: string, verdict: string, currentHash: string | null): Verdict | null {
    nonEmpty(path, 'path');
    nonEmpty(verdict, 'verdict');
    if (currentHash === null) return null;
    const matching = this.list(sandboxId).filter(
      (v) => v.path === path && v.verdict === verdict && v.contentHash === currentHash,
    );
    return matching.at(-1) ?? null;
  }

  /**
   * Copies into a new fork the parent's verdicts that are part of the fork checkpoint's history
   * (sealed by an ancestor-or-self of it), keeping the seal, as observations do: the fork's
   * timeline is that history. Idempotent; returns how many were copied.
   */
  inheritForFork(
    parentSandboxId: string,
    childSandboxId: string,
    childBranchId: string,
    isAncestorOrSelf: (checkpointId: string) => boolean,
  ): number {
    nonEmpty(parentSandboxId, 'parentSandboxId');
    nonEmpty(childSandboxId, 'childSandboxId');
    nonEmpty(childBranchId, 'childBranchId');
    const anc = memo(isAncestorOrSelf);
    return this.db.transaction(() => {
      const have = new Set(this.stmt.origins.all(childSandboxId) as string[]);
      let n = 0;
      for (const r of this.stmt.bySandbox.all(parentSandboxId) as VerdictRow[]) {
        const origin = r.inherited_from ?? r.id;
        if (r.sealed_by === null || !anc(r.sealed_by) || have.has(origin)) continue;
        const { seq: _seq, abandoned_by: _abandonedBy, ...facts } = r;
        this.stmt.insert.get({
          ...facts,
          id: `vrd_${randomBytes(10).toString('hex')}`,
          sandbox_id: childSandboxId,
          branch_id: childBranchId,
          inherited_from: origin,
        });
        n++;
      }
      return n;
    })();
  }
}

function judge(verdicts: Verdict[], currentHashOf: CurrentHashOf): StaleVerdict[] {
  const lookup = memoHash(currentHashOf);
  const out: StaleVerdict[] = [];
  for (const v of verdicts) {
    const currentHash = lookup(v.path);
    if (currentHash !== v.contentHash) out.push({ ...v, currentHash });
  }
  return out;
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
    sealedBy: r.sealed_by,
    abandonedBy: r.abandoned_by,
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

function memoHash(fn: CurrentHashOf): CurrentHashOf {
  if (typeof fn !== 'function') throw new InvalidArgumentError('currentHashOf', 'a function', fn);
  const cache = new Map<string, string | null>();
  return (path) => {
    if (!cache.has(path)) cache.set(path, fn(path));
    return cache.get(path)!;
  };
}
