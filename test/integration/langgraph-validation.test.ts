/**
 * LangGraph's checkpointer conformance suite against LockstepSaver on real
 * sandboxes (test/conformance/langgraph.validation.ts), run with vitest, the
 * runner it is written for. Every spec must pass: a failed, skipped or
 * missing spec fails this test, and so `npm test`.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { integration } from '../helpers/harness.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const VITEST = path.join(ROOT, 'node_modules', 'vitest', 'vitest.mjs');
const CONFIG = path.join(ROOT, 'test', 'conformance', 'vitest.config.mjs');

/** What vitest's JSON reporter writes (the fields used here). */
interface VitestReport {
  numTotalTests: number;
  numPassedTests: number;
  numFailedTests: number;
  numPendingTests: number;
  numTodoTests: number;
  success: boolean;
  testResults: { assertionResults: { fullName: string; status: string; failureMessages: string[] }[] }[];
}

integration(test, () => {
  test.serial('LockstepSaver passes @langchain/langgraph-checkpoint-validation, every spec', async (t) => {
    t.timeout(1_800_000);
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-lg-validation-'));
    t.teardown(() => fs.rmSync(out, { recursive: true, force: true }));
    const report = path.join(out, 'report.json');
    const { code, output } = await new Promise<{ code: number | null; output: string }>((resolve, reject) => {
      const child = spawn(
        process.execPath,
        [VITEST, 'run', '--config', CONFIG, '--reporter=json', `--outputFile=${report}`, '--reporter=dot'],
        { cwd: ROOT, env: { ...process.env, LOCKSTEP_LOG_LEVEL: 'error' }, stdio: ['ignore', 'pipe', 'pipe'] },
      );
      let output = '';
      child.stdout.on('data', (b: Buffer) => (output += b.toString()));
      child.stderr.on('data', (b: Buffer) => (output += b.toString()));
      child.on('error', reject);
      child.on('close', (c) => resolve({ code: c, output }));
    });
    if (!fs.existsSync(report)) return t.fail(`vitest wrote no report (exit ${code}):\n${output.slice(-4000)}`);
    const r = JSON.parse(fs.readFileSync(report, 'utf8')) as VitestReport;
    const failed = r.testResults
      .flatMap((f) => f.assertionResults)
      .filter((a) => a.status !== 'passed')
      .map((a) => `${a.status}: ${a.fullName}\n  ${a.failureMessages.join('\n  ').slice(0, 600)}`);
    t.log(`${r.numPassedTests} of ${r.numTotalTests} specs passed`);
    t.deepEqual(failed, [], output.slice(-4000));
    t.is(code, 0, output.slice(-4000));
    t.is(r.numFailedTests + r.numPendingTests + r.numTodoTests, 0);
    t.is(r.numPassedTests, r.numTotalTests);
    // The suite as published defines several hundred specs; a run that found none ran nothing.
    t.true(r.numTotalTests > 500, `only ${r.numTotalTests} specs ran`);
  });
});
