/**
 * Enter latency: the median wall time of `commands.run(['true'])` on an idle
 * base sandbox (helper spawn, identity check, setns, fork, exec, wait).
 * Run as root after a build: node dist/bench/enter.js [runs]
 */
import { Lockstep } from '../src/index.js';
import { freshHome, destroyHome } from '../test/helpers/harness.js';

const runs = Number(process.argv[2] ?? 50);
const home = freshHome('bench-enter');
const ls = await Lockstep.open({ home });
try {
  await ls.images.ensure('base');
  const sbx = await ls.create();
  for (let i = 0; i < 5; i++) await sbx.commands.run(['true']); // warm caches
  const ms: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    const r = await sbx.commands.run(['true']);
    ms.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
  }
  ms.sort((a, b) => a - b);
  const at = (q: number) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))]!.toFixed(2);
  console.log(JSON.stringify({ runs, medianMs: Number(at(0.5)), p10Ms: Number(at(0.1)), p90Ms: Number(at(0.9)) }));
} finally {
  await ls.close();
  await destroyHome(home);
}
