/**
 * The agent's side of an aligned checkpoint, over the catalog's database:
 * context snapshots, observations (provenance), verdicts bound to file
 * content, and the effect ledger. The checkpoint, rollback and fork verbs
 * call in here inside their own catalog transactions, so a checkpoint is
 * {layer, process image, context, ledger cursor} atomically.
 */
import type Database from 'better-sqlite3';
import type { CheckpointRow, Catalog, SandboxRow } from '../catalog/catalog.js';
import { ContextStore } from '../context/context-store.js';
import { appendRecoveryNote, validateContext, type AgentContext } from '../context/formats.js';
import { buildRecoverySummary, type RecoverySummary } from '../context/recovery.js';
import {
  EffectLedger,
  checkRollbackPolicy,
  type EffectContext,
  type EffectRecord,
  type RollbackPolicy,
  type RollbackWarning,
} from '../effects/effect-ledger.js';
import { ObservationLog, type Observation, type ObservationInput } from '../provenance/observations.js';
import { VerdictLog, type StaleVerdict, type VerdictTimelines } from '../provenance/verdicts.js';
import { InvalidArgumentError } from '../errors.js';

export interface RollbackAgentOptions {
  /** Checked before anything is destroyed: an aborted rollback changes nothing. */
  signal?: AbortSignal | undefined;
  /** 'warn' (default) reports irreversible effects the rollback cannot take back; 'refuse' blocks the rollback. */
  policy?: RollbackPolicy | undefined;
  /** Why the abandoned attempt failed, in a sentence. */
  failure?: string | undefined;
  /** General knowledge from the abandoned attempt that stays valid. */
  lessons?: string[] | undefined;
}

/** What a rollback reports about the agent's side. */
export interface AgentRollbackReport {
  /** The context snapshot taken at the checkpoint (null if none was given then). */
  context: AgentContext | null;
  /** The same context with the recovery summary appended in its own format (null for bytes or no context). */
  contextWithRecovery: AgentContext | null;
  staleObservations: Observation[];
  effectsAfter: EffectRecord[];
  staleVerdicts: StaleVerdict[];
  warnings: RollbackWarning[];
  recoverySummary: RecoverySummary;
}

export function validateRollbackOptions(opts: RollbackAgentOptions): RollbackAgentOptions {
  if (opts.policy !== undefined && opts.policy !== 'warn' && opts.policy !== 'refuse')
    throw new InvalidArgumentError('policy', '"warn" or "refuse"', opts.policy);
  if (opts.failure !== undefined && (typeof opts.failure !== 'string' || opts.failure.length > 4000))
    throw new InvalidArgumentError('failure', 'a string of at most 4000 characters', opts.failure);
  if (opts.lessons !== undefined) {
    if (!Array.isArray(opts.lessons) || opts.lessons.length > 100)
      throw new InvalidArgumentError('lessons', 'an array of at most 100 strings', opts.lessons);
    opts.lessons.forEach((l, i) => {
      if (typeof l !== 'string' || l.length > 2000)
        throw new InvalidArgumentError(`lessons[${i}]`, 'a string of at most 2000 characters', l);
    });
  }
  return opts;
}

/** Facade over the four agent-state stores. */
export class AgentState {
  readonly contexts: ContextStore;
  readonly observations: ObservationLog;
  readonly verdicts: VerdictLog;
  readonly effects: EffectLedger;

  constructor(
    db: Database.Database,
    private readonly catalog: Catalog,
    opts: { owner: boolean },
  ) {
    this.contexts = new ContextStore(db);
    this.observations = new ObservationLog(db);
    this.verdicts = new VerdictLog(db);
    // Only the manager that holds the state directory exclusively (and so
    // ran the reaper) may turn effects left pending by a crash into unknown.
    this.effects = opts.owner ? EffectLedger.open(db) : new EffectLedger(db);
  }

  /**
   * isAncestorOrSelf(target) over the target's whole history: its sandbox's checkpoint tree and,
   * for a fork, on into the parent's history from the fork point (what the fork inherited was
   * sealed there), and so on up the fork family.
   */
  ancestry(targetCheckpointId: string): (id: string) => boolean {
    const set = new Set<string>();
    for (let at: string | null = targetCheckpointId; at !== null && !set.has(at);) {
      set.add(at);
      const chain = this.catalog.ancestry(at);
      for (const id of chain) set.add(id);
      const root = chain.length > 0 ? this.catalog.checkpoint(chain.at(-1)!) : undefined;
      at = root ? (this.catalog.sandbox(root.sandbox_id)?.forked_from ?? null) : null;
    }
    return (id: string) => set.has(id);
  }

  effectContext(row: SandboxRow): EffectContext {
    return {
      sandboxId: row.id,
      lineageId: row.lineage_id,
      branchId: row.branch_id,
      epochCheckpointId: row.head_checkpoint_id,
    };
  }

  observe(
    row: SandboxRow,
    o: Omit<ObservationInput, 'sandboxId' | 'branchId' | 'lineageId' | 'epochCheckpointId'>,
  ): Observation {
    return this.observations.record({
      ...o,
      sandboxId: row.id,
      branchId: row.branch_id,
      lineageId: row.lineage_id,
      epochCheckpointId: row.head_checkpoint_id,
    });
  }

  /** Inside the checkpoint transaction: store the context, seal observations and effects, read the ledger cursor. */
  onCheckpoint(
    row: SandboxRow,
    checkpointId: string,
    context: AgentContext | undefined,
  ): { contextId: string | null; ledgerCursor: number; contextBytes?: number } {
    let contextId: string | null = null;
    let contextBytes: number | undefined;
    if (context) {
      const put = this.contexts.put(context);
      contextId = put.contextId;
      contextBytes = put.storedBytes;
    }
    this.observations.seal(row.id, checkpointId);
    this.verdicts.seal(row.id, checkpointId);
    this.effects.seal(row.id, checkpointId);
    return {
      contextId,
      ledgerCursor: this.effects.cursor(row.id),
      ...(contextBytes !== undefined ? { contextBytes } : {}),
    };
  }

  /** Before anything is touched: the effects a rollback would leave behind, checked against the policy (may throw). */
  checkRollback(
    row: SandboxRow,
    target: CheckpointRow,
    policy: RollbackPolicy,
  ): { effectsAfter: EffectRecord[]; warnings: RollbackWarning[]; ancestry: (id: string) => boolean } {
    const ancestry = this.ancestry(target.id);
    const effectsAfter = this.effects.effectsAfter(row.id, target.id, ancestry);
    const warnings = checkRollbackPolicy(effectsAfter, policy);
    return { effectsAfter, warnings, ancestry };
  }

  /**
   * Inside the rollback's commit transaction: mark the abandoned timeline.
   * `isAnc`: the target's ancestry, as checkRollback computed it (the reaper's roll-forward computes it here).
   * The effects after the target are read again here: effects are recorded without the sandbox's lock, and the
   * report lists those the commit abandons as they are now.
   */
  onRollback(
    row: SandboxRow,
    target: CheckpointRow,
    rollbackId: string,
    isAnc: (id: string) => boolean = this.ancestry(target.id),
  ): { staleObservations: Observation[]; effectsAfter: EffectRecord[]; verdicts: VerdictTimelines } {
    const staleObservations = this.observations.applyRollback(row.id, target.id, isAnc, rollbackId);
    const effectsAfter = this.effects.applyRollback(row.id, target.id, isAnc, rollbackId);
    const verdicts = this.verdicts.applyRollback(row.id, isAnc, rollbackId);
    return { staleObservations, effectsAfter, verdicts };
  }

  /** After the rollback: stale verdicts, the stored context and the recovery summary. */
  report(
    row: SandboxRow,
    target: CheckpointRow,
    parts: {
      staleObservations: Observation[];
      effectsAfter: EffectRecord[];
      verdicts: VerdictTimelines;
      warnings: RollbackWarning[];
    },
    hashes: Map<string, string | null>,
    opts: RollbackAgentOptions,
  ): AgentRollbackReport {
    const staleVerdicts = this.verdicts.staleAfterRollback(parts.verdicts, (p) => hashes.get(p) ?? null);
    const context = target.context_id ? this.contexts.get(target.context_id) : null;
    const recoverySummary = buildRecoverySummary({
      ...(opts.failure !== undefined ? { failure: opts.failure } : {}),
      ...(opts.lessons !== undefined ? { lessons: opts.lessons } : {}),
      staleObservations: parts.staleObservations,
      effectsAfter: parts.effectsAfter,
      staleVerdicts,
      targetCheckpoint: target.label ? { id: target.id, label: target.label } : { id: target.id },
    });
    // A context with nowhere to put the note (opaque bytes, a LangGraph state
    // without a messages channel) is returned as it was, without the note.
    let contextWithRecovery: AgentContext | null = null;
    if (context && context.format !== 'bytes') {
      try {
        contextWithRecovery = appendRecoveryNote(context, recoverySummary.text);
      } catch (e) {
        if ((e as { code?: string }).code !== 'CONTEXT_FORMAT_UNSUPPORTED') throw e;
      }
    }
    return {
      context,
      contextWithRecovery,
      staleObservations: parts.staleObservations,
      effectsAfter: parts.effectsAfter,
      staleVerdicts,
      warnings: parts.warnings,
      recoverySummary,
    };
  }

  /** Paths of verdicts recorded for a sandbox (their files are hashed after a rollback). */
  verdictPaths(sandboxId: string): string[] {
    return [...new Set(this.verdicts.list(sandboxId).map((v) => v.path))];
  }

  /** Inside a fork's commit transaction: the child inherits the parent's history up to the checkpoint. */
  onFork(parent: SandboxRow, ckpt: CheckpointRow, child: SandboxRow): void {
    const isAnc = this.ancestry(ckpt.id);
    this.observations.inheritForFork(parent.id, ckpt.id, child.id, child.branch_id, isAnc);
    this.effects.inheritForFork(parent.id, ckpt.id, child.id, isAnc);
    this.verdicts.inheritForFork(parent.id, child.id, child.branch_id, isAnc);
  }

  /** When a checkpoint goes, its context snapshot goes too (shared items stay while used). */
  onCheckpointDeleted(ckpt: CheckpointRow): void {
    if (ckpt.context_id) this.contexts.delete(ckpt.context_id);
  }

  static validateContext(ctx: unknown): AgentContext {
    return validateContext(ctx);
  }
}
