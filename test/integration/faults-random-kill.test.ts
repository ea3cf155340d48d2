/**
 * Fault: the manager killed with SIGKILL at random moments of a load run,
 * each kill followed by a reopen (issue 9 §4; Jepsen-style). A child process
 * (test/fixtures/kill-load-runner.mjs) marks, checkpoints, rolls back and
 * runs ledger effects on three sandboxes, printing each operation as it
 * begins and ends; the test kills it after a seeded random delay, reopens
 * the state directory (the reaper runs) and checks, for every sandbox,
 * that its processes and files are together exactly at a state the model
 * allows: the state before the operation in flight, or its outcome (the
 * checkpoint's state for a rollback; for a mark, the new tag in memory with
 * the old or the new file). A tag lives only in a process's memory, so it
 * comes from the processes, the file from the layer. Then: no journal
 * entry left, the counter advancing, and no effect run twice (the effects'
 * bodies append to a host file; retried keys must be replayed or refused).
 *
 * LOCKSTEP_KILL_CYCLES sets the number of kills (100 by default, as in CI);
 * LOCKSTEP_KILL_SEED replays a schedule (the seed is printed).
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { Lockstep } from '../../src/index.js';
import { integration, openTestLockstep, sleep } from '../helpers/harness.js';
import {
  hostPath,
  counterValue,
  setTag,
  startCounter,
  startMemo,
  tagInMemory,
  waitCounter,
} from '../fixtures/stub-workloads.js';
import { RunnerProcess } from '../fixtures/runner-process.js';

const RUNNER = fileURLToPath(new URL('../../../test/fixtures/kill-load-runner.mjs', import.meta.url));
const CYCLES = Number(process.env.LOCKSTEP_KILL_CYCLES ?? 100);
const SEED = Number(process.env.LOCKSTEP_KILL_SEED ?? Math.floor(Math.random() * 2 ** 31));

/** [tag in memory, /workspace/gen] */
type State = readonly [string, string];
type Line = {
  ready?: true;
  begin?: string;
  done?: string;
  unknown?: string;
  sb?: string;
  tag?: string;
  ckpt?: string;
  to?: string;
  key?: string;
};

function mulberry32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

integration(test, () => {
  test.serial(
    `${CYCLES} random kill -9s of the manager under load leave every sandbox at a state the model allows, and no effect run twice`,
    async (t) => {
      t.timeout(Math.max(10 * 60_000, CYCLES * 30_000));
      t.log(`seed ${SEED} (LOCKSTEP_KILL_SEED=${SEED} replays it), ${CYCLES} kills`);
      const random = mulberry32(SEED);
      let ls = await openTestLockstep(t, { images: ['base'] });
      const home = ls.home;
      const effectLog = path.join(home, 'effects-run.log');
      fs.writeFileSync(effectLog, '');

      // The model: each sandbox's live state, and each checkpoint's.
      const live = new Map<string, State>();
      const atCheckpoint = new Map<string, State>();
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        const sb = await ls.create({ image: 'base' });
        await startCounter(sb, ls);
        await startMemo(sb, ls);
        await setTag(ls, sb.id, 'init');
        await sb.files.write('/workspace/gen', 'init');
        const c = await sb.checkpoint({ label: 'init' });
        await sb.settled();
        live.set(sb.id, ['init', 'init']);
        atCheckpoint.set(c.id, ['init', 'init']);
        ids.push(sb.id);
      }
      await ls.close();
      // A test that ends early (a failed assertion, its timeout) leaves no runner behind.
      let current: RunnerProcess | undefined;
      t.teardown(() => current?.abandonGroup());

      let nextEffect = 0;
      let retry: string[] = [];
      const stats = { begun: new Map<string, number>(), interrupted: new Map<string, number>() };
      for (let cycle = 0; cycle < CYCLES; cycle++) {
        const delay = 50 + Math.floor(random() * 1500);
        const runner = new RunnerProcess(RUNNER, [
          home,
          String(SEED + cycle),
          effectLog,
          String(nextEffect),
          retry.length ? retry.join(',') : '-',
          ...ids,
        ]);
        current = runner;
        // Kill only once it is past open (the reaper's own crash safety has its own test).
        await runner.waitFor('"ready"', 60_000);
        await sleep(delay);
        runner.kill();
        const exit = await runner.ended(`cycle ${cycle} (seed ${SEED})`);
        const out = runner.out;
        t.is(
          exit.signal,
          'SIGKILL',
          `cycle ${cycle}: the runner died by the kill, not on its own (exit ${exit.code}): ${runner.err.slice(-3000)}`,
        );
        if (exit.signal !== 'SIGKILL') return;

        // Replay what completed; keep what was in flight per sandbox.
        const inFlight = new Map<string, Line>();
        retry = [];
        for (const text of out.split('\n')) {
          if (!text.endsWith('}')) continue; // a line cut by the kill carries nothing
          const line = JSON.parse(text) as Line;
          if (line.begin) {
            inFlight.set(line.sb!, line);
            stats.begun.set(line.begin, (stats.begun.get(line.begin) ?? 0) + 1);
            if (line.begin === 'effect') nextEffect = Math.max(nextEffect, Number(line.key!.split(':')[1]) + 1);
          }
          if (line.done || line.unknown) inFlight.delete(line.sb!);
          if (line.done === 'mark') live.set(line.sb!, [line.tag!, line.tag!]);
          if (line.done === 'checkpoint') atCheckpoint.set(line.ckpt!, live.get(line.sb!)!);
          if (line.done === 'rollback') live.set(line.sb!, atCheckpoint.get(line.to!)!);
        }

        ls = await Lockstep.open({ home });
        try {
          t.deepEqual(ls.engine.catalog.operations(), [], `cycle ${cycle}: no journal entry left after the reaper`);
          for (const id of ids) {
            const flight = inFlight.get(id);
            const before = live.get(id)!;
            const allowed: State[] = [before];
            if (flight?.begin === 'rollback') allowed.push(atCheckpoint.get(flight.to!)!);
            if (flight?.begin === 'mark') allowed.push([flight.tag!, before[1]], [flight.tag!, flight.tag!]);
            if (flight) stats.interrupted.set(flight.begin!, (stats.interrupted.get(flight.begin!) ?? 0) + 1);
            // A checkpoint that committed but was not reported holds the state it was taken in.
            for (const c of ls.engine.catalog.checkpointsOf(id))
              if (!atCheckpoint.has(c.id)) atCheckpoint.set(c.id, before);

            const row = ls.engine.catalog.sandbox(id)!;
            t.is(row.state, 'running', `cycle ${cycle}: ${id} runs (in flight: ${JSON.stringify(flight)})`);
            const where = `cycle ${cycle} (seed ${SEED}): ${id} (in flight: ${JSON.stringify(flight)}; reaped ${JSON.stringify(ls.reaped)})`;
            const memory = await tagInMemory(ls, id).catch((e: Error) => {
              const frozen = ls.engine.cgroups.isFrozen(ls.engine.runtime.cgroupName(row.instance));
              const pids = ls.engine.cgroups.pids(ls.engine.runtime.cgroupName(row.instance));
              throw new Error(
                `${where}: its memo process does not answer (frozen: ${frozen}, tasks: ${pids.join(' ')}): ${e.message}`,
              );
            });
            const seen: State = [memory, fs.readFileSync(hostPath(ls, id, '/workspace/gen'), 'utf8')];
            const ok = allowed.some((a) => a[0] === seen[0] && a[1] === seen[1]);
            t.true(
              ok,
              `cycle ${cycle} (seed ${SEED}): ${id} is at ${JSON.stringify(seen)}; allowed ${JSON.stringify(allowed)} (in flight: ${JSON.stringify(flight)})`,
            );
            if (!ok) return;
            live.set(id, seen);
            const now = await counterValue(ls, id);
            await waitCounter(ls, id, (v) => v > now);
            if (flight?.begin === 'effect') retry.push(flight.key!);
          }

          // No effect ran twice; every committed one ran exactly once.
          const ran = fs.readFileSync(effectLog, 'utf8').split('\n').filter(Boolean);
          t.is(
            new Set(ran).size,
            ran.length,
            `cycle ${cycle}: an effect ran twice: ${ran.filter((k, i) => ran.indexOf(k) !== i).join(', ')}`,
          );
          const rows = ls.engine.catalog.db
            .prepare("SELECT input, status FROM agent_effects WHERE kind = 'test.append'")
            .all() as { input: string; status: string }[];
          const recorded = rows.map((r) => ({ key: (JSON.parse(r.input) as { key: string }).key, status: r.status }));
          for (const r of recorded)
            if (r.status === 'committed') t.true(ran.includes(r.key), `committed effect ${r.key} ran`);
          for (const k of ran)
            t.true(
              recorded.some((r) => r.key === k),
              `effect ${k} that ran is in the ledger`,
            );
        } finally {
          await ls.close();
        }
      }
      t.log(
        `operations begun: ${JSON.stringify(Object.fromEntries(stats.begun))}; in flight at a kill: ${JSON.stringify(Object.fromEntries(stats.interrupted))}`,
      );
    },
  );
});
