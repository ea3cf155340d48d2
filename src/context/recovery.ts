/**
 * The recovery summary handed to an agent after a rollback. Rollback restores files,
 * processes and the context snapshot, but the world outside moved on and the agent may have
 * learnt something. The summary separates the two kinds of knowledge: facts about the abandoned
 * timeline (no longer true, or true and not to be repeated) and lessons (still valid).
 */
import { InvalidArgumentError } from '../errors.js';
import type { EffectRecord, EffectStatus, Reversibility } from '../effects/effect-ledger.js';
import type { JsonValue } from '../effects/idempotency.js';
import type { Observation } from '../provenance/observations.js';
import { IDENTITY_HASH_PREFIX } from '../instances/files.js';
import type { Verdict } from '../provenance/verdicts.js';

/** What buildRecoverySummary() works from. */
export interface RecoveryInput {
  /** Why the timeline was abandoned, in a sentence. */
  failure?: string;
  /** General knowledge gained on the abandoned timeline that stays valid. */
  lessons?: string[];
  staleObservations: Observation[];
  effectsAfter: EffectRecord[];
  staleVerdicts: (Verdict & { currentHash?: string | null })[];
  targetCheckpoint: { id: string; label?: string };
}

/** A command the agent ran on the abandoned timeline. */
export interface CommandRun {
  command: string;
  exitCode: number | null;
  summary: string | null;
  toolCallId: string | null;
}

/** A path the agent touched on the abandoned timeline, with how. */
export interface FileTouched {
  path: string;
  how: ('read' | 'write' | 'list')[];
}

/** An effect on the abandoned timeline, as the summary reports it. */
export interface EffectSummary {
  effectId: string;
  kind: string;
  input: JsonValue;
  output: JsonValue | undefined;
  status: EffectStatus;
  reversibility: Reversibility;
  /** Set on a compensation: the effect it took back. */
  compensates: string | null;
}

/** The machine-readable summary. */
export interface RecoveryStructured {
  targetCheckpoint: { id: string; label: string | null };
  failure: string | null;
  commandsRun: CommandRun[];
  filesTouched: FileTouched[];
  /** Effects that happened or may have (not definitely failed), any reversibility. */
  effectsCommitted: EffectSummary[];
  /** Subset of effectsCommitted the rollback did not and cannot undo: must not be repeated. */
  irreversibleEffects: EffectSummary[];
  staleVerdicts: { path: string; verdict: string; contentHash: string; currentHash: string | null }[];
  lessons: string[];
}

/** Structured summary plus the text block given to the model. */
export interface RecoverySummary {
  structured: RecoveryStructured;
  text: string;
}

// Keep the note compact: the model needs the gist, the structured part has everything.
const MAX_LISTED = 20;
const MAX_JSON = 300;

/** Builds the recovery summary of a rollback, as data and as a note for the model. */
export function buildRecoverySummary(input: RecoveryInput): RecoverySummary {
  if (typeof input !== 'object' || input === null) throw new InvalidArgumentError('input', 'an object', input);
  const target = input.targetCheckpoint;
  if (typeof target?.id !== 'string' || target.id === '')
    throw new InvalidArgumentError('input.targetCheckpoint.id', 'a non-empty string', target?.id);
  for (const [field, v] of [
    ['staleObservations', input.staleObservations],
    ['effectsAfter', input.effectsAfter],
    ['staleVerdicts', input.staleVerdicts],
  ] as const) {
    if (!Array.isArray(v)) throw new InvalidArgumentError(`input.${field}`, 'an array', v);
  }
  const lessons = input.lessons ?? [];
  if (!Array.isArray(lessons) || lessons.some((l) => typeof l !== 'string'))
    throw new InvalidArgumentError('input.lessons', 'an array of strings', input.lessons);

  const observations = [...input.staleObservations].sort((a, b) => a.seq - b.seq);
  const commandsRun = observations
    .filter((o) => o.kind === 'command')
    .map((o) => ({ command: o.subject, exitCode: o.exitCode, summary: o.summary, toolCallId: o.toolCallId }));

  const files = new Map<string, FileTouched>();
  for (const o of observations) {
    const how =
      o.kind === 'file-read' ? 'read' : o.kind === 'file-write' ? 'write' : o.kind === 'file-list' ? 'list' : undefined;
    if (how === undefined) continue;
    const f = files.get(o.subject) ?? { path: o.subject, how: [] };
    if (!f.how.includes(how)) f.how.push(how);
    files.set(o.subject, f);
  }

  const effectsCommitted = [...input.effectsAfter]
    .sort((a, b) => a.seq - b.seq)
    .filter((e) => e.status !== 'failed')
    .map((e): EffectSummary => ({
      effectId: e.id,
      kind: e.kind,
      input: e.input,
      output: e.output,
      status: e.status,
      reversibility: e.reversibility,
      compensates: e.compensatesId,
    }));
  const irreversibleEffects = effectsCommitted.filter(
    (e) => e.reversibility === 'irreversible' && e.compensates === null,
  );

  const structured: RecoveryStructured = {
    targetCheckpoint: { id: target.id, label: target.label ?? null },
    failure: input.failure ?? null,
    commandsRun,
    filesTouched: [...files.values()],
    effectsCommitted,
    irreversibleEffects,
    staleVerdicts: input.staleVerdicts.map((v) => ({
      path: v.path,
      verdict: v.verdict,
      contentHash: v.contentHash,
      currentHash: v.currentHash ?? null,
    })),
    lessons,
  };
  return { structured, text: renderText(structured) };
}

function renderText(s: RecoveryStructured): string {
  const lines: string[] = ['<lockstep-recovery>'];
  const where =
    s.targetCheckpoint.label === null
      ? s.targetCheckpoint.id
      : `${s.targetCheckpoint.id} ("${s.targetCheckpoint.label}")`;
  lines.push(
    `The sandbox was rolled back: its files and processes are exactly as they were at checkpoint ${where}, ` +
      `and this conversation continues from that point. Work done after ` +
      `it was undone inside the sandbox, not outside it.`,
  );
  if (s.failure !== null) lines.push(`Reason: ${s.failure.replace(/\s+/g, ' ').trim()}`);

  if (s.commandsRun.length > 0 || s.filesTouched.length > 0 || s.staleVerdicts.length > 0) {
    lines.push('', 'No longer true (observed on the abandoned timeline; look again before relying on any of it):');
    bullets(lines, s.commandsRun, (c) => {
      const exit = c.exitCode === null ? '' : ` (exit ${c.exitCode})`;
      return `ran \`${oneLine(c.command)}\`${exit}${c.summary === null ? '' : `: ${oneLine(c.summary)}`}`;
    });
    bullets(lines, s.filesTouched, (f) => `${f.how.join('/')} ${f.path}`);
    bullets(
      lines,
      s.staleVerdicts,
      (v) =>
        `verdict "${v.verdict}" on ${v.path} no longer applies: the file ` +
        `${v.currentHash === null ? 'is gone' : changedHow(v)}`,
    );
  }

  const done = s.effectsCommitted.filter((e) => e.reversibility !== 'sandbox-local');
  const irreversible = done.filter((e) => e.reversibility === 'irreversible' && e.compensates === null);
  if (irreversible.length > 0) {
    lines.push('', 'Already happened outside the sandbox and MUST NOT be repeated (the rollback did not undo them):');
    bullets(lines, irreversible, describeEffect);
  }
  const compensable = done.filter((e) => e.reversibility === 'compensable');
  if (compensable.length > 0) {
    lines.push('', 'Happened outside the sandbox and can only be taken back by compensation:');
    bullets(
      lines,
      compensable,
      (e) => `${describeEffect(e)}${e.status === 'compensated' ? ' — since compensated' : ' — still in effect'}`,
    );
  }
  const compensations = done.filter((e) => e.compensates !== null);
  if (compensations.length > 0) {
    lines.push('', 'Compensations already carried out (do not repeat them):');
    bullets(lines, compensations, (e) => `${describeEffect(e)} (takes back ${e.compensates})`);
  }
  const local = s.effectsCommitted.filter((e) => e.reversibility === 'sandbox-local');
  if (local.length > 0) {
    lines.push(
      '',
      `Undone by the rollback (may be done again if still needed): ${local
        .map((e) => e.kind)
        .slice(0, MAX_LISTED)
        .join(', ')}${local.length > MAX_LISTED ? ', …' : ''}`,
    );
  }

  if (s.lessons.length > 0) {
    lines.push('', 'Still valid (lessons from the abandoned attempt):');
    // Lessons are the part worth keeping whole: never truncated.
    for (const l of s.lessons) lines.push(`- ${l.replace(/\s+/g, ' ').trim()}`);
  }
  lines.push('</lockstep-recovery>');
  return lines.join('\n');
}

function describeEffect(e: EffectSummary): string {
  const status =
    e.status === 'unknown' || e.status === 'pending'
      ? ' — outcome unknown: it may have happened; do not retry, ask the operator'
      : ` → ${e.output === undefined ? '(no output)' : json(e.output)}`;
  return `${e.kind} ${json(e.input)}${status} [${e.effectId}]`;
}

function bullets<T>(lines: string[], xs: T[], render: (x: T) => string): void {
  for (const x of xs.slice(0, MAX_LISTED)) lines.push(`- ${render(x)}`);
  if (xs.length > MAX_LISTED) lines.push(`- … and ${xs.length - MAX_LISTED} more`);
}

function json(v: JsonValue): string {
  const s = JSON.stringify(v);
  return s.length > MAX_JSON ? `${s.slice(0, MAX_JSON)}…` : s;
}

function oneLine(s: string): string {
  const t = s.replace(/\s+/g, ' ').trim();
  return t.length > MAX_JSON ? `${t.slice(0, MAX_JSON)}…` : t;
}

/** How a stale verdict's file changed: files over 64 MiB are compared by identity, not by content. */
function changedHow(v: { contentHash: string; currentHash: string | null }): string {
  const byIdentity = [v.contentHash, v.currentHash].some((h) => h?.startsWith(IDENTITY_HASH_PREFIX));
  return byIdentity
    ? 'was written or replaced since (over 64 MiB: compared by size, times and inode, not by content)'
    : 'has different content now';
}
