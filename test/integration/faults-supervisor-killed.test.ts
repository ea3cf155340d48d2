/**
 * Fault: the supervisor (`lockstep-helper supervise`) killed with SIGKILL
 * (issue 9 §4). The sandboxes it started keep running (same init, counter
 * advancing); the manager, at its next request that needs a supervisor,
 * finds nobody listening, starts a new one and asks again: commands, a new
 * sandbox, checkpoint and a CRIU rollback all work, with exact output.
 */
import fs from 'node:fs';
import test from 'ava';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { sameProcessAlive } from '../fixtures/host-state.js';
import { counterValue, startCounter, waitCounter } from '../fixtures/stub-workloads.js';

integration(test, () => {
  test.serial(
    'sandboxes survive a killed supervisor, and the manager starts a new one at its next request',
    async (t) => {
      const ls = await openTestLockstep(t, { images: ['base'] });
      const sb = await ls.create({ image: 'base' });
      await startCounter(sb, ls);
      await sb.files.write('/workspace/f', 'before the kill\n');
      const row = ls.engine.catalog.sandbox(sb.id)!;
      const pidfile = ls.engine.paths.supervisorPidfile;
      const supervisor = Number(fs.readFileSync(pidfile, 'utf8').trim());
      t.true(sameProcessAlive(supervisor, undefined));

      process.kill(supervisor, 'SIGKILL');
      // Gone (a zombie until its parent, the host's init or a test runner, reaps it).
      for (let i = 0; i < 400 && sameProcessAlive(supervisor, undefined); i++)
        await new Promise((r) => setTimeout(r, 10));
      t.false(sameProcessAlive(supervisor, undefined), 'the supervisor is dead');

      // The sandbox did not notice.
      t.true(sameProcessAlive(row.init_pid!, row.init_start), 'the same init runs');
      const now = await counterValue(ls, sb.id);
      await waitCounter(ls, sb.id, (v) => v > now);
      t.like(await sb.commands.run('cat /workspace/f; echo out; echo err >&2'), {
        exitCode: 0,
        stdout: 'before the kill\nout\n',
        stderr: 'err\n',
      });

      // A new sandbox needs the supervisor: a new one is started for it.
      const fresh = await ls.create({ image: 'base' });
      const replacement = Number(fs.readFileSync(pidfile, 'utf8').trim());
      t.not(replacement, supervisor);
      t.true(sameProcessAlive(replacement, undefined), 'a new supervisor runs');
      t.like(await fresh.commands.run(['echo', 'hello from a new sandbox']), {
        exitCode: 0,
        stdout: 'hello from a new sandbox\n',
        stderr: '',
      });

      // Checkpoint and a CRIU rollback of the old sandbox work.
      const ckpt = await sb.checkpoint({ label: 'after the kill' });
      await sb.settled();
      await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      await sb.files.write('/workspace/f', 'changed\n');
      t.like(await sb.rollback(ckpt.id), { path: 'restore' });
      t.is((await sb.commands.run('cat /workspace/f')).stdout, 'before the kill\n');
      const restored = await counterValue(ls, sb.id);
      await waitCounter(ls, sb.id, (v) => v > restored);
    },
  );
});
