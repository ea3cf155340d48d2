/**
 * The effect ledger: a durable record of every side effect an agent causes outside the
 * copy-on-write sandbox (payments, e-mails, API calls) and of those inside it worth tracking.
 *
 * Rollback restores files and processes, not the world. The ledger is what lets Lockstep
 * (a) refuse to run an effect twice in a lineage, however many rollbacks and forks there are,
 * (b) tell a rolled-back agent which effects already happened, and (c) run compensations.
 *
 * Intent is written (status `pending`) before the effect runs, so a crash between running it
 * and recording its outcome leaves a `pending` row that recoverAfterCrash() turns into
 * `unknown`; an unknown effect is never retried automatically, only settled by an operator.
 *
 * Write methods are synchronous and use db.transaction(), which nests as a savepoint inside the
 * core's checkpoint/rollback transaction. run() and compensate() await caller code, so they
 * cannot be called inside a transaction; each of their steps commits on its own.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type BetterSqlite3 from 'better-sqlite3';
import { InvalidArgumentError, InvalidStateError, LockstepError, NotFoundError } from '../errors.js';
import { ensureTables } from '../catalog/migrations.js';
import { type EffectScope, type JsonValue, canonicalJson, deriveKey } from './idempotency.js';
import { memo } from '../provenance/memo.js';

type Database = BetterSqlite3.Database;

/** What undoes an effect: the sandbox rollback itself, a compensating action, or nothing. */
export type Reversibility = 'sandbox-local' | 'compensable' | 'irreversible';

/** Lifecycle of one attempt. `unknown`: it may or may not have happened. */
export type EffectStatus = 'pending' | 'committed' | 'failed' | 'unknown' | 'compensated';

/** Where the effect is requested from. */
export interface EffectContext {
  sandboxId: string;
  /** Id of the root sandbox of the fork family; shared by every fork. */
  lineageId: string;
  /** Id of the current timeline; a new one is minted at creation, fork and rollback. */
  branchId: string;
  /** Checkpoint the sandbox's current timeline starts from (null before the first one). */
  epochCheckpointId: string | null;
}

/** The action that takes a compensable effect back. */
export interface CompensationSpec {
  kind: string;
  input: JsonValue;
}

/** What the caller is about to do. */
export interface EffectSpec {
  kind: string;
  input: JsonValue;
  reversibility: Reversibility;
  /** Default: 'branch' for sandbox-local effects (always), 'lineage' otherwise. */
  scope?: EffectScope;
  /** Caller-chosen idempotency key; still namespaced by lineage (and branch when branch-scoped). */
  key?: string;
  /** Recorded for provenance; not part of the derived key (see begin()). */
  toolCallId?: string;
  /** Required for compensable effects, refused for others. */
  compensation?: CompensationSpec;
}

/** Outcome of begin(): either run the effect now, or here is what it returned last time. */
export type BeginResult =
  | { replayed: false; effectId: string; idempotencyKey: string; attempt: number }
  | { replayed: true; effectId: string; idempotencyKey: string; output: JsonValue | undefined };

/** An error as recorded in the ledger. */
export interface RecordedError {
  name: string;
  message: string;
  code?: string;
}

/** One row of the ledger: an attempt at an effect, or a compensation of one. */
export interface EffectRecord {
  id: string;
  seq: number;
  lineageId: string;
  sandboxId: string;
  branchId: string;
  epochCheckpointId: string | null;
  /** Checkpoint that sealed it into its timeline; null while after the latest checkpoint. */
  sealedBy: string | null;
  /** Rollback that abandoned it while unsealed. */
  abandonedBy: string | null;
  kind: string;
  input: JsonValue;
  /** undefined: not committed, or committed without output. */
  output: JsonValue | undefined;
  reversibility: Reversibility;
  scope: EffectScope;
  idempotencyKey: string;
  toolCallId: string | null;
  compensation: CompensationSpec | null;
  status: EffectStatus;
  /** For failed: true if it certainly did not happen. */
  definite: boolean | null;
  error: RecordedError | null;
  attempt: number;
  /** On a compensation row: the effect it takes back. */
  compensatesId: string | null;
  /** On a compensated effect: its compensation row. */
  compensatedBy: string | null;
  /** Position in the global commit order (null until committed). */
  commitOrder: number | null;
  createdAt: number;
  settledAt: number | null;
}

/** Settlement of an unknown effect by an operator who checked the outside world. */
export type Resolution = { outcome: 'committed'; output?: JsonValue } | { outcome: 'failed' };

/** Which effects compensate() should take back. */
export type CompensateTarget =
  | string[]
  | { after: { sandboxId: string; targetCheckpointId: string; isAncestorOrSelf: (checkpointId: string) => boolean } };

/** One compensation done (or found already done) by compensate(). */
export interface CompensationResult {
  effectId: string;
  compensationId: string;
  output: JsonValue | undefined;
  /** True if it had already been compensated; the runner was not called. */
  replayed: boolean;
}

/** Rollback policy: warn about effects the rollback cannot take back, or refuse it. */
export type RollbackPolicy = 'warn' | 'refuse';

/** An effect on the abandoned timeline that the rollback does not undo. */
export interface RollbackWarning {
  effectId: string;
  kind: string;
  status: EffectStatus;
  reversibility: Reversibility;
  reason: 'irreversible' | 'outcome-unknown' | 'not-compensated';
  message: string;
}

/** An earlier attempt of this effect may or may not have happened; it is never retried blindly. */
export class EffectOutcomeUnknownError extends LockstepError {
  readonly effect: EffectRecord;
  constructor(effect: EffectRecord) {
    super(
      'EFFECT_OUTCOME_UNKNOWN',
      `Effect ${effect.id} (${effect.kind}) is ${effect.status}: it may already have happened. ` +
        `Check the outside world and settle it with resolveUnknown() before trying again.`,
      {
        details: {
          effectId: effect.id,
          kind: effect.kind,
          status: effect.status,
          idempotencyKey: effect.idempotencyKey,
        },
      },
    );
    this.effect = effect;
  }
}

/** Rollback refused because irreversible effects on the abandoned timeline cannot be taken back. */
export class IrreversibleEffectError extends LockstepError {
  readonly effects: EffectRecord[];
  constructor(effects: EffectRecord[]) {
    super(
      'ROLLBACK_REFUSED_IRREVERSIBLE',
      `Rollback refused: ${effects.length} irreversible effect(s) ` +
        `happened (or may have) after the target checkpoint: ` +
        effects.map((e) => `${e.id} ${e.kind} (${e.status})`).join(', '),
      { details: { effectIds: effects.map((e) => e.id) } },
    );
    this.effects = effects;
  }
}

interface EffectRow {
  seq: number;
  id: string;
  lineage_id: string;
  sandbox_id: string;
  branch_id: string;
  epoch_checkpoint_id: string | null;
  sealed_by: string | null;
  abandoned_by: string | null;
  kind: string;
  input: string;
  output: string | null;
  reversibility: Reversibility;
  scope: EffectScope;
  idempotency_key: string;
  tool_call_id: string | null;
  compensation: string | null;
  status: EffectStatus;
  definite: number | null;
  error: string | null;
  attempt: number;
  compensates_id: string | null;
  compensated_by: string | null;
  commit_order: number | null;
  created_at: number;
  settled_at: number | null;
}

const REVERSIBILITIES: readonly Reversibility[] = ['sandbox-local', 'compensable', 'irreversible'];
const LIVE: readonly EffectStatus[] = ['pending', 'unknown', 'committed'];

/** Durable record of side effects: intent before action, exactly-once per lineage or branch. */
export class EffectLedger {
  private readonly db: Database;
  private readonly clock: () => number;
  private readonly stmt;

  constructor(db: Database, clock: () => number = Date.now) {
    this.db = db;
    this.clock = clock;
    ensureTables(db, 'agent-state');
    const live = LIVE.map((s) => `'${s}'`).join(',');
    this.stmt = {
      byId: db.prepare(`SELECT * FROM agent_effects WHERE id = ?`),
      live: db.prepare(`SELECT * FROM agent_effects WHERE idempotency_key = ? AND status IN (${live}) LIMIT 1`),
      attempts: db.prepare(`SELECT count(*) FROM agent_effects WHERE idempotency_key = ?`).pluck(),
      insert: db.prepare(`INSERT INTO agent_effects
        (id, lineage_id, sandbox_id, branch_id, epoch_checkpoint_id, kind, input, reversibility, scope,
         idempotency_key, tool_call_id, compensation, status, attempt, compensates_id, created_at)
        VALUES (@id, @lineage_id, @sandbox_id, @branch_id, @epoch_checkpoint_id, @kind, @input, @reversibility, @scope,
         @idempotency_key, @tool_call_id, @compensation, 'pending', @attempt, @compensates_id, @created_at)`),
      nextCommitOrder: db.prepare(`SELECT coalesce(max(commit_order), 0) + 1 FROM agent_effects`).pluck(),
      settleCommitted:
        db.prepare(`UPDATE agent_effects SET status = 'committed', output = ?, error = ?, definite = NULL,
        commit_order = ?, settled_at = ? WHERE id = ?`),
      settleFailed: db.prepare(
        `UPDATE agent_effects SET status = ?, definite = ?, error = ?, settled_at = ? WHERE id = ?`,
      ),
      markCompensated: db.prepare(`UPDATE agent_effects SET status = 'compensated', compensated_by = ? WHERE id = ?`),
      runnersPending: db
        .prepare(`SELECT DISTINCT runner FROM agent_effects WHERE status = 'pending' AND runner IS NOT NULL`)
        .pluck(),
      recover: db.prepare(
        `UPDATE agent_effects SET status = 'unknown', error = ? WHERE status = 'pending' AND runner = ? RETURNING *`,
      ),
      setRunner: db.prepare(`UPDATE agent_effects SET runner = ? WHERE id = ?`),
      seal: db.prepare(`UPDATE agent_effects SET sealed_by = ?
        WHERE sandbox_id = ? AND sealed_by IS NULL AND abandoned_by IS NULL`),
      abandon: db.prepare(
        `UPDATE agent_effects SET abandoned_by = ? WHERE sandbox_id = ? AND sealed_by IS NULL AND abandoned_by IS NULL`,
      ),
      cursor: db.prepare(`SELECT coalesce(max(seq), 0) FROM agent_effects WHERE sandbox_id = ?`).pluck(),
      timeline: db.prepare(`SELECT * FROM agent_effects WHERE sandbox_id = ?
        UNION SELECT e.* FROM agent_effects e JOIN agent_effect_views v ON v.effect_id = e.id WHERE v.sandbox_id = ?
        ORDER BY seq`),
      addView: db.prepare(`INSERT OR IGNORE INTO agent_effect_views(sandbox_id, effect_id) VALUES (?, ?)`),
      bySandbox: db.prepare(`SELECT * FROM agent_effects WHERE sandbox_id = ? ORDER BY seq`),
      byLineage: db.prepare(`SELECT * FROM agent_effects WHERE lineage_id = ? ORDER BY seq`),
    };
  }

  /** Opens the ledger as the owning process does at start-up: attempts left pending by a crash become unknown. */
  static open(db: Database, clock: () => number = Date.now): EffectLedger {
    const ledger = new EffectLedger(db, clock);
    ledger.recoverAfterCrash();
    return ledger;
  }

  /**
   * Durably records the intent to run an effect, before it runs. Returns replayed: true with
   * the recorded output if the same effect (same idempotency key) already committed; throws
   * EffectOutcomeUnknownError if an attempt is pending or unknown. A definitely failed or
   * compensated earlier attempt allows a new one.
   *
   * The derived key covers kind + input (+ branch when branch-scoped), not the tool-call id:
   * after a rollback the model re-issues the same action under a fresh tool-call id, and it is
   * exactly that repeat the lineage scope must catch. Callers that want two identical actions
   * to both run pass distinct `key`s.
   */
  begin(ctx: EffectContext, spec: EffectSpec): BeginResult {
    return this.beginRow(ctx, spec, null);
  }

  /** Records that the effect happened, with its output (JSON; undefined for none). */
  commit(effectId: string, output?: JsonValue): void {
    const outputJson = output === undefined ? null : jsonText(output, 'output');
    this.db.transaction(() => this.settleCommitted(this.unsettled(effectId), outputJson, null))();
  }

  /**
   * Records that the effect failed. definite: true means it certainly did not happen (it may be
   * retried); otherwise the outcome is unknown and the effect will not be retried blindly.
   */
  fail(effectId: string, err: unknown, opts: { definite: boolean }): void {
    if (typeof opts?.definite !== 'boolean')
      throw new InvalidArgumentError('opts.definite', 'a boolean', opts?.definite);
    this.db.transaction(() => {
      this.unsettled(effectId);
      this.stmt.settleFailed.run(
        opts.definite ? 'failed' : 'unknown',
        opts.definite ? 1 : 0,
        JSON.stringify(errorInfo(err)),
        this.clock(),
        effectId,
      );
    })();
  }

  /**
   * begin → (replayed ? recorded output : fn() → commit). A throw from fn is recorded as an
   * unknown outcome unless the error carries `definite: true`, then rethrown.
   */
  async run<T extends JsonValue | undefined | void>(
    ctx: EffectContext,
    spec: EffectSpec,
    fn: () => T | Promise<T>,
  ): Promise<T> {
    const b = this.db.transaction(() => {
      const r = this.begin(ctx, spec);
      if (!r.replayed) this.stmt.setRunner.run(currentRunner(), r.effectId);
      return r;
    })();
    if (b.replayed) return b.output as T;
    let output: T;
    try {
      output = await fn();
    } catch (err) {
      this.fail(b.effectId, err, { definite: isDefinite(err) });
      throw err;
    }
    this.commitFromRun(b.effectId, output as JsonValue | undefined);
    return output;
  }

  /** Settles an unknown effect after an operator checked whether it happened. */
  resolveUnknown(effectId: string, resolution: Resolution): EffectRecord {
    if (resolution?.outcome !== 'committed' && resolution?.outcome !== 'failed') {
      throw new InvalidArgumentError(
        'resolution.outcome',
        "'committed' or 'failed'",
        (resolution as { outcome?: unknown })?.outcome,
      );
    }
    const outputJson =
      resolution.outcome === 'committed' && resolution.output !== undefined
        ? jsonText(resolution.output, 'resolution.output')
        : null;
    return this.db.transaction(() => {
      const row = this.row(effectId);
      if (row.status !== 'unknown') {
        throw new InvalidStateError('EFFECT_NOT_UNKNOWN', `Effect ${effectId} is ${row.status}, not unknown`, {
          effectId,
          status: row.status,
        });
      }
      if (resolution.outcome === 'committed') this.settleCommitted(row, outputJson, null);
      else this.stmt.settleFailed.run('failed', 1, row.error, this.clock(), effectId);
      return toRecord(this.row(effectId));
    })();
  }

  /**
   * Turns pending attempts whose run() process has died into unknown (a crash
   * between begin and commit). Attempts begun through begin() belong to the
   * caller and stay pending until it settles them.
   */
  recoverAfterCrash(isRunnerAlive: (runner: string) => boolean = runnerAlive): EffectRecord[] {
    const note = JSON.stringify({
      name: 'Interrupted',
      message: 'The process running this effect stopped before its outcome was recorded',
    });
    const out: EffectRecord[] = [];
    for (const runner of this.stmt.runnersPending.all() as string[]) {
      if (!isRunnerAlive(runner)) out.push(...(this.stmt.recover.all(note, runner) as EffectRow[]).map(toRecord));
    }
    return out;
  }

  /** Seals the sandbox's unsealed effects into a new checkpoint (called in the checkpoint transaction). */
  seal(sandboxId: string, checkpointId: string): number {
    return this.stmt.seal.run(nonEmpty(checkpointId, 'checkpointId'), nonEmpty(sandboxId, 'sandboxId')).changes;
  }

  /** Current ledger position of the sandbox (its highest seq, 0 if none); the core stores it in the checkpoint. */
  cursor(sandboxId: string): number {
    return this.stmt.cursor.get(nonEmpty(sandboxId, 'sandboxId')) as number;
  }

  /**
   * Effects on the sandbox's timelines that are not part of the target checkpoint's history:
   * unsealed ones, and ones sealed by a checkpoint that is not an ancestor-or-self of the
   * target. Includes effects inherited from a fork parent. Every status is returned.
   */
  effectsAfter(
    sandboxId: string,
    targetCheckpointId: string,
    isAncestorOrSelf: (checkpointId: string) => boolean,
  ): EffectRecord[] {
    nonEmpty(targetCheckpointId, 'targetCheckpointId');
    const anc = memo(isAncestorOrSelf);
    const rows = this.stmt.timeline.all(nonEmpty(sandboxId, 'sandboxId'), sandboxId) as EffectRow[];
    return rows.filter((r) => r.sealed_by === null || !anc(r.sealed_by)).map(toRecord);
  }

  /**
   * effectsAfter(), and marks the unsealed ones abandoned so a later checkpoint on the new
   * timeline does not seal them into it. Call in the rollback transaction.
   */
  applyRollback(
    sandboxId: string,
    targetCheckpointId: string,
    isAncestorOrSelf: (checkpointId: string) => boolean,
    rollbackId: string,
  ): EffectRecord[] {
    return this.db.transaction(() => {
      const after = this.effectsAfter(sandboxId, targetCheckpointId, isAncestorOrSelf);
      this.stmt.abandon.run(nonEmpty(rollbackId, 'rollbackId'), sandboxId);
      return after;
    })();
  }

  /**
   * Lets a fork see the effects of its parent's history up to the fork checkpoint (by reference),
   * so a rollback of the fork past its fork point reports them. Idempotency needs no help: forks
   * share the lineage id, and lineage-scoped keys ignore the branch.
   */
  inheritForFork(
    parentSandboxId: string,
    checkpointId: string,
    childSandboxId: string,
    isAncestorOrSelf: (checkpointId: string) => boolean,
  ): number {
    nonEmpty(checkpointId, 'checkpointId');
    nonEmpty(childSandboxId, 'childSandboxId');
    const anc = memo(isAncestorOrSelf);
    return this.db.transaction(() => {
      let n = 0;
      for (const r of this.stmt.timeline.all(
        nonEmpty(parentSandboxId, 'parentSandboxId'),
        parentSandboxId,
      ) as EffectRow[]) {
        if (r.sealed_by !== null && anc(r.sealed_by)) n += this.stmt.addView.run(childSandboxId, r.id).changes;
      }
      return n;
    })();
  }

  /**
   * Runs compensations in reverse commit order, each recorded as its own ledger row linked to
   * the original (which becomes `compensated`). Stops at the first failing compensation, since
   * later ones may depend on it. Explicit ids must be committed compensable effects;
   * `{ after }` picks those among effectsAfter(). Already compensated effects are skipped.
   */
  async compensate(
    target: CompensateTarget,
    runner: (effect: EffectRecord) => JsonValue | undefined | void | Promise<JsonValue | undefined | void>,
  ): Promise<CompensationResult[]> {
    let effects: EffectRecord[];
    if (Array.isArray(target)) {
      effects = target.map((id, i) => toRecord(this.row(nonEmpty(id, `target[${i}]`))));
      for (const e of effects) {
        const ok =
          e.reversibility === 'compensable' &&
          e.compensatesId === null &&
          (e.status === 'committed' || e.status === 'compensated');
        if (!ok) {
          throw new InvalidStateError(
            'EFFECT_NOT_COMPENSABLE',
            `Effect ${e.id} (${e.kind}) is ${e.reversibility} and ${e.status}; ` +
              `only committed compensable effects can be compensated`,
            {
              effectId: e.id,
              reversibility: e.reversibility,
              status: e.status,
            },
          );
        }
      }
    } else if (typeof target === 'object' && target !== null && 'after' in target) {
      const a = target.after;
      effects = this.effectsAfter(a.sandboxId, a.targetCheckpointId, a.isAncestorOrSelf).filter(
        (e) =>
          e.reversibility === 'compensable' &&
          e.compensatesId === null &&
          (e.status === 'committed' || e.status === 'compensated'),
      );
    } else {
      throw new InvalidArgumentError(
        'target',
        'an array of effect ids or { after: { sandboxId, targetCheckpointId, isAncestorOrSelf } }',
        target,
      );
    }
    effects.sort((x, y) => (y.commitOrder ?? 0) - (x.commitOrder ?? 0));

    const results: CompensationResult[] = [];
    for (const e of effects) {
      const ctx: EffectContext = {
        sandboxId: e.sandboxId,
        lineageId: e.lineageId,
        branchId: e.branchId,
        epochCheckpointId: e.epochCheckpointId,
      };
      const spec: EffectSpec = {
        kind: e.compensation!.kind,
        input: e.compensation!.input,
        reversibility: 'irreversible',
        scope: 'lineage',
        key: `compensation-of:${e.id}`,
      };
      const b = this.beginRow(ctx, spec, e.id);
      if (b.replayed) {
        results.push({ effectId: e.id, compensationId: b.effectId, output: b.output, replayed: true });
        continue;
      }
      let output: JsonValue | undefined | void;
      try {
        output = await runner(this.get(e.id));
      } catch (err) {
        this.fail(b.effectId, err, { definite: isDefinite(err) });
        throw err;
      }
      this.commitFromRun(b.effectId, output as JsonValue | undefined);
      results.push({
        effectId: e.id,
        compensationId: b.effectId,
        output: output as JsonValue | undefined,
        replayed: false,
      });
    }
    return results;
  }

  /** One ledger row. */
  get(effectId: string): EffectRecord {
    return toRecord(this.row(effectId));
  }

  /** Every row recorded by a sandbox, or in a whole lineage, in seq order. */
  list(target: string | { lineageId: string }): EffectRecord[] {
    const rows =
      typeof target === 'string'
        ? this.stmt.bySandbox.all(nonEmpty(target, 'sandboxId'))
        : this.stmt.byLineage.all(nonEmpty(target?.lineageId, 'target.lineageId'));
    return (rows as EffectRow[]).map(toRecord);
  }

  private beginRow(ctx: EffectContext, spec: EffectSpec, compensatesId: string | null): BeginResult {
    const c = checkContext(ctx);
    const s = checkSpec(spec);
    const idempotencyKey = deriveKey({
      lineageId: c.lineageId,
      branchId: c.branchId,
      kind: s.kind,
      input: spec.input,
      scope: s.scope,
      ...(spec.key === undefined ? {} : { key: spec.key }),
    });
    return this.db.transaction((): BeginResult => {
      for (let tries = 0; ; tries++) {
        const live = this.stmt.live.get(idempotencyKey) as EffectRow | undefined;
        if (live !== undefined) {
          if (spec.key !== undefined && (live.kind !== s.kind || live.input !== s.inputJson)) {
            throw new InvalidStateError(
              'IDEMPOTENCY_KEY_CONFLICT',
              `Idempotency key ${JSON.stringify(spec.key)} was already used ` +
                `for a different effect (${live.id}, ${live.kind})`,
              {
                effectId: live.id,
                key: spec.key,
              },
            );
          }
          if (live.status === 'committed') {
            return { replayed: true, effectId: live.id, idempotencyKey, output: parseOutput(live.output) };
          }
          throw new EffectOutcomeUnknownError(toRecord(live));
        }
        const effectId = `eff_${randomBytes(10).toString('hex')}`;
        const attempt = (this.stmt.attempts.get(idempotencyKey) as number) + 1;
        try {
          this.stmt.insert.run({
            id: effectId,
            lineage_id: c.lineageId,
            sandbox_id: c.sandboxId,
            branch_id: c.branchId,
            epoch_checkpoint_id: c.epochCheckpointId,
            kind: s.kind,
            input: s.inputJson,
            reversibility: s.reversibility,
            scope: s.scope,
            idempotency_key: idempotencyKey,
            tool_call_id: s.toolCallId,
            compensation: s.compensationJson,
            attempt,
            compensates_id: compensatesId,
            created_at: this.clock(),
          });
        } catch (err) {
          // Another connection recorded the same key between our read and write: re-read once.
          if ((err as { code?: string }).code === 'SQLITE_CONSTRAINT_UNIQUE' && tries === 0) continue;
          throw err;
        }
        return { replayed: false, effectId, idempotencyKey, attempt };
      }
    })();
  }

  private commitFromRun(effectId: string, output: JsonValue | undefined): void {
    let outputJson: string | null = null;
    let problem: InvalidArgumentError | undefined;
    try {
      outputJson = output === undefined ? null : jsonText(output, 'output');
    } catch (err) {
      if (!(err instanceof InvalidArgumentError)) throw err;
      problem = err;
    }
    // The effect did happen even if its output cannot be recorded: commit it without output.
    this.db.transaction(() =>
      this.settleCommitted(this.unsettled(effectId), outputJson, problem === undefined ? null : errorInfo(problem)),
    )();
    if (problem !== undefined) throw problem;
  }

  private settleCommitted(row: EffectRow, outputJson: string | null, error: RecordedError | null): void {
    const order = this.stmt.nextCommitOrder.get() as number;
    this.stmt.settleCommitted.run(
      outputJson,
      error === null ? null : JSON.stringify(error),
      order,
      this.clock(),
      row.id,
    );
    if (row.compensates_id !== null) this.stmt.markCompensated.run(row.id, row.compensates_id);
  }

  private unsettled(effectId: string): EffectRow {
    const row = this.row(effectId);
    // A commit may arrive after another process declared the attempt unknown: the truth wins.
    if (row.status !== 'pending' && row.status !== 'unknown') {
      throw new InvalidStateError('EFFECT_ALREADY_SETTLED', `Effect ${effectId} is already ${row.status}`, {
        effectId,
        status: row.status,
      });
    }
    return row;
  }

  private row(effectId: string): EffectRow {
    const row = this.stmt.byId.get(nonEmpty(effectId, 'effectId')) as EffectRow | undefined;
    if (row === undefined) throw new NotFoundError('effect', effectId);
    return row;
  }
}

/**
 * Applies a rollback policy to effectsAfter(): returns warnings for what the rollback cannot
 * take back, or with 'refuse' throws IrreversibleEffectError if any irreversible effect
 * happened or may have. Compensation rows are reported by the recovery summary, not here:
 * together with the effect they take back they leave nothing to refuse over.
 */
export function checkRollbackPolicy(effectsAfter: EffectRecord[], policy: RollbackPolicy): RollbackWarning[] {
  if (policy !== 'warn' && policy !== 'refuse') throw new InvalidArgumentError('policy', "'warn' or 'refuse'", policy);
  const warnings: RollbackWarning[] = [];
  const blocking: EffectRecord[] = [];
  for (const e of effectsAfter) {
    if (e.compensatesId !== null || e.reversibility === 'sandbox-local') continue;
    const uncertain = e.status === 'pending' || e.status === 'unknown';
    if (e.status !== 'committed' && !uncertain) continue;
    let reason: RollbackWarning['reason'];
    let message: string;
    if (uncertain) {
      reason = 'outcome-unknown';
      message = `${e.kind} (${e.id}) may have happened (status ${e.status}); the rollback cannot take it back`;
    } else if (e.reversibility === 'irreversible') {
      reason = 'irreversible';
      message = `${e.kind} (${e.id}) happened and cannot be taken back`;
    } else {
      reason = 'not-compensated';
      message =
        `${e.kind} (${e.id}) happened and stays in effect until compensated ` +
        `(${e.compensation?.kind ?? 'no compensation recorded'})`;
    }
    warnings.push({ effectId: e.id, kind: e.kind, status: e.status, reversibility: e.reversibility, reason, message });
    if (e.reversibility === 'irreversible') blocking.push(e);
  }
  if (policy === 'refuse' && blocking.length > 0) throw new IrreversibleEffectError(blocking);
  return warnings;
}

function checkContext(ctx: EffectContext): EffectContext {
  if (typeof ctx !== 'object' || ctx === null) throw new InvalidArgumentError('ctx', 'an object', ctx);
  const epoch = ctx.epochCheckpointId ?? null;
  if (epoch !== null) nonEmpty(epoch, 'ctx.epochCheckpointId');
  return {
    sandboxId: nonEmpty(ctx.sandboxId, 'ctx.sandboxId'),
    lineageId: nonEmpty(ctx.lineageId, 'ctx.lineageId'),
    branchId: nonEmpty(ctx.branchId, 'ctx.branchId'),
    epochCheckpointId: epoch,
  };
}

function checkSpec(spec: EffectSpec) {
  if (typeof spec !== 'object' || spec === null) throw new InvalidArgumentError('spec', 'an object', spec);
  const kind = nonEmpty(spec.kind, 'spec.kind');
  if (!REVERSIBILITIES.includes(spec.reversibility)) {
    throw new InvalidArgumentError(
      'spec.reversibility',
      REVERSIBILITIES.map((r) => `'${r}'`).join(', '),
      spec.reversibility,
    );
  }
  const scope: EffectScope = spec.scope ?? (spec.reversibility === 'sandbox-local' ? 'branch' : 'lineage');
  if (scope !== 'lineage' && scope !== 'branch')
    throw new InvalidArgumentError('spec.scope', "'lineage' or 'branch'", spec.scope);
  if (spec.reversibility === 'sandbox-local' && scope !== 'branch') {
    throw new InvalidArgumentError(
      'spec.scope',
      "'branch' for sandbox-local effects (a rollback undoes them, so a replay must run them again)",
      scope,
    );
  }
  if (spec.key !== undefined) nonEmpty(spec.key, 'spec.key');
  if (spec.toolCallId !== undefined) nonEmpty(spec.toolCallId, 'spec.toolCallId');
  let compensationJson: string | null = null;
  if (spec.reversibility === 'compensable') {
    const c = spec.compensation;
    if (typeof c !== 'object' || c === null)
      throw new InvalidArgumentError('spec.compensation', 'an object { kind, input } for a compensable effect', c);
    compensationJson = JSON.stringify({
      kind: nonEmpty(c.kind, 'spec.compensation.kind'),
      input: JSON.parse(jsonText(c.input, 'spec.compensation.input')),
    });
  } else if (spec.compensation !== undefined) {
    throw new InvalidArgumentError(
      'spec.compensation',
      'absent unless reversibility is compensable',
      spec.compensation,
    );
  }
  return {
    kind,
    reversibility: spec.reversibility,
    scope,
    inputJson: canonicalJson(spec.input, 'spec.input'),
    toolCallId: spec.toolCallId ?? null,
    compensationJson,
  };
}

/** JSON text of a value after checking it is JSON (throws InvalidArgumentError naming `field`). */
function jsonText(v: unknown, field: string): string {
  canonicalJson(v, field);
  return JSON.stringify(v);
}

function parseOutput(s: string | null): JsonValue | undefined {
  return s === null ? undefined : (JSON.parse(s) as JsonValue);
}

function toRecord(r: EffectRow): EffectRecord {
  return {
    id: r.id,
    seq: r.seq,
    lineageId: r.lineage_id,
    sandboxId: r.sandbox_id,
    branchId: r.branch_id,
    epochCheckpointId: r.epoch_checkpoint_id,
    sealedBy: r.sealed_by,
    abandonedBy: r.abandoned_by,
    kind: r.kind,
    input: JSON.parse(r.input) as JsonValue,
    output: parseOutput(r.output),
    reversibility: r.reversibility,
    scope: r.scope,
    idempotencyKey: r.idempotency_key,
    toolCallId: r.tool_call_id,
    compensation: r.compensation === null ? null : (JSON.parse(r.compensation) as CompensationSpec),
    status: r.status,
    definite: r.definite === null ? null : r.definite === 1,
    error: r.error === null ? null : (JSON.parse(r.error) as RecordedError),
    attempt: r.attempt,
    compensatesId: r.compensates_id,
    compensatedBy: r.compensated_by,
    commitOrder: r.commit_order,
    createdAt: r.created_at,
    settledAt: r.settled_at,
  };
}

function errorInfo(err: unknown): RecordedError {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    return typeof code === 'string'
      ? { name: err.name, message: err.message, code }
      : { name: err.name, message: err.message };
  }
  return { name: 'Error', message: String(err) };
}

function isDefinite(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { definite?: unknown }).definite === true;
}

function nonEmpty(v: unknown, field: string): string {
  if (typeof v !== 'string' || v === '') throw new InvalidArgumentError(field, 'a non-empty string', v);
  return v;
}

/** This process as "pid:start-time" (the start time tells a reused pid apart). */
export function currentRunner(): string {
  return `${process.pid}:${processStart(process.pid) ?? 0}`;
}

function processStart(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
  } catch {
    return undefined;
  }
}

/** True while the process that recorded "pid:start-time" is still running. */
export function runnerAlive(runner: string): boolean {
  const [pid, start] = runner.split(':').map(Number);
  return pid !== undefined && start !== undefined && processStart(pid) === start;
}
