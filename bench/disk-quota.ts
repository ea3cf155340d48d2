/**
 * What a disk quota costs the checkpoint path. Quotas are btrfs qgroups,
 * which are per filesystem: once on, every snapshot in the store pays for
 * them. Two state directories, one without quotas and one with
 * LOCKSTEP_DISK_QUOTA=on, each with a sandbox holding a 200 MiB workspace of
 * 2000 files; N checkpoints each (1 MiB changed between them), reporting the
 * median and p90 of the snapshot step and of the frozen window, then N
 * rollbacks through CRIU (layer reset included).
 * Run: node dist/bench/disk-quota.js [--runs N]
 */
import { parseArgs } from 'node:util';
import { Lockstep } from '../src/index.js';
import { dropStandby } from '../src/checkpoints/standby.js';
import { percentile } from './stats.js';

const { values } = parseArgs({ options: { runs: { type: 'string' } } });
const runs = Number(values.runs ?? 20);

async function measure(label: string, quota: boolean): Promise<void> {
  process.env.LOCKSTEP_DISK_QUOTA = quota ? 'on' : 'off';
  process.env.LOCKSTEP_STANDBY = 'off';
  const home = `/var/tmp/lockstep-bench-quota-${label}-${process.pid}`;
  const ls = await Lockstep.open({ home });
  try {
    await ls.images.ensure('base');
    const sb = await ls.create(quota ? { diskMb: 4096 } : {});
    await sb.commands.run(
      [
        'sh',
        '-c',
        'for d in $(seq 20); do mkdir -p /workspace/d$d; for f in $(seq 100); do head -c 102400 /dev/urandom > /workspace/d$d/f$f; done; done',
      ],
      { timeoutMs: 600_000 },
    );
    const snapshot: number[] = [];
    const frozen: number[] = [];
    const layer: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < runs; i++) {
      await sb.commands.run(['sh', '-c', `head -c 1048576 /dev/urandom > /workspace/step${i}`]);
      const c = await sb.checkpoint();
      snapshot.push(c.timings.snapshotMs!);
      frozen.push(c.timings.frozenMs!);
      ids.push(c.id);
    }
    for (let i = 0; i < Math.min(runs, 10); i++) {
      await dropStandby(ls.engine, sb.id);
      const r = await sb.rollback(ids[i]!);
      layer.push(r.timings.layerMs);
    }
    const q = (xs: number[], p: number) =>
      percentile(
        [...xs].sort((a, b) => a - b),
        p,
      ).toFixed(2);
    process.stdout.write(
      `${label.padEnd(10)} snapshot p50 ${q(snapshot, 50)} ms p90 ${q(snapshot, 90)} | frozen p50 ${q(frozen, 50)} ms p90 ${q(frozen, 90)} | rollback layer reset p50 ${q(layer, 50)} ms p90 ${q(layer, 90)}\n`,
    );
  } finally {
    await ls.destroyAll({ deleteFiles: true });
  }
}

await measure('no-quota', false);
await measure('qgroups', true);
