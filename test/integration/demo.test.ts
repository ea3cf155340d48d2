import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { Lockstep } from '../../src/index.js';
import { destroyHome, freshHome, integration } from '../helpers/harness.js';

const DEMO = fileURLToPath(new URL('../../demo/demo.js', import.meta.url));

function runDemo(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [DEMO, ...args],
      { env: { ...process.env, CI: 'true' }, timeout: 100_000, maxBuffer: 8 << 20 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

integration(test, () => {
  test('npm run demo plays the seed scenario on a real sandbox and writes the HTML report', async (t) => {
    const home = freshHome('demo');
    const html = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-demo-')), 'report.html');
    t.teardown(async () => {
      fs.rmSync(path.dirname(html), { recursive: true, force: true });
      await destroyHome(home);
    });

    const r = await runDemo(['--home', home, '--html', html]);
    t.is(r.code, 0, `demo failed:\n${r.stderr}\n${r.stdout.slice(-3000)}`);
    const out = r.stdout;

    // No colour under CI.
    t.false(out.includes('\x1b['), 'stdout has ANSI escapes although CI=true');

    // Twelve steps, a failure at 11, a rollback to 6.
    t.regex(out, /✗\s+11\s+run sh bin\/publish\.sh\s+HTTP 429/);
    t.regex(out, /Rolled back to step 6 \(ckpt_[a-z0-9]+\) from step 12 \(ckpt_[a-z0-9]+\)/);

    // The world went back: the file is gone and the worker's memory is its step-6 memory.
    t.regex(out, /config\.json\s+gone/);
    t.regex(out, /after\s+worker pid \d+, tick \d+: no config loaded/);

    // The step-7 and step-9 observations are reported stale with their tool-call ids; step 8's e-mail is surfaced.
    t.regex(out, /✗ stale\s+toolu_07\s+file-write\s+\/workspace\/config\.json/);
    t.regex(out, /✗ stale\s+toolu_09\s+file-read\s+\/workspace\/config\.json/);
    t.regex(out, /warning: email\.send \(eff_[0-9a-f]+\) happened and cannot be taken back/);

    // The retry succeeds, and the e-mail was replayed from the ledger rather than sent twice.
    t.regex(out, /11'\s+run sh bin\/publish\.sh\s+published 5000 records in 10 batches/);
    t.regex(out, /8'\s+send_email qa@example\.com\s+replayed/);
    t.true(out.includes('email delivered 1 time(s)'));

    // The HTML report is one self-contained page that names every checkpoint.
    const ids = [...new Set(out.match(/ckpt_[a-z0-9]+/g) ?? [])];
    t.is(ids.length, 18, 'expected 12 checkpoints in attempt 1 and 6 in the retry');
    const page = fs.readFileSync(html, 'utf8');
    for (const id of ids) t.true(page.includes(id), `HTML report lacks checkpoint ${id}`);
    t.false(/<script|<link|(src|href)=["']?https?:/i.test(page), 'HTML report loads something from elsewhere');

    // The demo removed the sandbox it created.
    const ls = await Lockstep.open({ home });
    try {
      t.deepEqual(ls.list(), []);
    } finally {
      await ls.close();
    }
  });
});
