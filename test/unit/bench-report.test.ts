/**
 * bench/results/report.html (bench/report-html.ts): the page is made from
 * the results it is given, every number on it comes from them, and it
 * fetches nothing (readable offline).
 */
import test from 'ava';
import { renderReportHtml } from '../../bench/report-html.js';
import { measurement, type BenchResults } from '../../bench/report.js';
import { summarize } from '../../bench/stats.js';

function results(): BenchResults {
  const m = (key: string, v: number) => measurement(key, 'e', 'Lockstep', key, [v, v, v]);
  return {
    startedAt: '2026-12-05T00:00:00.000Z',
    finishedAt: '2026-12-05T00:10:00.000Z',
    durationS: 600,
    host: {},
    options: { iterations: 3, warmup: 1, quick: false, only: ['e'] },
    measurements: [
      m('e.16m.lockstep.checkpoint', 17.25),
      m('e.1024m.lockstep.checkpoint', 41.5),
      m('e.1024m.criu-cli.checkpoint:dump', 1346),
    ],
    ratios: [],
    targets: [
      { key: 'e.16m.lockstep.checkpoint', target: '≤ 15.32 ms (15 + 0.02/MiB)', measured: '17.25 ms', pass: false },
      { key: 'b.lockstep.checkpoint', target: '≥ 5× faster than criu dump CLI', measured: '6.1× faster', pass: true },
    ],
    criu: {},
    notes: [],
    analysis: [],
    diagnostics: { 'e.1024m.storedBytes': summarize([1.5 * 2 ** 20]) },
  };
}

test('the page shows the sweep curves, the trajectory shares and each target, from the results given', (t) => {
  const html = renderReportHtml(results(), {
    startedAt: '2026-12-05T01:00:00.000Z',
    linear: { byInference: { '1s': { share: 0.083, target: 0.05 }, '5s': { share: 0.019, target: 0.02 } } },
  });
  t.true(html.startsWith('<!doctype html>'));
  t.regex(html, /Lockstep \(tracked\): 41\.5 ms at 1024 MiB/);
  t.regex(html, /criu dump CLI \(stock\): 1346 ms at 1024 MiB/);
  t.regex(html, /Lockstep \(tracked\): 1\.50 MiB at 1024 MiB/);
  t.regex(html, /linear, 1s inference per step/);
  t.regex(html, /8\.3% \(goal 5%\)/);
  t.regex(html, /<rect [^>]*class="miss"/, 'the 1 s share over its goal is drawn as a miss');
  t.regex(html, /<rect [^>]*class="pass"/, 'the 5 s share under its goal as a pass');
  t.regex(html, /<tr class="miss"><td>e\.16m\.lockstep\.checkpoint<\/td>.*<td>MISS<\/td><\/tr>/);
  t.regex(html, /<tr class="pass"><td>b\.lockstep\.checkpoint<\/td>.*<td>PASS<\/td><\/tr>/);
  t.notRegex(html, /<script|https?:\/\/|<link /, 'nothing is fetched or run');
});

test('missing results say so instead of drawing empty charts', (t) => {
  const html = renderReportHtml(undefined, undefined);
  t.regex(html, /bench: no results; trajectory: no results/);
  t.regex(html, /checkpoint time against memory held .*: no numbers in these results/);
  t.regex(html, /share of a trajectory .*: no trajectory results/);
});
