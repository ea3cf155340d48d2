/**
 * What the benchmark prints and writes: the measurement model, the aligned
 * markdown tables, the JSON file, progress on stderr, and the attribution of
 * a CRIU dump's time to its steps from the timestamps of its own log.
 */
import fs from 'node:fs';
import path from 'node:path';
import { summarize, type Summary } from './stats.js';

/** One measured operation: raw samples in ms, their summary, optional per-phase breakdown. */
export interface Measurement {
  /** Stable key, e.g. "a.lockstep.checkpoint"; the JSON and the targets refer to it. */
  key: string;
  workload: string;
  system: string;
  operation: string;
  samples: number[];
  summary: Summary;
  /** Per-phase samples (one record per iteration), e.g. Lockstep's returned timings. */
  phaseSamples?: Record<string, number>[];
  phases?: Record<string, Summary>;
  /** Why there is no number (e.g. the operation fails on this host), with what was tried. */
  unavailable?: string;
  note?: string;
}

export function measurement(
  key: string,
  workload: string,
  system: string,
  operation: string,
  samples: number[],
  extra: { phaseSamples?: Record<string, number>[]; note?: string } = {},
): Measurement {
  const m: Measurement = { key, workload, system, operation, samples, summary: summarize(samples) };
  if (extra.phaseSamples?.length) {
    m.phaseSamples = extra.phaseSamples;
    const keys = new Set(extra.phaseSamples.flatMap((r) => Object.keys(r)));
    m.phases = Object.fromEntries(
      [...keys].map((k) => [k, summarize(extra.phaseSamples!.map((r) => r[k]!).filter((v) => typeof v === 'number'))]),
    );
  }
  if (extra.note) m.note = extra.note;
  return m;
}

export function unavailable(
  key: string,
  workload: string,
  system: string,
  operation: string,
  reason: string,
): Measurement {
  return { key, workload, system, operation, samples: [], summary: summarize([]), unavailable: reason };
}

/** A target of the issue, evaluated against measurements. */
export interface TargetResult {
  /** Which row of the table the verdict is printed on. */
  key: string;
  target: string;
  measured: string;
  pass: boolean | null;
}

/* ------------------------------------------------------------------ */
/* CRIU log attribution                                                */
/* ------------------------------------------------------------------ */

/** The brief's four buckets, plus set-up and what is outside CRIU's log. */
export type CriuGroup =
  'setup' | 'seizing/freezing' | 'parasite/memory dump' | 'mount/namespace dump' | 'writing images' | 'outside the log';

interface Rule {
  re: RegExp;
  name: string;
  group: CriuGroup;
}

/*
 * A timestamped line that matches a rule starts that step; the time until
 * the next timestamped line is charged to the current step. Lines of the
 * parasite ("pie: ...") carry no timestamp and are skipped. Order matters:
 * the first matching rule wins.
 */
const RULES: Rule[] = [
  { re: /Dumping processes \(pid/, name: 'pre-dump set-up (options, irmap, cgroup props)', group: 'setup' },
  {
    re: /freezing cgroup|freezer\.state|SEIZE |Seized task|Collected \(|Collected \d+ in/,
    name: 'freeze cgroup + seize tasks',
    group: 'seizing/freezing',
  },
  { re: /Will take .* namespace|Add \w+ ns \d+ pid/, name: 'collect namespaces', group: 'mount/namespace dump' },
  { re: /net: Lock network|network-lock/, name: 'network lock (skip)', group: 'seizing/freezing' },
  { re: /mnt: Dumping mountpoints/, name: 'mountpoints image', group: 'mount/namespace dump' },
  { re: /^\ttype |mnt: /, name: 'collect mount tree', group: 'mount/namespace dump' },
  {
    re: /net: Collecting netns|Switching to .* net for collecting sockets|sockets: |unix: |netlink: |Collecting pidns/,
    name: 'collect sockets (netns)',
    group: 'mount/namespace dump',
  },
  {
    re: /Dumping task \(pid|Collecting mappings|Collecting fds|Obtaining task stat|Dump (private|shared) signals|Dump rseq/,
    name: 'task info: vmas, fds, signals',
    group: 'parasite/memory dump',
  },
  {
    re: /Parasite syscall_ip|parasite blob|Putting tsock|Wait for parasite|switched to daemon mode|general registers|GP\/FPU|vdso: /,
    name: 'parasite infection',
    group: 'parasite/memory dump',
  },
  { re: /Dumping opened files/, name: 'open files', group: 'parasite/memory dump' },
  { re: /Transferring pages/, name: 'memory: pages written', group: 'parasite/memory dump' },
  { re: /Dumping pages \(type|Private vmas/, name: 'memory: pagemap scan', group: 'parasite/memory dump' },
  {
    re: /Dumping core \(pid|Obtaining personality|Dumping mm \(pid|Obtaining task auvx|Dumping task cwd|Waiting for \d+ to trap|was trapped|was stopped/,
    name: 'core, mm, parasite cure',
    group: 'parasite/memory dump',
  },
  { re: /Dumping file-locks|Dumping pstree|Process: \d/, name: 'pstree, file locks images', group: 'writing images' },
  { re: /cg: Dumping \d+ sets|cg: Writing CG image|cg:\s+`- Dumping /, name: 'cgroup image', group: 'writing images' },
  {
    re: /Writing image inventory|Running post-dump|net: Unlock network|Writing stats|Dumping finished/,
    name: 'inventory, stats images',
    group: 'writing images',
  },
  { re: /Unfreezing tasks|Unseizing/, name: 'unseize + thaw', group: 'seizing/freezing' },
];

const NS_START = /Dumping \d+\(\d+\)'s namespaces/;
const NS_END = /Namespaces dump complete/;
const CONNTRACK = /net: Dumping netns links/;

export interface CriuStep {
  name: string;
  group: CriuGroup;
  ms: number;
}

export interface CriuLogAttribution {
  /** Last timestamp of the log: CRIU's own view of the dump's length. */
  logMs: number;
  /** The caller's measured time for the same call (RPC, or the whole CLI invocation). */
  wallMs?: number;
  steps: CriuStep[];
  groups: Record<string, number>;
  pagesWritten: number;
  /** MB/s over the "pages written" step. */
  pageWriteMBps: number | null;
  logLevel: number;
  /** How many dumps this is the per-step median of. */
  runs: number;
}

/**
 * Splits a CRIU dump log (written at log level 4) into steps. Inside the
 * namespace dump CRIU runs one forked helper per namespace type at once, so
 * lines of several helpers interleave; there the time from each
 * "net: Dumping netns links" line (printed before each netfilter conntrack
 * dump, which walks the kernel's whole conntrack hash table even for an
 * empty namespace) to the next such line or the end of the namespace dump is
 * charged to the conntrack dumps, the rest to the other namespaces.
 */
export function attributeCriuDumpLog(text: string, wallMs?: number): CriuLogAttribution {
  const steps = new Map<string, CriuStep>();
  const charge = (name: string, group: CriuGroup, ms: number) => {
    const s = steps.get(name) ?? { name, group, ms: 0 };
    s.ms += ms;
    steps.set(name, s);
  };
  let current: Rule = { re: /$^/, name: 'start-up: kernel feature probe (kdat), options', group: 'setup' };
  let inNs = false;
  // Until "Dumping processes" CRIU is starting up (probing the kernel, or
  // loading the probe's cache): no step rule applies there.
  let started = false;
  let last: number | null = null;
  let pages = 0;
  let pagesMs = 0;
  for (const line of text.split('\n')) {
    const m = /^\((\d+)\.(\d+)\) (.*)$/.exec(line);
    if (!m) continue;
    const t = Number(m[1]) * 1000 + Number(`0.${m[2]}`) * 1000;
    const msg = m[3]!;
    if (last !== null) {
      charge(current.name, current.group, t - last);
      if (current.name === 'memory: pages written') pagesMs += t - last;
    }
    last = t;
    // CRIU 4.1 logs "p 0xADDR [NPAGES]", 4.2 logs "p 0xSTART - 0xEND".
    const pm = /page-xfer: \s*p 0x[0-9a-f]+ \[(\d+)\]/.exec(msg);
    if (pm) pages += Number(pm[1]);
    const pr = /page-xfer: \s*p 0x([0-9a-f]+) - 0x([0-9a-f]+)/.exec(msg);
    if (pr) pages += Number((BigInt(`0x${pr[2]}`) - BigInt(`0x${pr[1]}`)) / 4096n);
    if (NS_START.test(msg)) {
      inNs = true;
      current = {
        re: NS_START,
        name: 'namespaces: ipc, uts, time, pid (forked helpers)',
        group: 'mount/namespace dump',
      };
      continue;
    }
    if (inNs) {
      if (NS_END.test(msg)) inNs = false;
      else {
        if (CONNTRACK.test(msg))
          current = {
            re: CONNTRACK,
            name: 'namespaces: net, 2 netfilter conntrack dumps',
            group: 'mount/namespace dump',
          };
        continue;
      }
    }
    if (!started && !RULES[0]!.re.test(msg)) continue;
    started = true;
    const rule = RULES.find((r) => r.re.test(msg));
    if (rule) current = rule;
  }
  const list = [...steps.values()].sort((a, b) => b.ms - a.ms);
  const logMs = last ?? 0;
  if (wallMs !== undefined && wallMs > logMs)
    list.push({
      name: "outside CRIU's log (RPC/exec, process start and exit)",
      group: 'outside the log',
      ms: wallMs - logMs,
    });
  list.sort((a, b) => b.ms - a.ms);
  const groups: Record<string, number> = {};
  for (const s of list) groups[s.group] = (groups[s.group] ?? 0) + s.ms;
  const out: CriuLogAttribution = {
    logMs,
    steps: list,
    groups,
    pagesWritten: pages,
    pageWriteMBps: pagesMs > 0 ? (pages * 4096) / 1e6 / (pagesMs / 1000) : null,
    logLevel: 4,
    runs: 1,
  };
  if (wallMs !== undefined) out.wallMs = wallMs;
  return out;
}

const median = (xs: number[]) => summarize(xs).p50;

/**
 * Per-step medians over several dumps: one dump on a busy machine can spend
 * half a second in a step that normally takes 2 ms (a descheduled parasite).
 */
export function medianAttribution(list: CriuLogAttribution[]): CriuLogAttribution {
  if (list.length === 1) return list[0]!;
  const names = new Map<string, CriuStep>();
  for (const a of list) for (const s of a.steps) names.set(s.name, { name: s.name, group: s.group, ms: 0 });
  const steps = [...names.values()]
    .map((s) => ({ ...s, ms: median(list.map((a) => a.steps.find((x) => x.name === s.name)?.ms ?? 0)) }))
    .sort((a, b) => b.ms - a.ms);
  const groups: Record<string, number> = {};
  for (const s of steps) groups[s.group] = (groups[s.group] ?? 0) + s.ms;
  const walls = list.map((a) => a.wallMs).filter((w): w is number => w !== undefined);
  const rates = list.map((a) => a.pageWriteMBps).filter((r): r is number => r !== null);
  const out: CriuLogAttribution = {
    logMs: median(list.map((a) => a.logMs)),
    steps,
    groups,
    pagesWritten: median(list.map((a) => a.pagesWritten)),
    pageWriteMBps: rates.length ? median(rates) : null,
    logLevel: 4,
    runs: list.length,
  };
  if (walls.length) out.wallMs = median(walls);
  return out;
}

/* ------------------------------------------------------------------ */
/* Tables                                                              */
/* ------------------------------------------------------------------ */

export type Align = 'l' | 'r';

/** A markdown table whose columns line up in a terminal too. */
export function markdownTable(headers: string[], rows: string[][], align: Align[] = []): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const cell = (s: string, i: number) => (align[i] === 'r' ? s.padStart(widths[i]!) : s.padEnd(widths[i]!));
  const line = (cells: string[]) => `| ${cells.map((c, i) => cell(c, i)).join(' | ')} |`;
  const sep = `|${widths.map((w, i) => (align[i] === 'r' ? `${'-'.repeat(w + 1)}:` : `${'-'.repeat(w + 2)}`)).join('|')}|`;
  return [line(headers), sep, ...rows.map((r) => line(headers.map((_, i) => r[i] ?? '')))].join('\n');
}

export const fmtMs = (v: number | null | undefined): string => {
  if (v === null || v === undefined || !Number.isFinite(v)) return '—';
  if (v >= 1000) return v.toFixed(0);
  if (v >= 100) return v.toFixed(1);
  return v.toFixed(2);
};

export const fmtRatio = (v: number): string => (Number.isFinite(v) ? `${v.toFixed(2)}×` : '—');

/** Everything one run produced. */
export interface BenchResults {
  startedAt: string;
  finishedAt: string;
  durationS: number;
  host: Record<string, unknown>;
  options: { iterations: number; warmup: number; quick: boolean; only: string[] };
  measurements: Measurement[];
  /** Derived rows: ratios between two measurements (workload c). */
  ratios: { key: string; workload: string; system: string; operation: string; value: number; of: [string, string] }[];
  targets: TargetResult[];
  criu: Record<string, CriuLogAttribution>;
  notes: string[];
  analysis: string[];
  /** Small side measurements that explain a number (e.g. the CRIU service check before each call). */
  diagnostics: Record<string, Summary>;
}

/** Long hex digests in engine messages, shortened for the table (the JSON keeps them whole). */
const shortDigests = (s: string) => s.replace(/\b([0-9a-f]{12})[0-9a-f]{20,}\b/g, '$1…');

/** The main table: one row per measurement and per ratio, with the verdicts; long explanations go last. */
export function resultsTable(r: BenchResults): string {
  const byKey = new Map(r.measurements.map((m) => [m.key, m]));
  const targetOf = new Map(r.targets.map((t) => [t.key, t]));
  const lockstepOf = (m: { key: string }) => {
    // "a.criu-cli.checkpoint:dump"; the sweep's keys carry the size too: "e.64m.criu-cli.checkpoint:dump".
    const parts = m.key.split('.');
    const at = parts[0] === 'e' ? 2 : 1;
    const opName = parts
      .slice(at + 1)
      .join('.')
      .split(':')[0];
    return byKey.get(`${parts.slice(0, at).join('.')}.lockstep.${opName}`);
  };
  const verdict = (t: TargetResult | undefined) => (t ? (t.pass === null ? 'n/a' : t.pass ? 'PASS' : 'MISS') : '');
  const rows: string[][] = [];
  for (const wl of ['a', 'n', 'b', 'c', 'd', 'e']) {
    for (const m of r.measurements.filter((x) => x.key.startsWith(`${wl}.`))) {
      const t = targetOf.get(m.key);
      const ref = m.system === 'Lockstep' ? undefined : lockstepOf(m);
      const vs = ref && !m.unavailable && ref.summary.n && m.summary.n ? fmtRatio(m.summary.p50 / ref.summary.p50) : '';
      const na = !!m.unavailable || m.summary.n === 0;
      rows.push([
        m.workload,
        m.system,
        m.operation,
        na ? '—' : String(m.summary.n),
        na ? 'n/a' : fmtMs(m.summary.p50),
        na ? '' : fmtMs(m.summary.p95),
        vs,
        t ? t.target : '',
        verdict(t),
        shortDigests(m.unavailable ?? m.note ?? ''),
      ]);
    }
    for (const x of r.ratios.filter((y) => y.key.startsWith(`${wl}.`))) {
      const t = targetOf.get(x.key);
      rows.push([x.workload, x.system, x.operation, '', fmtRatio(x.value), '', '', t ? t.target : '', verdict(t), '']);
    }
  }
  return markdownTable(
    ['Workload', 'System', 'Operation', 'n', 'p50 ms', 'p95 ms', 'p50 vs Lockstep', 'Target', 'Result', 'Note'],
    rows,
    ['l', 'l', 'l', 'r', 'r', 'r', 'r', 'l', 'l', 'l'],
  );
}

/** p50 of each phase Lockstep (or the CLI peer) reports, per operation. */
export function phasesTable(r: BenchResults): string {
  const rows: string[][] = [];
  for (const m of r.measurements) {
    if (!m.phases) continue;
    const parts = Object.entries(m.phases)
      .filter(([k]) => k !== 'totalMs')
      .map(([k, s]) => `${k.replace(/Ms$/, '')} ${fmtMs(s.p50)}`);
    const total = m.phases.totalMs ? fmtMs(m.phases.totalMs.p50) : '';
    rows.push([m.workload, m.system, m.operation, fmtMs(m.summary.p50), total, parts.join(' · ')]);
  }
  return markdownTable(['Workload', 'System', 'Operation', 'wall p50', 'lib total p50', 'phase p50s (ms)'], rows, [
    'l',
    'l',
    'l',
    'r',
    'r',
    'l',
  ]);
}

/** Top contributors of one CRIU dump, from its log. */
export function criuTable(title: string, a: CriuLogAttribution, top = 5): string {
  const base = a.wallMs ?? a.logMs;
  const rows = a.steps
    .slice(0, top)
    .map((s, i) => [String(i + 1), s.name, s.group, fmtMs(s.ms), `${((100 * s.ms) / base).toFixed(0)}%`]);
  const pages = a.pagesWritten
    ? `; ${a.pagesWritten} pages (${((a.pagesWritten * 4096) / 2 ** 20).toFixed(1)} MiB) written${a.pageWriteMBps ? ` at ${a.pageWriteMBps.toFixed(0)} MB/s` : ''}`
    : '';
  const runs = a.runs > 1 ? ` (medians of ${a.runs} dumps)` : '';
  const head = `${title}${runs} — log ${fmtMs(a.logMs)} ms${a.wallMs !== undefined ? `, call ${fmtMs(a.wallMs)} ms` : ''}${pages}`;
  return `${head}\n${markdownTable(['#', 'step (from dump.log timestamps)', 'bucket', 'ms', 'share'], rows, ['r', 'l', 'l', 'r', 'r'])}`;
}

export function renderReport(r: BenchResults): string {
  const out: string[] = [];
  out.push(`# Lockstep benchmark — ${r.startedAt}`);
  out.push('');
  const load = (k: string) => (Array.isArray(r.host[k]) ? (r.host[k] as number[])[0]!.toFixed(1) : '?');
  out.push(
    `${r.options.iterations} iterations per operation unless n says otherwise (${r.options.warmup} warm-up iterations discarded); ${String(r.host.cpus)} CPUs, kernel ${String(r.host.kernel)}, ${String(r.host.criu)}; run took ${r.durationS.toFixed(0)} s; 1-min load average ${load('loadAvgStart')} at start, ${load('loadAvgEnd')} at end (anything above ~0.5 is other work sharing the CPUs).`,
  );
  out.push('');
  out.push(resultsTable(r));
  out.push('');
  out.push('## Where the time goes (p50 of each phase; phase p50s do not add up to the total p50)');
  out.push('');
  out.push(phasesTable(r));
  for (const [title, a] of Object.entries(r.criu)) {
    out.push('');
    out.push(criuTable(title, a));
  }
  if (r.analysis.length) {
    out.push('');
    out.push('## Misses: what dominates');
    out.push('');
    for (const a of r.analysis) out.push(`- ${a}`);
  }
  if (r.notes.length) {
    out.push('');
    out.push('## Notes');
    out.push('');
    for (const n of r.notes) out.push(`- ${n}`);
  }
  return out.join('\n');
}

/** Writes bench/results/<ISO date>.json and latest.json; returns the dated path. */
export function writeResults(dir: string, r: BenchResults): string {
  fs.mkdirSync(dir, { recursive: true });
  // ISO 8601 with the colons replaced: portable file names that still sort by time.
  const file = path.join(dir, `${r.startedAt.replace(/:/g, '-')}.json`);
  const text = JSON.stringify(r, null, 2) + '\n';
  fs.writeFileSync(file, text);
  fs.writeFileSync(path.join(dir, 'latest.json'), text);
  return file;
}

/* ------------------------------------------------------------------ */
/* Progress                                                            */
/* ------------------------------------------------------------------ */

/** Progress on stderr: one line per step, updated in place on a terminal. */
export class Progress {
  private readonly tty = process.stderr.isTTY === true;
  private readonly t0 = performance.now();
  private open = false;

  private stamp(): string {
    return `${((performance.now() - this.t0) / 1000).toFixed(0).padStart(4)}s`;
  }

  /** A message on its own line. */
  note(msg: string): void {
    this.end();
    process.stderr.write(`[bench ${this.stamp()}] ${msg}\n`);
  }

  /** Iteration i (1-based) of n of a step. */
  step(label: string, i: number, n: number): void {
    if (this.tty) {
      process.stderr.write(`\r\x1b[K[bench ${this.stamp()}] ${label} ${i}/${n}`);
      this.open = true;
      if (i === n) this.end();
    } else if (i === n || i === 1 || i % 10 === 0) {
      process.stderr.write(`[bench ${this.stamp()}] ${label} ${i}/${n}\n`);
    }
  }

  end(): void {
    if (this.open) process.stderr.write('\n');
    this.open = false;
  }
}
