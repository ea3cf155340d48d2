/**
 * What both renderers say, worked out once from the run: which tool calls
 * went stale, which effects outlived the rollback, the latency figures.
 * Every mark shown to the reader comes from the rollback report, not from
 * knowing the script.
 */
import type { EffectRecord, Observation } from '../src/index.js';
import type { DemoRun, StepRun, World } from './scenario.js';
import type { ToolCall } from './scripted-agent.js';

/** How a tool call of the abandoned timeline fared in the rollback. */
export type Fate = 'kept' | 'stale' | 'irreversible' | 'undone';

export interface TranscriptLine {
  toolCallId: string;
  step: number;
  call: string;
  fate: Fate;
  /** For stale calls: the observations that went stale. */
  observations: Observation[];
  effect?: EffectRecord;
}

export interface Stats {
  n: number;
  p50: number;
  max: number;
}

export interface Facts {
  steps: StepRun[];
  /** The abandoned attempt's tool calls with their fate. */
  before: TranscriptLine[];
  /** The tool calls in the restored context. */
  after: TranscriptLine[];
  stale: Observation[];
  irreversible: EffectRecord[];
  email: { effect: EffectRecord | undefined; sentAt: StepRun | undefined; replayedAt: StepRun | undefined };
  checkpointTotal: Stats;
  checkpointFrozen: Stats;
  allCheckpointTotal: Stats;
  rollbackPhases: { name: string; ms: number }[];
  rollbackTotal: number;
  filesGone: string[];
  filesCame: string[];
}

export function stats(xs: number[]): Stats {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return { n: 0, p50: 0, max: 0 };
  const mid = Math.floor(s.length / 2);
  const p50 = s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
  return { n: s.length, p50, max: s.at(-1)! };
}

export function ms(x: number | undefined): string {
  if (x === undefined) return '–';
  return x >= 100 ? `${x.toFixed(0)} ms` : `${x.toFixed(1)} ms`;
}

/** A tool call in a line: "run wc -l data/records.csv". */
export function describeCall(call: ToolCall): string {
  const rel = (p: string | undefined) => (p ?? '').replace(/^\/workspace\//, '');
  switch (call.name) {
    case 'list_files':
      return `list_files ${call.input.path}`;
    case 'read_file':
    case 'write_file':
      return `${call.name} ${rel(call.input.path)}`;
    case 'run':
    case 'start_process':
      return `${call.name} ${call.input.command}`;
    case 'send_email':
      return `send_email ${call.input.to}`;
  }
}

/** The tool's result in one line. */
export function describeResult(s: StepRun): string {
  const lines = s.outcome.text.split('\n').filter(Boolean);
  if (s.outcome.isError) return lines.at(-1) ?? 'failed';
  const e = s.outcome.effect;
  if (e)
    return e.replayed
      ? `replayed: delivery #${e.delivery.delivery}, not re-sent`
      : `delivered #${e.delivery.delivery} (${e.delivery.messageId})`;
  if (s.turn.call.name === 'write_file') return lines[0]?.replace(/ to .*$/, '') ?? '';
  if (s.turn.call.name === 'list_files')
    return lines.length > 3 ? `${lines.length} entries: ${lines[0]} … ${lines.at(-1)}` : lines.join(' ');
  if (s.turn.call.name === 'read_file') return lines[0] ?? '(empty)';
  return lines.at(-1) ?? '';
}

const PHASES: [string, string][] = [
  ['killMs', 'kill'],
  ['layerMs', 'layer'],
  ['mountMs', 'mount'],
  ['restoreMs', 'restore'],
  ['commitMs', 'commit'],
];

export function facts(run: Pick<DemoRun, 'rollback' | 'firstAttempt' | 'retry'>): Facts {
  const { report } = run.rollback;
  const staleByCall = new Map<string, Observation[]>();
  for (const o of report.staleObservations)
    if (o.toolCallId) staleByCall.set(o.toolCallId, [...(staleByCall.get(o.toolCallId) ?? []), o]);
  const effectByCall = new Map(report.effectsAfter.filter((e) => e.toolCallId).map((e) => [e.toolCallId!, e]));
  const restored = new Set(toolUseIds(report.context));

  const line = (s: StepRun): TranscriptLine => {
    const id = s.turn.call.id;
    const effect = effectByCall.get(id);
    const observations = staleByCall.get(id) ?? [];
    const fate: Fate = restored.has(id)
      ? 'kept'
      : effect?.reversibility === 'irreversible'
        ? 'irreversible'
        : observations.length
          ? 'stale'
          : 'undone';
    return {
      toolCallId: id,
      step: s.turn.step,
      call: describeCall(s.turn.call),
      fate,
      observations,
      ...(effect ? { effect } : {}),
    };
  };
  const before = run.firstAttempt.map(line);
  const after = run.firstAttempt.filter((s) => restored.has(s.turn.call.id)).map(line);

  const all = [...run.firstAttempt, ...run.retry];
  const sentAt = all.find((s) => s.outcome.effect && !s.outcome.effect.replayed);
  const replayedAt = all.find((s) => s.outcome.effect?.replayed);
  const email = report.effectsAfter.find((e) => e.kind === 'email.send');

  const t = report.timings as unknown as Record<string, number>;
  return {
    steps: all,
    before,
    after,
    stale: [...report.staleObservations].sort((a, b) => a.seq - b.seq),
    irreversible: report.effectsAfter.filter((e) => e.reversibility === 'irreversible'),
    email: { effect: email, sentAt, replayedAt },
    checkpointTotal: stats(run.firstAttempt.map((s) => s.checkpoint.timings.totalMs ?? 0)),
    checkpointFrozen: stats(run.firstAttempt.map((s) => s.checkpoint.timings.frozenMs ?? 0)),
    allCheckpointTotal: stats(all.map((s) => s.checkpoint.timings.totalMs ?? 0)),
    rollbackPhases: PHASES.filter(([k]) => typeof t[k] === 'number').map(([k, name]) => ({ name, ms: t[k]! })),
    rollbackTotal: report.timings.totalMs,
    filesGone: diff(run.rollback.before, run.rollback.after),
    filesCame: diff(run.rollback.after, run.rollback.before),
  };
}

function diff(a: World, b: World): string[] {
  const inB = new Set(b.files.map((f) => f.path));
  return a.files.map((f) => f.path).filter((p) => !inB.has(p));
}

function toolUseIds(ctx: unknown): string[] {
  const msgs = (ctx as { messages?: { content?: unknown }[] } | null)?.messages ?? [];
  return msgs.flatMap((m) =>
    Array.isArray(m.content)
      ? (m.content as { type?: string; id?: string }[]).filter((b) => b.type === 'tool_use').map((b) => b.id!)
      : [],
  );
}

/** The worker's state line, split: "worker pid 3, tick 31: no config loaded" → parts. */
export function parseWorker(s: string): { pid: string; tick: string; holds: string } | undefined {
  const m = /^worker pid (\d+), tick (\d+): (.*)$/.exec(s);
  return m ? { pid: m[1]!, tick: m[2]!, holds: m[3]! } : undefined;
}

/** Files only (directories show through their files), with runs of batch files as one row. */
export function fileRows(paths: string[], gone: Set<string>): { text: string; removed: boolean; first: string }[] {
  const files = paths.filter((p) => !p.endsWith('/'));
  const rows: { text: string; removed: boolean; first: string }[] = [];
  for (let i = 0; i < files.length; i++) {
    const p = files[i]!;
    const m = /^(.*\/)batch-\d+\.csv$/.exec(p);
    if (m) {
      let j = i;
      while (j + 1 < files.length && files[j + 1]!.startsWith(`${m[1]}batch-`)) j++;
      if (j > i) {
        rows.push({
          text: `${p} … ${files[j]!.slice(m[1]!.length)} (${j - i + 1} files)`,
          removed: gone.has(p),
          first: p,
        });
        i = j;
        continue;
      }
    }
    rows.push({ text: p, removed: gone.has(p), first: p });
  }
  return rows;
}
