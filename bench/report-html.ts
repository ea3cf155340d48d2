/**
 * bench/results/report.html: one self-contained page (inline SVG and CSS,
 * no script, nothing fetched) with the curves a reader looks for, from the
 * last `npm run bench` (latest.json) and `npm run bench:trajectory`
 * (trajectory.json), whichever exist:
 * - checkpoint time against memory held (the sweep, e): Lockstep with
 *   written-page tracking, Lockstep with whole images, the stock `criu dump`
 *   CLI, and the goal line (15 ms + 0.02 ms per MiB);
 * - bytes stored per checkpoint against memory held, with the bytes changed;
 * - the trajectory's share of time spent on state, per inference time, with
 *   its targets;
 * - every target's PASS or MISS.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { BenchResults } from './report.js';

export const SWEEP_MIB = [16, 64, 256, 1024];
const MIB = 2 ** 20;

interface Series {
  name: string;
  color: string;
  points: [number, number][];
  dashed?: boolean;
}

/** The trajectory file's fields this page reads. */
export interface TrajectoryFile {
  startedAt?: string;
  quick?: boolean;
  linear?: { byInference?: Record<string, { share: number; target: number }> };
  treeSearch?: { byInference?: Record<string, { share: number; target: number }> };
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const fmt = (v: number) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));

/** A line chart with log-scaled axes (memory held spans 64×, times span 1000×). */
export function logChart(title: string, yUnit: string, series: Series[]): string {
  const W = 640;
  const H = 360;
  const m = { l: 70, r: 190, t: 36, b: 48 };
  const all = series.flatMap((s) => s.points).filter(([x, y]) => x > 0 && y > 0);
  // Goal lines alone are not a chart.
  if (!series.some((s) => !s.dashed && s.points.length))
    return `<p class="none">${esc(title)}: no numbers in these results.</p>`;
  const lx = (v: number) => Math.log10(v);
  const [x0, x1] = [Math.min(...all.map((p) => lx(p[0]))), Math.max(...all.map((p) => lx(p[0])))];
  const y0 = Math.floor(Math.min(...all.map((p) => lx(p[1]))));
  const y1 = Math.ceil(Math.max(...all.map((p) => lx(p[1]))));
  const px = (v: number) => m.l + ((lx(v) - x0) / (x1 - x0 || 1)) * (W - m.l - m.r);
  const py = (v: number) => H - m.b - ((lx(v) - y0) / (y1 - y0 || 1)) * (H - m.t - m.b);
  const out: string[] = [
    `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`,
    `<text x="${m.l}" y="20" class="title">${esc(title)}</text>`,
  ];
  for (let e = y0; e <= y1; e++) {
    const y = py(10 ** e);
    out.push(`<line x1="${m.l}" x2="${W - m.r}" y1="${y}" y2="${y}" class="grid"/>`);
    out.push(`<text x="${m.l - 6}" y="${y + 4}" class="tick" text-anchor="end">${fmt(10 ** e)} ${esc(yUnit)}</text>`);
  }
  for (const x of [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b)) {
    out.push(`<text x="${px(x)}" y="${H - m.b + 18}" class="tick" text-anchor="middle">${x} MiB</text>`);
  }
  out.push(`<text x="${(m.l + W - m.r) / 2}" y="${H - 8}" class="tick" text-anchor="middle">memory held</text>`);
  series.forEach((s, i) => {
    const pts = s.points.filter(([x, y]) => x > 0 && y > 0);
    if (!pts.length) return;
    const d = pts.map(([x, y], k) => `${k ? 'L' : 'M'}${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(' ');
    out.push(`<path d="${d}" stroke="${s.color}" class="line${s.dashed ? ' dashed' : ''}"/>`);
    for (const [x, y] of pts)
      out.push(
        `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${s.color}"><title>${esc(s.name)}: ${fmt(y)} ${esc(yUnit)} at ${x} MiB</title></circle>`,
      );
    const ly = m.t + 16 + i * 20;
    out.push(
      `<line x1="${W - m.r + 12}" x2="${W - m.r + 32}" y1="${ly - 4}" y2="${ly - 4}" stroke="${s.color}" class="line${s.dashed ? ' dashed' : ''}"/>`,
    );
    out.push(`<text x="${W - m.r + 38}" y="${ly}" class="legend">${esc(s.name)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n');
}

/** Horizontal bars of a share (0-1) with each bar's target marked. */
export function shareChart(title: string, rows: { name: string; share: number; target: number }[]): string {
  if (!rows.length) return `<p class="none">${esc(title)}: no trajectory results.</p>`;
  const W = 640;
  const rowH = 28;
  const m = { l: 220, r: 80, t: 36 };
  const H = m.t + rows.length * rowH + 24;
  const top = Math.max(0.1, ...rows.map((r) => Math.max(r.share, r.target))) * 1.1;
  const px = (v: number) => m.l + (v / top) * (W - m.l - m.r);
  const out = [
    `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`,
    `<text x="10" y="20" class="title">${esc(title)}</text>`,
  ];
  rows.forEach((r, i) => {
    const y = m.t + i * rowH;
    const pass = r.share <= r.target;
    out.push(`<text x="${m.l - 8}" y="${y + 16}" class="tick" text-anchor="end">${esc(r.name)}</text>`);
    out.push(
      `<rect x="${m.l}" y="${y + 4}" width="${(px(r.share) - m.l).toFixed(1)}" height="16" class="${pass ? 'pass' : 'miss'}"/>`,
    );
    out.push(`<line x1="${px(r.target)}" x2="${px(r.target)}" y1="${y}" y2="${y + 24}" class="goal"/>`);
    out.push(
      `<text x="${px(Math.max(r.share, r.target)) + 6}" y="${y + 16}" class="tick">${(100 * r.share).toFixed(1)}% (goal ${(100 * r.target).toFixed(0)}%)</text>`,
    );
  });
  out.push('</svg>');
  return out.join('\n');
}

/** The page, from the bench's results and the trajectory's (either may be missing). */
export function renderReportHtml(bench: BenchResults | undefined, trajectory: TrajectoryFile | undefined): string {
  const p50 = (key: string) => {
    const m = bench?.measurements.find((x) => x.key === key);
    return m && !m.unavailable && m.summary.n ? m.summary.p50 : undefined;
  };
  const at = (f: (mib: number) => number | undefined) =>
    SWEEP_MIB.flatMap((mib) => {
      const v = f(mib);
      return v === undefined ? [] : [[mib, v] as [number, number]];
    });
  const time = logChart('(e) checkpoint time against memory held (p50, 1 MiB changed per checkpoint)', 'ms', [
    { name: 'Lockstep (tracked)', color: '#1f77b4', points: at((m) => p50(`e.${m}m.lockstep.checkpoint`)) },
    { name: 'Lockstep, whole images', color: '#9467bd', points: at((m) => p50(`e.${m}m.lockstep.checkpoint:whole`)) },
    {
      name: 'first after a rollback',
      color: '#8c564b',
      points: at((m) => p50(`e.${m}m.lockstep.checkpoint:after-rollback`)),
    },
    { name: 'criu dump CLI (stock)', color: '#d62728', points: at((m) => p50(`e.${m}m.criu-cli.checkpoint:dump`)) },
    { name: 'goal: 15 + 0.02/MiB', color: '#2ca02c', dashed: true, points: SWEEP_MIB.map((m) => [m, 15 + 0.02 * m]) },
  ]);
  const bytes = (key: string) => bench?.diagnostics[key]?.p50;
  const stored = logChart('(e) bytes stored per checkpoint against memory held (p50)', 'MiB', [
    { name: 'Lockstep (tracked)', color: '#1f77b4', points: at((m) => mibOf(bytes(`e.${m}m.storedBytes`))) },
    { name: 'Lockstep, whole images', color: '#9467bd', points: at((m) => mibOf(bytes(`e.${m}m.storedBytesWhole`))) },
    {
      name: 'first after a rollback',
      color: '#8c564b',
      points: at((m) => mibOf(bytes(`e.${m}m.storedBytesAfterRollback`))),
    },
    { name: 'changed: 1 MiB', color: '#2ca02c', dashed: true, points: SWEEP_MIB.map((m) => [m, 1]) },
  ]);
  const shares: { name: string; share: number; target: number }[] = [];
  for (const [name, run] of [
    ['linear', trajectory?.linear],
    ['tree search', trajectory?.treeSearch],
  ] as const)
    for (const [inf, v] of Object.entries(run?.byInference ?? {}))
      shares.push({ name: `${name}, ${inf} inference per step`, share: v.share, target: v.target });
  const share = shareChart('(t) share of a trajectory spent on checkpoints and rollbacks', shares);
  const targets = (bench?.targets ?? [])
    .map(
      (t) =>
        `<tr class="${t.pass === null ? '' : t.pass ? 'pass' : 'miss'}"><td>${esc(t.key)}</td><td>${esc(t.target)}</td><td>${esc(t.measured)}</td><td>${t.pass === null ? '—' : t.pass ? 'PASS' : 'MISS'}</td></tr>`,
    )
    .join('\n');
  const when = [
    bench ? `bench: ${esc(bench.startedAt)}${bench.options.quick ? ' (--quick)' : ''}` : 'bench: no results',
    trajectory?.startedAt
      ? `trajectory: ${esc(trajectory.startedAt)}${trajectory.quick ? ' (--quick)' : ''}`
      : 'trajectory: no results',
  ].join('; ');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lockstep benchmark report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; max-width: 720px; margin: 2em auto; color: #222; }
svg { width: 100%; height: auto; margin: 1em 0; }
.title { font-weight: 600; font-size: 14px; } .tick, .legend { font-size: 11px; fill: #444; }
.grid { stroke: #ddd; } .line { fill: none; stroke-width: 2; } .dashed { stroke-dasharray: 5 4; }
.goal { stroke: #2ca02c; stroke-width: 2; stroke-dasharray: 4 3; }
rect.pass { fill: #2ca02c; } rect.miss { fill: #d62728; }
table { border-collapse: collapse; width: 100%; font-size: 12px; } td { border-bottom: 1px solid #eee; padding: 3px 6px; }
tr.pass td:last-child { color: #2ca02c; font-weight: 600; } tr.miss td:last-child { color: #d62728; font-weight: 600; }
.none { color: #888; }
</style></head><body>
<h1>Lockstep benchmark report</h1>
<p>${when}. Written by <code>npm run bench</code> and <code>npm run bench:trajectory</code>
(bench/report-html.ts); the numbers are in bench/results/latest.json and trajectory.json.</p>
${time}
${stored}
${share}
<h2>Targets</h2>
<table><tr><td><b>key</b></td><td><b>target</b></td><td><b>measured</b></td><td></td></tr>
${targets}
</table>
</body></html>
`;
}

function mibOf(b: number | undefined): number | undefined {
  return b === undefined ? undefined : b / MIB;
}

function readJson<T>(file: string): T | undefined {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

/** Writes dir/report.html from dir/latest.json and dir/trajectory.json; returns its path. */
export function writeReportHtml(dir: string): string {
  const file = path.join(dir, 'report.html');
  const html = renderReportHtml(
    readJson<BenchResults>(path.join(dir, 'latest.json')),
    readJson<TrajectoryFile>(path.join(dir, 'trajectory.json')),
  );
  fs.writeFileSync(file, html);
  return file;
}
