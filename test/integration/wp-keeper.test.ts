/**
 * The written-page keeper (native/criu/wp-keeper.c), driven over its socket
 * by test/fixtures/wp-keeper-entries.py as CRIU drives it: it hands each
 * process's fd back with the tag of the dump that armed it, once (the tag is
 * cleared by the taking); it refuses a PUT for a process that does not exist
 * and answers NONE for a start time that is not the process's (a reused
 * pid); and it drops the entries of processes that are gone, a second later
 * at the most, though it no longer reads /proc on every request (one
 * sandbox's many processes made every other sandbox's checkpoints wait).
 */
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import test from 'ava';
import { DEFAULTS } from '../../src/config.js';
import { projectRoot } from '../../src/native/binding.js';
import { integration } from '../helpers/harness.js';

const run = promisify(execFile);
const N = 40;

integration(test, () => {
  test('entries are handed back once, matched on pid and start time, and dropped when their process is gone', async (t) => {
    const { stdout } = await run(
      'python3',
      [path.join(projectRoot, 'test/fixtures/wp-keeper-entries.py'), DEFAULTS.wpKeeper, String(N)],
      { timeout: 120_000 },
    );
    const seen = JSON.parse(stdout) as {
      puts: string[];
      count: string;
      takes: [string, number][];
      retake: [string, number];
      wrongStart: string;
      putDead: string;
      countAfterKill: string;
    };
    t.deepEqual(new Set(seen.puts), new Set(['OK']));
    t.is(seen.count, `OK ${N}`);
    t.deepEqual(seen.takes, [
      ['OK /ck|0', 1],
      ['OK /ck|1', 1],
      ['OK /ck|2', 1],
    ]);
    t.deepEqual(seen.retake, ['OK ', 1], 'a second TAKE gets the fd with no tag: no dump can build on it');
    t.is(seen.wrongStart, 'NONE');
    t.is(seen.putDead, 'ERR no such process');
    t.is(seen.countAfterKill, `OK ${N / 2}`, 'the killed half is dropped');
  });
});
