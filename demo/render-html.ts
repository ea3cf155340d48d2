/**
 * The demo's HTML report: one self-contained page (inline CSS and SVG, no
 * scripts, fonts or images from elsewhere) that shows the run at a glance:
 * the checkpoint timeline with the abandoned attempt, the rollback and the
 * retry; the world and the agent's context before and after; the e-mail the
 * rollback could not take back; and the measured latencies.
 */
import { fileRows, ms, parseWorker, type Facts, type TranscriptLine } from './facts.js';
import type { DemoRun, StepRun, World } from './scenario.js';

export interface HtmlOptions {
  /** drawTree's text, without colour. */
  tree: string;
  home: string;
  format: string;
  generatedAt?: Date;
}

/** The whole page. */
export function renderHtml(run: DemoRun, f: Facts, o: HtmlOptions): string {
  const rb = run.rollback;
  const toStep = rb.decision.toStep;
  const when = (o.generatedAt ?? new Date()).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
  const path = (rb.report as { path?: string }).path;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Lockstep demo · rollback to step ${toStep}</title>
<style>${CSS}</style>
</head>
<body>
<main>
<header class="hero">
  <p class="eyebrow">Lockstep demo report</p>
  <h1>Step 11 failed. Lockstep rolled back the world, <span class="em">and what the agent believed about it.</span></h1>
  <p class="lead">A scripted agent released a service inside a real sandbox: twelve steps, with an aligned checkpoint after each
  (files, processes, the agent’s context and a position in the effect ledger). At step 11 the release API answered
  <strong class="err">429 Too Many Requests</strong>. Lockstep rolled everything back to step ${toStep} as one step, told the agent which
  ${f.stale.length} observations had stopped being true, and kept the e-mail that had already gone out from going out twice.</p>
  <div class="stats">
    ${stat(ms(f.checkpointTotal.p50), 'checkpoint, p50', `max ${ms(f.checkpointTotal.max)} over ${f.checkpointTotal.n}`)}
    ${stat(ms(f.rollbackTotal), `rollback to step ${toStep}`, path === 'standby' ? 'warm standby swapped in' : 'files, processes, context')}
    ${stat(String(f.stale.length), 'stale observations', 'marked, with tool-call ids')}
    ${stat(String(run.deliveries), 'e-mail delivered', 'sent once, replayed once', 'amber')}
  </div>
</header>

<section>
  <h2>Timeline</h2>
  <p class="sub">Each dot is a checkpoint taken after a step, with its id and how long it took. The first attempt failed at step 11 and was abandoned; the retry grew from step ${toStep}.</p>
  <div class="card flush">${timeline(run, f)}</div>
</section>

<section>
  <h2>The world, before and after</h2>
  <p class="sub">Read from the sandbox just before the rollback and right after it, once the restored worker had written out what it holds.</p>
  <div class="grid2">
    ${worldCard(`Before · step ${rb.from.turn.step}`, rb.before, f, 'before')}
    ${worldCard(`After · back at step ${toStep}`, rb.after, f, 'after')}
  </div>
  ${workerNote(rb.before, rb.after)}
</section>

<section>
  <h2>What the agent believes</h2>
  <p class="sub">The agent’s context (Anthropic Messages format) at step ${rb.from.turn.step}, and the one Lockstep handed back: the step-${toStep} snapshot with a recovery note appended.</p>
  <div class="grid2">
    <div class="stack">
      <div class="card">
        <h3>Before <span class="muted">· ${count(rb.contextBefore)} messages</span></h3>
        <ul class="transcript">${f.before.map(transcriptRow).join('')}</ul>
      </div>
      <div class="card">
        <h3>Stale observations <span class="muted">· report.staleObservations</span></h3>
        <table class="obs">
          <thead><tr><th>tool call</th><th>step</th><th>kind</th><th>subject</th></tr></thead>
          <tbody>${f.stale.map((s) => staleRow(s, run)).join('')}</tbody>
        </table>
        <p class="fine">Each observation is bound to the timeline it was made on. Everything the agent saw after step ${toStep} is reported stale, by tool-call id, so a platform can find the exact tool results to distrust.</p>
      </div>
    </div>
    <div class="card">
      <h3>After <span class="muted">· ${count(rb.report.contextWithRecovery)} messages</span></h3>
      <ul class="transcript">${f.after.map(transcriptRow).join('')}<li class="note-row"><code class="id">user</code><span class="call">+ recovery note</span><span class="badge appended">appended</span></li></ul>
      <pre class="note">${noteHtml(rb.report.recoverySummary.text)}</pre>
    </div>
  </div>
</section>

<section>
  <h2>What a rollback cannot take back</h2>
  <p class="sub">Effects outside the sandbox go through the effect ledger: the intent is recorded before the e-mail goes out, and a repeat is answered from the ledger.</p>
  ${emailCard(run, f)}
</section>

<section>
  <h2>How long it took</h2>
  <p class="sub">Measured on this machine, from the timings <code>checkpoint()</code> and <code>rollback()</code> return. The darker part of each bar is the time the sandbox’s processes were frozen.</p>
  <div class="card flush">${latencyChart(run, f)}</div>
  <div class="card">${rollbackBar(f)}</div>
</section>

<section>
  <h2>Checkpoints</h2>
  <div class="card flush">
    <table class="ckpts">
      <thead><tr><th>step</th><th>checkpoint</th><th>label</th><th>branch</th><th class="num">total</th><th class="num">frozen</th></tr></thead>
      <tbody>${f.steps.map((s) => checkpointRow(s, run)).join('')}</tbody>
    </table>
  </div>
  <details class="card"><summary>As <code>lockstep log</code> draws it</summary><pre class="tree">${esc(o.tree)}</pre></details>
</section>

<footer>
  Sandbox <code>${esc(run.sandboxId)}</code> (removed after the run) · state directory <code>${esc(o.home)}</code> · context format <code>${esc(o.format)}</code> · generated ${esc(when)} by <code>npm run demo -- --html FILE</code>
</footer>
</main>
</body>
</html>
`;
}

// ---------------------------------------------------------------------------------------------
// Pieces

function stat(value: string, label: string, detail: string, tone = ''): string {
  return `<div class="stat ${tone}"><div class="value">${esc(value)}</div><div class="label">${esc(label)}</div><div class="detail">${esc(detail)}</div></div>`;
}

function count(ctx: unknown): number {
  return ((ctx as { messages?: unknown[] } | null)?.messages ?? []).length;
}

function stepName(s: StepRun): string {
  return `${s.turn.step}${s.turn.attempt > 1 ? '′' : ''}`;
}

function worldCard(title: string, w: World, f: Facts, side: 'before' | 'after'): string {
  // The files the rollback removed are listed on both sides: highlighted before, struck out after.
  const gone = new Set(f.filesGone);
  const paths = [...new Set([...w.files.map((x) => x.path), ...(side === 'after' ? f.filesGone : [])])].sort();
  const rows = fileRows(paths, gone).map(({ text, removed, first }) => {
    if (!removed) return `<li><span>${esc(text)}</span></li>`;
    return side === 'before'
      ? `<li class="hl"><span>${esc(text)}</span><em>${esc(origin(first))}</em></li>`
      : `<li class="gone"><span>${esc(text)}</span><em>gone</em></li>`;
  });
  const wk = parseWorker(w.worker);
  const loaded = wk && wk.holds.startsWith('config loaded');
  return `<div class="card world ${side}">
    <h3>${esc(title)}</h3>
    <p class="label">Files in /workspace</p>
    <ul class="files">${rows.join('')}</ul>
    <p class="label">The worker process’s memory</p>
    <div class="memory ${loaded ? 'loaded' : 'empty'}">
      ${wk ? `<div class="proc">pid ${esc(wk.pid)} · tick ${esc(wk.tick)}</div><div class="holds">${esc(wk.holds)}</div>` : `<div class="holds">${esc(w.worker)}</div>`}
    </div>
  </div>`;
}

function origin(p: string): string {
  if (p === 'config.json') return 'created at step 7';
  if (p.startsWith('out/')) return 'written at step 11';
  return 'created after step 6';
}

function workerNote(before: World, after: World): string {
  const b = parseWorker(before.worker);
  const a = parseWorker(after.worker);
  if (!a || !b || a.pid !== b.pid) return '';
  return `<p class="callout">Same process, pid ${esc(a.pid)}: the worker was not restarted. CRIU restored its memory as it was at the checkpoint, so its tick counter went back from ${esc(b.tick)} to ${esc(a.tick)} and the config it had loaded is gone from it too.</p>`;
}

const FATE: Record<TranscriptLine['fate'], [string, string]> = {
  kept: ['kept', '✓ still true'],
  stale: ['stale', '✗ stale'],
  irreversible: ['irrev', '⚠ not undone'],
  undone: ['undone', 'undone'],
};

function transcriptRow(l: TranscriptLine): string {
  const [cls, text] = FATE[l.fate];
  return `<li class="${cls}"><code class="id">${esc(l.toolCallId)}</code><span class="call">${esc(l.call)}</span><span class="badge ${cls}">${esc(text)}</span></li>`;
}

/** The recovery note as the model gets it, with its sections tinted by what they tell the agent. */
function noteHtml(text: string): string {
  let tone = '';
  return text
    .split('\n')
    .map((l) => {
      if (/^<\/?lockstep-recovery>$/.test(l)) return `<span class="n-tag">${esc(l)}</span>`;
      if (l.startsWith('No longer true')) tone = 'n-stale';
      else if (l.startsWith('Already happened') || l.startsWith('Happened outside') || l.startsWith('Compensations'))
        tone = 'n-effect';
      else if (l.startsWith('Still valid')) tone = 'n-lesson';
      else if (l === '' || l.startsWith('Undone by')) tone = '';
      const head = !l.startsWith('- ') && tone !== '';
      return tone ? `<span class="${tone}${head ? ' n-head' : ''}">${esc(l)}</span>` : esc(l);
    })
    .join('\n');
}

function staleRow(o: Facts['stale'][number], run: DemoRun): string {
  const step = run.firstAttempt.find((s) => s.turn.call.id === o.toolCallId);
  const exit = o.exitCode !== null && o.exitCode !== 0 ? ` <span class="exit">exit ${o.exitCode}</span>` : '';
  return `<tr title="${esc(o.id)}"><td><span class="badge stale">✗</span> <code>${esc(o.toolCallId ?? '–')}</code></td><td>${step ? stepName(step) : '–'}</td><td>${esc(o.kind)}</td><td><code>${esc(o.subject)}</code>${exit}</td></tr>`;
}

function emailCard(run: DemoRun, f: Facts): string {
  const e = f.email.effect;
  if (!e) return '<div class="card">No effects after the checkpoint.</div>';
  const input = e.input as { to?: string; subject?: string; body?: string };
  const out = e.output as { delivery?: number; messageId?: string } | undefined;
  const warning = run.rollback.report.warnings.find((w) => w.effectId === e.id);
  const sent = f.email.sentAt;
  const replay = f.email.replayedAt;
  return `<div class="card email">
    <div class="envelope">${ENVELOPE}</div>
    <div class="body">
      <div class="kind"><code>email.send</code> <span class="chip amber">irreversible</span> <span class="chip">${esc(e.status)}</span></div>
      <div class="to">to <strong>${esc(input.to ?? '')}</strong> · “${esc(input.subject ?? '')}”</div>
      <ol class="events">
        <li><span class="dot amber"></span>Step ${sent ? stepName(sent) : '?'} (<code>${esc(e.toolCallId ?? '')}</code>): intent recorded as <code>${esc(e.id)}</code>, then sent: delivery #${out?.delivery ?? '?'} <code>${esc(out?.messageId ?? '')}</code></li>
        <li><span class="dot indigo"></span>Rollback to step ${run.rollback.decision.toStep}: ${esc(warning?.message ?? 'reported as not undone')}; listed in the recovery note as MUST NOT be repeated</li>
        ${replay ? `<li><span class="dot green"></span>Step ${stepName(replay)} (<code>${esc(replay.turn.call.id)}</code>): the agent sent it again; the ledger answered with the recorded delivery and the e-mail service was not called</li>` : ''}
      </ol>
    </div>
    <div class="counter"><div class="value">${run.deliveries}</div><div class="label">delivery at the<br>e-mail stub</div></div>
  </div>`;
}

function checkpointRow(s: StepRun, run: DemoRun): string {
  const abandoned = s.turn.attempt === 1 && s.turn.step > run.rollback.decision.toStep;
  const branch =
    s.turn.attempt > 1
      ? '<span class="chip green">retry</span>'
      : abandoned
        ? '<span class="chip red">abandoned</span>'
        : '<span class="chip">shared</span>';
  const head = s === run.retry.at(-1) ? ' <span class="chip dark">head</span>' : '';
  const target = s === run.rollback.to ? ' <span class="chip indigo">rollback target</span>' : '';
  return `<tr class="${abandoned ? 'abandoned' : ''}"><td>${stepName(s)}</td><td><code>${esc(s.checkpoint.id)}</code>${head}${target}</td><td>${esc((s.checkpoint.label ?? '').replace(/^step \d+'?: /, ''))}</td><td>${branch}</td><td class="num">${ms(s.checkpoint.timings.totalMs)}</td><td class="num">${ms(s.checkpoint.timings.frozenMs)}</td></tr>`;
}

// ---------------------------------------------------------------------------------------------
// Timeline

const TL = { x0: 52, dx: 84, top: 134, mid: 240, bot: 340, r: 13, w: 1040, h: 420 };

function timeline(run: DemoRun, f: Facts): string {
  const to = run.rollback.decision.toStep;
  const x = (step: number) => TL.x0 + (step - 1) * TL.dx;
  const shared = run.firstAttempt.filter((s) => s.turn.step <= to);
  const abandoned = run.firstAttempt.filter((s) => s.turn.step > to);
  const retry = run.retry;
  const parts: string[] = [];

  // Row captions
  parts.push(`<text class="row-cap red" x="${TL.x0 - 20}" y="${TL.top + 4}">ATTEMPT 1 · ABANDONED</text>`);
  parts.push(
    `<text class="row-cap green" x="${TL.x0 - 20}" y="${TL.bot + 4}">ATTEMPT 2 · FROM THE RECOVERY NOTE</text>`,
  );

  // Edges
  const edge = (x1: number, y1: number, x2: number, y2: number, cls: string) =>
    y1 === y2
      ? `<line class="edge ${cls}" x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}"/>`
      : `<path class="edge ${cls}" d="M${x1},${y1} C${x1 + 60},${y1} ${x2 - 60},${y2} ${x2},${y2}"/>`;
  for (let i = 1; i < shared.length; i++) parts.push(edge(x(i), TL.mid, x(i + 1), TL.mid, 'shared'));
  if (abandoned.length) parts.push(edge(x(to), TL.mid, x(to + 1), TL.top, 'abandoned'));
  for (let i = 1; i < abandoned.length; i++) parts.push(edge(x(to + i), TL.top, x(to + i + 1), TL.top, 'abandoned'));
  if (retry.length) parts.push(edge(x(to), TL.mid, x(to + 1), TL.bot, 'retry'));
  for (let i = 1; i < retry.length; i++) parts.push(edge(x(to + i), TL.bot, x(to + i + 1), TL.bot, 'retry'));

  // The rollback arrow: from the last abandoned checkpoint, over the top row, down into the target.
  const last = run.rollback.from.turn.step;
  const yA = 38;
  // It leaves sideways so that it does not cross the checkpoint's label.
  const xR = x(last) + 36;
  parts.push(
    `<path class="rollback" marker-end="url(#arrow)" d="M${x(last) + TL.r + 3},${TL.top} L${xR - 10},${TL.top} Q${xR},${TL.top} ${xR},${TL.top - 10} L${xR},${yA + 12} Q${xR},${yA} ${xR - 12},${yA} L${x(to) + 12},${yA} Q${x(to)},${yA} ${x(to)},${yA + 12} L${x(to)},${TL.mid - TL.r - 6}"/>`,
  );
  parts.push(
    `<text class="rollback-label" x="${(xR + x(to)) / 2}" y="${yA - 10}">rollback to step ${to} · ${esc(ms(f.rollbackTotal))}</text>`,
  );

  // Nodes
  const node = (s: StepRun, y: number, cls: string, labelBelow = true) => {
    const cx = x(s.turn.step);
    const failed = s.outcome.isError;
    const head = s === run.retry.at(-1);
    const ly = labelBelow ? y + TL.r + 16 : y - TL.r - 20;
    return `<g class="node ${cls}${failed ? ' failed' : ''}${head ? ' head' : ''}"><title>${esc(`${s.checkpoint.id} · ${s.checkpoint.label ?? ''} · ${ms(s.checkpoint.timings.totalMs)}`)}</title>
      ${head ? `<circle class="halo" cx="${cx}" cy="${y}" r="${TL.r + 5}"/>` : ''}
      <circle cx="${cx}" cy="${y}" r="${TL.r}"/>
      <text class="num" x="${cx}" y="${y + 4}">${failed ? '✗' : esc(stepName(s))}</text>
      <text class="cid" x="${cx}" y="${ly}">${esc(s.checkpoint.id.replace(/^ckpt_/, '').slice(0, 8))}</text>
      <text class="lat" x="${cx}" y="${ly + 12}">${esc(ms(s.checkpoint.timings.totalMs))}</text>
    </g>`;
  };
  for (const s of shared) parts.push(node(s, TL.mid, s === run.rollback.to ? 'shared target' : 'shared'));
  for (const s of abandoned) parts.push(node(s, TL.top, 'abandoned', false));
  for (const s of retry) parts.push(node(s, TL.bot, 'retry'));

  // What happened at the steps that matter
  const tag = (s: StepRun | undefined, y: number, text: string, cls: string) => {
    if (!s) return;
    const w = text.length * 6 + 16;
    const cx = x(s.turn.step);
    parts.push(
      `<g class="tag ${cls}"><rect x="${cx - w / 2}" y="${y - 11}" width="${w}" height="18" rx="9"/><text x="${cx}" y="${y + 2}">${esc(text)}</text></g>`,
    );
  };
  const at = (steps: StepRun[], pred: (s: StepRun) => boolean) => steps.find(pred);
  // Above the abandoned row's labels, below the retry row's: the branch curves come in from the other side.
  const tagTop = TL.top - TL.r - 46;
  const tagBot = TL.bot + TL.r + 56;
  tag(
    at(abandoned, (s) => s.turn.call.name === 'write_file'),
    tagTop,
    '+ config.json',
    'neutral',
  );
  tag(
    at(abandoned, (s) => !!s.outcome.effect),
    tagTop,
    '✉ e-mail',
    'amber',
  );
  tag(
    at(abandoned, (s) => s.turn.call.name === 'read_file'),
    tagTop,
    'reads it',
    'neutral',
  );
  const failed = at(abandoned, (s) => s.outcome.isError);
  tag(failed, tagTop, /HTTP \d{3}/.exec(failed?.outcome.text ?? '')?.[0] ?? 'failed', 'red');
  const rewrite = at(retry, (s) => s.turn.call.name === 'write_file');
  tag(rewrite, tagBot, `${rate(rewrite)} req/s`, 'green');
  tag(
    at(retry, (s) => !!s.outcome.effect?.replayed),
    tagBot,
    '✉ replayed',
    'indigo',
  );
  tag(
    at(
      retry,
      (s) => s.turn.call.name === 'run' && s.turn.call.input.command === 'sh bin/publish.sh' && !s.outcome.isError,
    ),
    tagBot,
    '✓ published',
    'green',
  );
  tag(
    at(shared, (s) => s.turn.call.name === 'start_process'),
    TL.mid - TL.r - 14,
    'worker up',
    'neutral',
  );

  return `<svg class="timeline" viewBox="0 0 ${TL.w} ${TL.h}" role="img" aria-label="Checkpoint timeline">
  <defs><marker id="arrow" viewBox="0 0 10 10" refX="6" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>
  ${parts.join('\n  ')}
</svg>`;
}

function rate(s: StepRun | undefined): string {
  try {
    return String((JSON.parse(s?.turn.call.input.content ?? '') as { rate_limit_rps?: number }).rate_limit_rps ?? '?');
  } catch {
    return '?';
  }
}

// ---------------------------------------------------------------------------------------------
// Latency

function latencyChart(run: DemoRun, f: Facts): string {
  const W = 1040;
  const H = 250;
  const left = 56;
  const right = 20;
  const top = 36;
  const bottom = 54;
  const steps = f.steps;
  const max = Math.max(...steps.map((s) => s.checkpoint.timings.totalMs ?? 0), 1);
  const { max: scaleMax, step: tickStep } = axis(max);
  const gap = 18; // between the groups
  const groups = 2;
  const slot = (W - left - right - gap * groups) / steps.length;
  const bw = Math.min(34, slot * 0.62);
  const y = (v: number) => top + (H - top - bottom) * (1 - v / scaleMax);
  const to = run.rollback.decision.toStep;
  const parts: string[] = [];

  for (let v = 0; v <= scaleMax; v += tickStep) {
    parts.push(
      `<line class="grid" x1="${left}" x2="${W - right}" y1="${y(v)}" y2="${y(v)}"/><text class="axis" x="${left - 8}" y="${y(v) + 4}" text-anchor="end">${v} ms</text>`,
    );
  }
  const p50 = f.checkpointTotal.p50;
  parts.push(`<line class="p50" x1="${left}" x2="${W - right}" y1="${y(p50)}" y2="${y(p50)}"/>`);
  let xi = left;
  steps.forEach((s, i) => {
    if (i === to || i === run.firstAttempt.length) xi += gap;
    const cx = xi + slot / 2;
    const total = s.checkpoint.timings.totalMs ?? 0;
    const frozen = Math.min(s.checkpoint.timings.frozenMs ?? 0, total);
    const cls = s.turn.attempt > 1 ? 'retry' : s.turn.step > to ? 'abandoned' : 'shared';
    parts.push(`<g class="bar ${cls}"><title>${esc(`step ${stepName(s)} · ${s.checkpoint.id} · total ${ms(total)} · frozen ${ms(frozen)}`)}</title>
      <rect class="total" x="${cx - bw / 2}" y="${y(total)}" width="${bw}" height="${y(0) - y(total)}" rx="3"/>
      <rect class="frozen" x="${cx - bw / 2}" y="${y(frozen)}" width="${bw}" height="${y(0) - y(frozen)}" rx="3"/>
      <text class="val" x="${cx}" y="${y(total) - 6}">${total.toFixed(0)}</text>
      <text class="step" x="${cx}" y="${H - bottom + 18}">${esc(stepName(s))}</text></g>`);
    xi += slot;
  });
  // Legend, top right
  const lx = W - right - 470;
  parts.push(
    `<g class="legend-svg"><rect x="${lx}" y="4" width="10" height="10" rx="2" class="lg-frozen"/><text x="${lx + 16}" y="13">processes frozen</text>` +
      `<rect x="${lx + 130}" y="4" width="10" height="10" rx="2" class="lg-total"/><text x="${lx + 146}" y="13">total</text>` +
      `<line x1="${lx + 196}" x2="${lx + 220}" y1="9" y2="9" class="p50"/><text x="${lx + 226}" y="13" class="p50-label">p50 ${esc(ms(p50))} · max ${esc(ms(f.checkpointTotal.max))} (first ${f.checkpointTotal.n})</text></g>`,
  );
  const groupLabel = (from: number, n: number, text: string, extra: number) => {
    const x1 = left + extra + from * slot;
    return `<text class="group" x="${x1 + (n * slot) / 2}" y="${H - 12}">${esc(text)}</text>`;
  };
  parts.push(groupLabel(0, to, `steps 1–${to}`, 0));
  parts.push(groupLabel(to, run.firstAttempt.length - to, `${to + 1}–${run.firstAttempt.length}, abandoned`, gap));
  parts.push(
    groupLabel(run.firstAttempt.length, run.retry.length, `${to + 1}′–${run.firstAttempt.length}′, retry`, gap * 2),
  );
  return `<svg class="latency" viewBox="0 0 ${W} ${H}" role="img" aria-label="Checkpoint latencies">${parts.join('')}</svg>`;
}

function rollbackBar(f: Facts): string {
  const total = f.rollbackTotal;
  const known = f.rollbackPhases.reduce((a, p) => a + p.ms, 0);
  const phases = [...f.rollbackPhases, ...(total - known > 0.05 ? [{ name: 'other', ms: total - known }] : [])];
  const segs = phases
    .filter((p) => p.ms > 0)
    .map(
      (p, i) => `<div class="seg s${i}" style="flex:${p.ms.toFixed(3)}" title="${esc(`${p.name} ${ms(p.ms)}`)}"></div>`,
    )
    .join('');
  const legend = phases
    .map((p, i) => `<li><span class="sw s${i}"></span>${esc(p.name)} <strong>${esc(ms(p.ms))}</strong></li>`)
    .join('');
  return `<div class="rb-head"><h3>Rollback to step 6</h3><div class="rb-total">${esc(ms(total))}</div></div>
    <div class="phases">${segs}</div><ul class="legend">${legend}</ul>`;
}

/** A round axis maximum a little above v, and the step between grid lines. */
function axis(v: number): { max: number; step: number } {
  const step = [5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000].find((s) => (v * 1.1) / s <= 5) ?? 10_000;
  return { max: Math.ceil((v * 1.1) / step) * step, step };
}

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

const ENVELOPE = `<svg viewBox="0 0 48 48" width="48" height="48" aria-hidden="true"><rect x="4" y="10" width="40" height="28" rx="5" fill="#fff7ed" stroke="#c2410c" stroke-width="2.5"/><path d="M6 13 L24 27 L42 13" fill="none" stroke="#c2410c" stroke-width="2.5" stroke-linejoin="round"/></svg>`;

const CSS = `
:root{--ink:#18181b;--ink2:#3f3f46;--muted:#71717a;--faint:#a1a1aa;--line:#e4e4e7;--bg:#f6f5f3;--card:#fff;
--red:#dc2626;--red-bg:#fef2f2;--amber:#c2410c;--amber-bg:#fff7ed;--green:#15803d;--green-bg:#f0fdf4;--indigo:#4f46e5;--indigo-bg:#eef2ff;
--sans:ui-sans-serif,-apple-system,"Segoe UI",Inter,Roboto,"Helvetica Neue",Arial,sans-serif;--mono:ui-monospace,"SF Mono","JetBrains Mono",Menlo,Consolas,"DejaVu Sans Mono",monospace}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.55 var(--sans);-webkit-font-smoothing:antialiased}
main{max-width:1120px;margin:0 auto;padding:56px 40px 40px}
code,pre{font-family:var(--mono);font-size:.86em}
h1{font-size:38px;line-height:1.15;letter-spacing:-.02em;margin:.2em 0 .45em;max-width:900px;font-weight:750}
h1 .em{color:var(--indigo)}
h2{font-size:22px;letter-spacing:-.01em;margin:0 0 4px}
h3{font-size:15px;margin:0 0 12px}
.eyebrow{text-transform:uppercase;letter-spacing:.14em;font-size:12px;font-weight:650;color:var(--muted);margin:0}
.lead{font-size:17px;color:var(--ink2);max-width:860px;margin:0 0 28px}
.lead .err{color:var(--red);font-weight:650}
.sub{color:var(--muted);margin:0 0 16px;max-width:860px}
.muted{color:var(--muted);font-weight:400}
section{margin-top:56px}
.card{background:var(--card);border:1px solid var(--line);border-radius:14px;padding:22px 24px;box-shadow:0 1px 2px rgba(0,0,0,.03)}
.card.flush{padding:10px 8px}
.card+.card{margin-top:16px}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:16px;margin-bottom:16px}
.grid2 .card+.card{margin-top:0}
.stats{display:grid;grid-template-columns:repeat(4,1fr);gap:14px}
.stat{background:var(--card);border:1px solid var(--line);border-radius:14px;padding:16px 18px}
.stat .value{font-size:30px;font-weight:750;letter-spacing:-.02em;font-variant-numeric:tabular-nums}
.stat .label{font-weight:600;margin-top:2px}
.stat .detail{color:var(--muted);font-size:13px}
.stat.amber .value{color:var(--amber)}
svg{display:block;width:100%;height:auto}
.timeline .edge{fill:none;stroke-width:3}
.timeline .edge.shared{stroke:var(--ink)}
.timeline .edge.abandoned{stroke:#d4d4d8;stroke-dasharray:5 5}
.timeline .edge.retry{stroke:var(--green)}
.timeline .node circle{stroke-width:2.5}
.timeline .node.shared circle{fill:var(--ink);stroke:var(--ink)}
.timeline .node.abandoned circle{fill:#fff;stroke:#d4d4d8;stroke-dasharray:3 3}
.timeline .node.abandoned.failed circle{fill:var(--red);stroke:var(--red);stroke-dasharray:none}
.timeline .node.retry circle{fill:var(--green);stroke:var(--green)}
.timeline .node.target circle{stroke:var(--indigo);stroke-width:4}
.timeline .node .halo{fill:none;stroke:var(--green);stroke-width:2;opacity:.35}
.timeline .num{font:700 12px var(--sans);text-anchor:middle;fill:#fff}
.timeline .abandoned .num{fill:var(--faint)}
.timeline .abandoned.failed .num{fill:#fff}
.timeline .cid{font:10.5px var(--mono);text-anchor:middle;fill:var(--muted)}
.timeline .lat{font:600 10.5px var(--sans);text-anchor:middle;fill:var(--ink2)}
.timeline .abandoned .cid,.timeline .abandoned .lat{fill:var(--faint)}
.timeline .row-cap{font:700 11px var(--sans);letter-spacing:.08em}
.timeline .row-cap.red{fill:var(--red);opacity:.75}
.timeline .row-cap.green{fill:var(--green)}
.timeline .rollback{fill:none;stroke:var(--indigo);stroke-width:2.5;stroke-dasharray:7 5}
.timeline .arrowhead{fill:var(--indigo)}
.timeline .rollback-label{font:700 13px var(--sans);fill:var(--indigo);text-anchor:middle}
.timeline .tag rect{stroke-width:1}
.timeline .tag text{font:600 10.5px var(--sans);text-anchor:middle}
.timeline .tag.neutral rect{fill:#f4f4f5;stroke:#e4e4e7}.timeline .tag.neutral text{fill:var(--ink2)}
.timeline .tag.amber rect{fill:var(--amber-bg);stroke:#fed7aa}.timeline .tag.amber text{fill:var(--amber)}
.timeline .tag.red rect{fill:var(--red-bg);stroke:#fecaca}.timeline .tag.red text{fill:var(--red)}
.timeline .tag.green rect{fill:var(--green-bg);stroke:#bbf7d0}.timeline .tag.green text{fill:var(--green)}
.timeline .tag.indigo rect{fill:var(--indigo-bg);stroke:#c7d2fe}.timeline .tag.indigo text{fill:var(--indigo)}
.world .label,.note-label{text-transform:uppercase;letter-spacing:.08em;font-size:11px;font-weight:650;color:var(--muted);margin:16px 0 6px}
.world h3{margin-bottom:0}
.files{list-style:none;margin:0;padding:0;font:13px/1.9 var(--mono)}
.files li{display:flex;justify-content:space-between;align-items:center;padding:0 8px;border-radius:6px}
.files li em{font:italic 12px var(--sans);color:var(--muted)}
.files li.hl{background:var(--amber-bg);color:var(--amber)}
.files li.hl em{color:var(--amber)}
.files li.gone span{text-decoration:line-through;color:var(--faint)}
.files li.gone em{color:var(--red);font-style:normal;font-weight:600}
.memory{border-radius:10px;padding:12px 14px;font-family:var(--mono);font-size:13px;border:1px solid var(--line)}
.memory .proc{color:var(--muted);font-size:12px;margin-bottom:4px}
.memory.loaded{background:var(--amber-bg);border-color:#fed7aa}
.memory.loaded .holds{color:var(--amber);word-break:break-all}
.memory.empty{background:var(--green-bg);border-color:#bbf7d0}
.memory.empty .holds{color:var(--green);font-weight:600}
.callout{background:var(--indigo-bg);color:#3730a3;border-radius:12px;padding:12px 16px;margin:0}
.transcript{list-style:none;margin:0;padding:0}
.transcript li{display:grid;grid-template-columns:84px 1fr auto;gap:10px;align-items:center;padding:5px 8px;border-radius:8px;font-size:13.5px}
.transcript li+li{margin-top:2px}
.transcript .id{color:var(--muted);font-size:12px}
.transcript .call{font-family:var(--mono);font-size:12.5px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.transcript li.stale{background:var(--red-bg)}
.transcript li.stale .call{text-decoration:line-through;text-decoration-color:rgba(220,38,38,.45);color:#991b1b}
.transcript li.irrev{background:var(--amber-bg)}
.badge{font-size:11.5px;font-weight:650;padding:2px 8px;border-radius:999px;white-space:nowrap}
.badge.kept{color:var(--green);background:var(--green-bg)}
.badge.stale{color:#fff;background:var(--red)}
.badge.irrev{color:#fff;background:var(--amber)}
.badge.undone{color:var(--muted);background:#f4f4f5}
.stack{display:flex;flex-direction:column;gap:16px}
.stack .card+.card{margin-top:0}
.fine{font-size:13px;color:var(--muted);margin:12px 0 0}
.transcript li.note-row{background:var(--indigo-bg)}
.transcript li.note-row .call{color:var(--indigo);font-weight:600}
.badge.appended{color:#fff;background:var(--indigo)}
.obs td,.obs th{padding:7px 8px}
.note .n-tag{color:#a8a29e}
.note .n-stale{color:#fca5a5}.note .n-effect{color:#fdba74}.note .n-lesson{color:#86efac}
.note .n-head{font-weight:700}
.note{margin-top:14px !important;background:#1c1917;color:#e7e5e4;border-radius:10px;padding:14px 16px;font-size:11.5px;line-height:1.6;white-space:pre-wrap;word-break:break-word;margin:0}
table{border-collapse:collapse;width:100%;font-size:13.5px}
th{font-size:11px;text-transform:uppercase;letter-spacing:.08em;color:var(--muted);text-align:left;font-weight:650;padding:8px 10px;border-bottom:1px solid var(--line)}
td{padding:8px 10px;border-bottom:1px solid #f4f4f5;vertical-align:middle}
tr:last-child td{border-bottom:none}
.num{text-align:right;font-variant-numeric:tabular-nums}
.exit{color:var(--red);font-weight:600;font-size:12px;margin-left:6px}
.ckpts tr.abandoned td{color:var(--faint)}
.ckpts tr.abandoned code{color:var(--faint)}
.chip{display:inline-block;font-size:11px;font-weight:650;padding:1px 8px;border-radius:999px;background:#f4f4f5;color:var(--ink2);vertical-align:1px}
.chip.amber{background:var(--amber-bg);color:var(--amber)}
.chip.green{background:var(--green-bg);color:var(--green)}
.chip.red{background:var(--red-bg);color:var(--red)}
.chip.indigo{background:var(--indigo-bg);color:var(--indigo)}
.chip.dark{background:var(--ink);color:#fff}
.email{display:grid;grid-template-columns:56px 1fr 150px;gap:20px;align-items:start}
.email .kind{font-size:15px;display:flex;gap:8px;align-items:center}
.email .to{margin:6px 0 12px;color:var(--ink2)}
.events{list-style:none;margin:0;padding:0;position:relative}
.events li{position:relative;padding:0 0 12px 22px;font-size:14px;color:var(--ink2)}
.events li:last-child{padding-bottom:0}
.events li::before{content:"";position:absolute;left:5px;top:14px;bottom:-4px;width:2px;background:var(--line)}
.events li:last-child::before{display:none}
.dot{position:absolute;left:0;top:5px;width:12px;height:12px;border-radius:50%}
.dot.amber{background:var(--amber)}.dot.indigo{background:var(--indigo)}.dot.green{background:var(--green)}
.counter{text-align:center;background:var(--amber-bg);border-radius:12px;padding:14px 8px}
.counter .value{font-size:52px;font-weight:800;color:var(--amber);line-height:1}
.counter .label{font-size:12.5px;color:var(--amber);margin-top:6px}
.latency .grid{stroke:#f0f0f1}
.latency .axis{font:11px var(--sans);fill:var(--faint)}
.latency .bar.shared .total{fill:#a1a1aa}.latency .bar.shared .frozen{fill:var(--ink)}
.latency .bar.abandoned .total{fill:#fee2e2}.latency .bar.abandoned .frozen{fill:#fca5a5}
.latency .bar.retry .total{fill:#bbf7d0}.latency .bar.retry .frozen{fill:var(--green)}
.latency .val{font:600 11px var(--sans);fill:var(--ink2);text-anchor:middle;paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}
.latency .step{font:600 12px var(--sans);fill:var(--muted);text-anchor:middle}
.latency .group{font:12px var(--sans);fill:var(--muted);text-anchor:middle}
.latency .p50{stroke:var(--indigo);stroke-dasharray:4 4;stroke-width:1.5}
.latency .p50-label{font:600 12px var(--sans);fill:var(--indigo)}
.latency .legend-svg text{font:12px var(--sans);fill:var(--ink2)}
.latency .lg-frozen{fill:var(--ink)}.latency .lg-total{fill:#a1a1aa}
.rb-head{display:flex;justify-content:space-between;align-items:baseline}
.rb-total{font-size:26px;font-weight:750;color:var(--indigo);font-variant-numeric:tabular-nums}
.phases{display:flex;height:22px;border-radius:8px;overflow:hidden;margin:8px 0 12px;gap:2px}
.seg.s0,.sw.s0{background:#c7d2fe}.seg.s1,.sw.s1{background:#a5b4fc}.seg.s2,.sw.s2{background:#818cf8}.seg.s3,.sw.s3{background:#6366f1}.seg.s4,.sw.s4{background:#4338ca}.seg.s5,.sw.s5{background:#d4d4d8}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:6px 22px;margin:0;padding:0;font-size:13.5px;color:var(--ink2)}
.legend .sw{display:inline-block;width:10px;height:10px;border-radius:3px;margin-right:7px;vertical-align:0}
details summary{cursor:pointer;font-weight:600}
.tree{font-size:12px;line-height:1.5;margin:14px 0 0;overflow-x:auto;color:var(--ink2)}
footer{margin-top:56px;padding-top:20px;border-top:1px solid var(--line);color:var(--muted);font-size:13px}
@media (max-width:820px){.grid2,.stats{grid-template-columns:1fr 1fr}.grid2{grid-template-columns:1fr}.email{grid-template-columns:1fr}main{padding:32px 18px}h1{font-size:30px}}
`;
