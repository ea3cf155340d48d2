/**
 * Foundation figures (issue "Foundation"): sandbox create time, the round
 * trip of `exec true`, and the layer-store snapshot time with a 1 MiB and a
 * 1 GiB writable layer, next to `cp -a` of the same layer. Medians of N runs
 * (default 20). Run: node dist/bench/foundation.js [--runs N]
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { Lockstep } from '../src/index.js';

const { values } = parseArgs({ options: { runs: { type: 'string' }, home: { type: 'string' } } });
const runs = Number(values.runs ?? 20);
const home = values.home ?? `/var/tmp/lockstep-foundation-${process.pid}`;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const fmt = (ms: number) => `${ms.toFixed(2)} ms`;

async function main(): Promise<void> {
  const ls = await Lockstep.open({ home });
  try {
    await ls.images.ensure('base');
    const create: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < runs; i++) {
      const t = performance.now();
      const sb = await ls.create({ image: 'base' });
      create.push(performance.now() - t);
      ids.push(sb.id);
    }
    const sb = ls.get(ids[0]!);
    const exec: number[] = [];
    for (let i = 0; i < runs + 2; i++) {
      const t = performance.now();
      await sb.commands.run(['true']);
      if (i >= 2) exec.push(performance.now() - t); // two warm-up runs
    }
    for (const id of ids.slice(1)) await ls.remove(id);

    // Layer-store snapshots of a writable layer holding 1 MiB and 1 GiB.
    const rows: string[] = [];
    for (const [label, mib] of [
      ['1 MiB', 1],
      ['1 GiB', 1024],
    ] as const) {
      const upper = ls.engine.layers.upperDir(sb.info().id).upper;
      const dir = path.join(upper, 'workspace');
      fs.mkdirSync(dir, { recursive: true });
      fs.rmSync(path.join(dir, 'data'), { recursive: true, force: true });
      fs.mkdirSync(path.join(dir, 'data'));
      const chunk = Buffer.alloc(1024 * 1024, 7);
      for (let f = 0; f < Math.max(1, mib / 64); f++) {
        const fd = fs.openSync(path.join(dir, 'data', `f${f}`), 'w');
        for (let m = 0; m < Math.min(64, mib); m++) fs.writeSync(fd, chunk);
        fs.closeSync(fd);
      }
      await ls.engine.layers.sync();
      const snap: number[] = [];
      for (let i = 0; i < runs; i++) {
        const id = `bench_${process.pid}_${i}`;
        const t = performance.now();
        await ls.engine.layers.snapshotUpper(sb.info().id, id);
        snap.push(performance.now() - t);
        await ls.engine.layers.deleteLayer(id);
      }
      const cp: number[] = [];
      for (let i = 0; i < Math.min(runs, 5); i++) {
        const dst = path.join(ls.engine.paths.scratch, `cp-${i}`);
        const t = performance.now();
        execFileSync('cp', ['-a', '--reflink=never', upper, dst]);
        execFileSync('sync');
        cp.push(performance.now() - t);
        fs.rmSync(dst, { recursive: true, force: true });
      }
      rows.push(
        `| layer snapshot, ${label} upper | ${fmt(median(snap))} | cp -a --reflink=never + sync: ${fmt(median(cp))} |`,
      );
    }
    process.stdout.write(
      [
        `| measurement (median of ${runs}) | Lockstep | reference |`,
        '|---|---|---|',
        `| sandbox create (base image) | ${fmt(median(create))} | |`,
        `| exec of \`true\`, round trip | ${fmt(median(exec))} | |`,
        ...rows,
      ].join('\n') + '\n',
    );
  } finally {
    await ls.destroyAll({ deleteFiles: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
