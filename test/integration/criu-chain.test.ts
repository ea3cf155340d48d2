/**
 * Lockstep's CRIU build (native/criu/) on its own, without the manager:
 * native/criu/test/chain-test.py dumps a chain of incremental checkpoints of
 * memload (new mappings, mremap, a forked child, MADV_DONTNEED on anonymous
 * and file-backed pages, writes by the kernel, transparent huge pages, an
 * mprotect round trip), restores every checkpoint and compares every MiB of
 * memory with what the process held at that checkpoint. The restores use
 * the provisioned stock CRIU 4.2.1: the images are CRIU's own format. Then
 * checkpoint 4 is restored with Lockstep's build, which arms the tracking in
 * the restored processes: the chain goes on from it incrementally, and those
 * checkpoints are restored and compared too.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import test from 'ava';
import { DEFAULTS } from '../../src/config.js';
import { projectRoot } from '../../src/native/binding.js';
import { integration } from '../helpers/harness.js';

const run = promisify(execFile);
const STEPS = 10;

integration(test, () => {
  test('every checkpoint of a 64 MiB mixed chain restores every byte, with stock CRIU, also after a restore armed the tracking', async (t) => {
    const work = fs.mkdtempSync(path.join(os.tmpdir(), 'criu-chain-'));
    t.teardown(() => fs.rmSync(work, { recursive: true, force: true }));
    const { stdout } = await run(
      'python3',
      [
        path.join(projectRoot, 'native/criu/test/chain-test.py'),
        ...['--criu', DEFAULTS.criuBinary, '--keeper', DEFAULTS.wpKeeper],
        ...['--restore-criu', DEFAULTS.stockCriuBinary],
        ...['--mib', '64', '--mode', 'mixed', '--steps', String(STEPS), '--log-level', '2'],
        ...['--after-restore', '4', '--after-steps', '3'],
        ...['--workdir', work],
      ],
      { timeout: 600_000, maxBuffer: 16 << 20 },
    );
    const lines = stdout
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const verified = new Set(lines.filter((l) => 'verified_ckpt' in l).map((l) => String(l.verified_ckpt)));
    for (let k = 0; k <= STEPS; k++) t.true(verified.has(`ckpt-${k}`), `checkpoint ${k} restored and compared`);
    for (let k = 1; k <= 3; k++)
      t.true(verified.has(`ar-ckpt-${k}`), `checkpoint ${k} after the restore restored and compared`);
    const after = lines.filter((l) => l.run === 'after-restore') as { incremental_tasks: number; full_tasks: number }[];
    t.is(after.length, 3);
    t.true(
      after.every((d) => d.full_tasks === 0 && d.incremental_tasks === 2),
      `every dump after the restore is incremental for both processes: ${JSON.stringify(after)}`,
    );
    const dumps = lines.filter((l) => l.run === 'patched') as { ckpt: number; pages_bytes: number }[];
    const first = dumps.find((d) => d.ckpt === 0)!.pages_bytes;
    // Checkpoint 2 forks memload's child (a new process: dumped whole once); the others store what changed.
    const later = dumps.filter((d) => d.ckpt >= 3).map((d) => d.pages_bytes);
    t.true(
      later.every((b) => b < first / 4),
      `incremental dumps store what changed: ${later.join(', ')} bytes against ${first}`,
    );
  });
});
