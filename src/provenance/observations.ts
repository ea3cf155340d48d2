/**
 * What the agent observed in its sandbox (commands run, files read, written or listed), bound
 * to the timeline it observed it on. After a rollback these tell which of the agent's
 * beliefs no longer hold: everything it saw after the target checkpoint.
 *
 * Each observation is sealed by the first checkpoint taken after it. At a rollback to target T,
 * an observation is still true iff it was sealed by an ancestor-or-self of T; unsealed ones and
 * those sealed by checkpoints off T's path are stale. The checkpoint tree belongs to the core,
 * which passes the ancestry test as a predicate.
 *
 * Forks copy the parent's observations up to the fork checkpoint into the child (rows are
 * small metadata, and staleness is per sandbox: a child rolling back must not make the parent's
 * observations stale). Copies keep `sealedBy`, so the same ancestry test applies to them.
 */
import { randomBytes } from 'node:crypto';
import type BetterSqlite3 from 'better-sqlite3';
import { InvalidArgumentError, NotFoundError } from '../errors.js';
import { ensureTables } from '../catalog/migrations.js';
import { memo } from './memo.js';

type Database = BetterSqlite3.Database;

/** What was observed. 'verdict' marks a judgement (see verdicts.ts) made as an observation. */
export type ObservationKind = 'command' | 'file-read' | 'file-write' | 'file-list' | 'verdict';

/** Every observation kind. */
export const OBSERVATION_KINDS: readonly ObservationKind[] = [
  'command',
  'file-read',
  'file-write',
  'file-list',
  'verdict',
];

/** What record() needs. */
export interface ObservationInput {
  sandboxId: string;
  branchId: string;
  lineageId: string;
  /** Checkpoint the current timeline started from; null before the first checkpoint. */
  epochCheckpointId: string | null;
  kind: ObservationKind;
  toolCallId?: string;
  /** Command line or path. */
  subject: string;
  contentHash?: string;
  exitCode?: number;
  summary?: string;
}

/** An observation as stored. */
export interface Observation {
  id: string;
  /** Monotonic across the database. */
  seq: number;
  sandboxId: string;
  branchId: string;
  lineageId: string;
  epochCheckpointId: string | null;
  kind: ObservationKind;
  toolCallId: string | null;
  subject: string;
  contentHash: string | null;
  exitCode: number | null;
  summary: string | null;
  /** Checkpoint that sealed it into its timeline; null while after the latest checkpoint. */
  sealedBy: string | null;
  /** Rollback that made it stale, if it is stale. */
  staleRollbackId: string | null;
  staleAt: number | null;
  /** For a fork's copy: the id of the original observation. */
  inheritedFrom: string | null;
  createdAt: number;
}

interface ObservationRow {
  seq: number;
  id: string;
  sandbox_id: string;
  branch_id: string;
  lineage_id: string;
  epoch_checkpoint_id: string | null;
  kind: ObservationKind;
  tool_call_id: string | null;
  subject: string;
  content_hash: string | null;
  exit_code: number | null;
  summary: string | null;
  sealed_by: string | null;
  stale_rollback_id: string | null;
  stale_at: number | null;
  inherited_from: string | null;
  created_at: number;
}

/** Records observations and works out which go stale when a sandbox rolls back. */
export class ObservationLog {
  private readonly db: Database;
  private readonly clock: () => number;
  private readonly stmt;

  constructor(db: Database, clock: () => number = Date.now) {
    this.db = db;
    this.clock = clock;
    ensureTables(db, 'agent-state');
    this.stmt = {
      insert: db.prepare(`INSERT INTO agent_observations
        (id, sandbox_id, branch_id, lineage_id, epoch_checkpoint_id, kind, tool_call_id, subject, content_hash,
         exit_code, summary, sealed_by, inherited_from, created_at)
        VALUES (@id, @sandbox_id, @branch_id, @lineage_id, @epoch_checkpoint_id, @kind, @tool_call_id, @subject,
          @content_hash,
         @exit_code, @summary, @sealed_by, @inherited_from, @created_at)
        RETURNING *`),
      byId: db.prepare(`SELECT * FROM agent_observations WHERE id = ?`),
      bySandbox: db.prepare(`SELECT * FROM agent_observations WHERE sandbox_id = ? ORDER BY seq`),
      // Stale unsealed observations belong to an abandoned timeline and must never be sealed.
      seal: db.prepare(`UPDATE agent_observations SET sealed_by = ?
        WHERE sandbox_id = ? AND sealed_by IS NULL AND stale_rollback_id IS NULL`),
      live: db.prepare(
        `SELECT * FROM agent_observations WHERE sandbox_id = ? AND stale_rollback_id IS NULL ORDER BY seq`,
      ),
      staleSealed: db.prepare(`SELECT * FROM agent_observations
        WHERE sandbox_id = ? AND stale_rollback_id IS NOT NULL AND sealed_by IS NOT NULL`),
      markStale: db.prepare(
        `UPDATE agent_observations SET stale_rollback_id = ?, stale_at = ? WHERE id = ? AND stale_rollback_id IS NULL`,
      ),
      revive: db.prepare(`UPDATE agent_observations SET stale_rollback_id = NULL, stale_at = NULL WHERE id = ?`),
      origins: db
        .prepare(`SELECT inherited_from FROM agent_observations WHERE sandbox_id = ? AND inherited_from IS NOT NULL`)
        .pluck(),
    };
  }

  /** Records one observation on the sandbox's current (unsealed) timeline. */
  record(input: ObservationInput): Observation {
    if (typeof input !== 'object' || input === null) throw new InvalidArgumentError('observation', 'an object', input);
    if (!OBSERVATION_KINDS.includes(input.kind)) {
      throw new InvalidArgumentError('observation.kind', OBSERVATION_KINDS.map((k) => `'${k}'`).join(', '), input.kind);
    }
    if (input.exitCode !== undefined && !Number.isInteger(input.exitCode)) {
      throw new InvalidArgumentError('observation.exitCode', 'an integer', input.exitCode);
    }
    if (input.summary !== undefined && typeof input.summary !== 'string') {
      throw new InvalidArgumentError('observation.summary', 'a string', input.summary);
    }
    const row = this.stmt.insert.get({
      id: `obs_${randomBytes(10).toString('hex')}`,
      sandbox_id: nonEmpty(input.sandboxId, 'observation.sandboxId'),
      branch_id: nonEmpty(input.branchId, 'observation.branchId'),
      lineage_id: nonEmpty(input.lineageId, 'observation.lineageId'),
      epoch_checkpoint_id: optional(input.epochCheckpointId, 'observation.epochCheckpointId'),
      kind: input.kind,
      tool_call_id: optional(input.toolCallId, 'observation.toolCallId'),
      subject: nonEmpty(input.subject, 'observation.subject'),
      content_hash: optional(input.contentHash, 'observation.contentHash'),
      exit_code: input.exitCode ?? null,
      summary: input.summary ?? null,
      sealed_by: null,
      inherited_from: null,
      created_at: this.clock(),
    }) as ObservationRow;
    return toObservation(row);
  }

  /** One observation by id. */
  get(id: string): Observation {
    const row = this.stmt.byId.get(nonEmpty(id, 'id')) as ObservationRow | undefined;
    if (row === undefined) throw new NotFoundError('observation', id);
    return toObservation(row);
  }

  /** The sandbox's observations in seq order; stale ones only if asked. */
  list(sandboxId: string, opts: { includeStale?: boolean } = {}): Observation[] {
    const stmt = opts.includeStale === false ? this.stmt.live : this.stmt.bySandbox;
    return (stmt.all(nonEmpty(sandboxId, 'sandboxId')) as ObservationRow[]).map(toObservation);
  }

  /** Seals the sandbox's unsealed, non-stale observations into a new checkpoint (in the checkpoint transaction). */
  seal(sandboxId: string, checkpointId: string): number {
    return this.stmt.seal.run(nonEmpty(checkpointId, 'checkpointId'), nonEmpty(sandboxId, 'sandboxId')).changes;
  }

  /**
   * Observations that stop being true when the sandbox rolls back to the target: not already
   * stale, and unsealed or sealed by a checkpoint that is not an ancestor-or-self of the target.
   */
  staleAfterRollback(
    sandboxId: string,
    targetCheckpointId: string,
    isAncestorOrSelf: (sealedBy: string) => boolean,
  ): Observation[] {
    nonEmpty(targetCheckpointId, 'targetCheckpointId');
    const anc = memo(isAncestorOrSelf);
    const rows = this.stmt.live.all(nonEmpty(sandboxId, 'sandboxId')) as ObservationRow[];
    return rows.filter((r) => r.sealed_by === null || !anc(r.sealed_by)).map(toObservation);
  }

  /** Marks observations stale because of a rollback; already stale ones keep their first mark. */
  markStale(ids: string[], rollbackId: string): number {
    if (!Array.isArray(ids)) throw new InvalidArgumentError('ids', 'an array of observation ids', ids);
    nonEmpty(rollbackId, 'rollbackId');
    const now = this.clock();
    return this.db.transaction(() =>
      ids.reduce((n, id, i) => n + this.stmt.markStale.run(rollbackId, now, nonEmpty(id, `ids[${i}]`)).changes, 0),
    )();
  }

  /**
   * The rollback step in one call (inside the rollback transaction): marks what
   * staleAfterRollback() returns stale, and makes true again observations an earlier rollback
   * made stale that are sealed into the target's history (rolling "forward" to a checkpoint
   * of an abandoned timeline). Returns the newly stale observations.
   */
  applyRollback(
    sandboxId: string,
    targetCheckpointId: string,
    isAncestorOrSelf: (sealedBy: string) => boolean,
    rollbackId: string,
  ): Observation[] {
    nonEmpty(rollbackId, 'rollbackId');
    const anc = memo(isAncestorOrSelf);
    return this.db.transaction(() => {
      const stale = this.staleAfterRollback(sandboxId, targetCheckpointId, anc);
      for (const r of this.stmt.staleSealed.all(sandboxId) as ObservationRow[]) {
        if (anc(r.sealed_by!)) this.stmt.revive.run(r.id);
      }
      this.markStale(
        stale.map((o) => o.id),
        rollbackId,
      );
      return stale.map((o) => this.get(o.id));
    })();
  }

  /**
   * Copies into a new fork the parent's observations that are part of the fork checkpoint's
   * history (sealed by an ancestor-or-self of it). Idempotent. Returns how many were copied.
   */
  inheritForFork(
    parentSandboxId: string,
    checkpointId: string,
    childSandboxId: string,
    childBranchId: string,
    isAncestorOrSelf: (sealedBy: string) => boolean,
  ): number {
    nonEmpty(parentSandboxId, 'parentSandboxId');
    nonEmpty(checkpointId, 'checkpointId');
    nonEmpty(childSandboxId, 'childSandboxId');
    nonEmpty(childBranchId, 'childBranchId');
    const anc = memo(isAncestorOrSelf);
    return this.db.transaction(() => {
      const have = new Set(this.stmt.origins.all(childSandboxId) as string[]);
      let n = 0;
      for (const r of this.stmt.bySandbox.all(parentSandboxId) as ObservationRow[]) {
        const origin = r.inherited_from ?? r.id;
        if (r.sealed_by === null || !anc(r.sealed_by) || have.has(origin)) continue;
        const { seq: _seq, stale_rollback_id: _staleBy, stale_at: _staleAt, ...facts } = r;
        this.stmt.insert.get({
          ...facts,
          id: `obs_${randomBytes(10).toString('hex')}`,
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

function toObservation(r: ObservationRow): Observation {
  return {
    id: r.id,
    seq: r.seq,
    sandboxId: r.sandbox_id,
    branchId: r.branch_id,
    lineageId: r.lineage_id,
    epochCheckpointId: r.epoch_checkpoint_id,
    kind: r.kind,
    toolCallId: r.tool_call_id,
    subject: r.subject,
    contentHash: r.content_hash,
    exitCode: r.exit_code,
    summary: r.summary,
    sealedBy: r.sealed_by,
    staleRollbackId: r.stale_rollback_id,
    staleAt: r.stale_at,
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
