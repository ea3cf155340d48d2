/**
 * Model-based property test of recovery: random sequences of tool calls (writes, reads,
 * deletes, commands, verdicts, effects of every reversibility and outcome), checkpoints with
 * contexts, rollbacks to any checkpoint of any branch, forks, and closing and reopening the
 * manager, run against real sandboxes. Every rollback report is checked, part by part, against
 * the model in test/fixtures/recovery-model.ts; a failing sequence is shrunk to a minimal one.
 *
 * The seed is fixed under CI (or set with RECOVERY_MODEL_SEED) and random otherwise; it is
 * printed with fast-check's path whenever the property fails, so the exact run can be replayed.
 * RECOVERY_MODEL_RUNS and RECOVERY_MODEL_OPS change the budget.
 */
import test from 'ava';
import fc from 'fast-check';
import { Lockstep } from '../../src/index.js';
import { freshHome, integration, openTestLockstep } from '../helpers/harness.js';
import { describeOp, opArb, runAgainstModel, type Op } from '../fixtures/recovery-model.js';

const CI_SEED = 20261130;
const seed = process.env.RECOVERY_MODEL_SEED
  ? Number(process.env.RECOVERY_MODEL_SEED)
  : process.env.CI === 'true'
    ? CI_SEED
    : Date.now() ^ (Math.random() * 0x7fffffff);
const numRuns = Number(process.env.RECOVERY_MODEL_RUNS ?? 25);
const maxOps = Number(process.env.RECOVERY_MODEL_OPS ?? 30);

integration(test, () => {
  test.serial('every rollback report matches the model of the timelines', async (t) => {
    // Shrinking replays real sandboxes: give it time, but stop it before the run gets unbounded.
    t.timeout(30 * 60_000);
    const home = freshHome('recovery-model');
    let ls = await openTestLockstep(t, { home });
    t.teardown(() => ls.close()); // registered last, runs first: the manager a reopen left open
    t.log(`seed ${seed}, ${numRuns} runs of up to ${maxOps} operations (set RECOVERY_MODEL_SEED=${seed} to replay)`);

    let runs = 0;
    const seen = { rollbacks: 0, refusals: 0, replays: 0, forks: 0, reopens: 0 };
    const property = fc.asyncProperty(
      fc.array(opArb, { minLength: 4, maxLength: maxOps, size: 'max' }),
      async (ops: Op[]) => {
        runs++;
        const result = await runAgainstModel(ls, ops, { reopen: () => Lockstep.open({ home }), maxSandboxes: 3 });
        ls = result.lockstep;
        for (const k of Object.keys(seen) as (keyof typeof seen)[]) seen[k] += result[k];
        for (const id of [...result.sandboxIds].reverse()) await ls.remove(id).catch(() => undefined);
        if (result.mismatches.length > 0) {
          const lines = result.mismatches.map(
            (m) => `  step ${m.step} (${describeOp(ops[m.step] ?? { t: 'reopen' })}) ${m.kind}: ${m.detail}`,
          );
          throw new Error(`${result.mismatches.length} mismatch(es) with the model:\n${lines.join('\n')}`);
        }
      },
    );
    const started = Date.now();
    const out = await fc.check(property, {
      seed,
      numRuns,
      endOnFailure: false,
      interruptAfterTimeLimit: 25 * 60_000,
      markInterruptAsFailure: false,
    });
    t.log(
      `${runs} runs (shrinking included) in ${((Date.now() - started) / 1000).toFixed(0)} s: ${JSON.stringify(seen)}`,
    );
    if (out.failed) {
      // fast-check's message has the seed, the path and the shrunk sequence; the error has what differed.
      t.fail(
        `${fc.defaultReportMessage(out) ?? `property failed (seed ${out.seed}, path ${out.counterexamplePath})`}\n${String(out.errorInstance)}`,
      );
    } else t.is(out.numRuns, numRuns, `fast-check stopped early: ${fc.defaultReportMessage(out) ?? ''}`);
  });
});
