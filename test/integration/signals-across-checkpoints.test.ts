/**
 * A checkpoint must not change what a signal does to a process. CRIU seizes
 * a thread that sleeps in a system call and, to run its parasite, rewinds it
 * to re-issue the call from user space; stock CRIU leaves it so. A signal
 * that arrives before the thread re-issues the call (the tree is frozen
 * until the dump ends, and a thawed thread may wait for a CPU) runs its
 * handler, and the call starts over uninterrupted: Python's time.sleep
 * never returns to run the Python-level handler, and the signal is missed
 * for as long as the sleep lasts. Lockstep's CRIU build gives the kernel
 * back its restart (native/criu, seize.c), so the call fails with EINTR
 * for the handler, or restarts by itself, exactly as without a checkpoint.
 *
 * The signals are sent at the `checkpoint:dumped` point: the dump is done
 * and the tree is still frozen, the widest form of the window.
 */
import fs from 'node:fs';
import test from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import type { FaultPoint } from '../../src/faults.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { hostPath } from '../fixtures/stub-workloads.js';

/** Counts SIGUSR1 in a Python-level handler, writing the count to /tmp/count; sleeps for an hour between. */
const PY_SLEEPER = `
import os, signal, time
n = 0
def counted(*_):
    global n
    n += 1
    with open('/tmp/count.tmp', 'w') as f:
        f.write(str(n))
    os.replace('/tmp/count.tmp', '/tmp/count')
signal.signal(signal.SIGUSR1, counted)
open('/tmp/ready', 'w').close()
while True:
    time.sleep(3600)
`;

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];
  /** Signals to send while the tree is frozen after the dump: [host pid, signal]. */
  let whileFrozen: [number, NodeJS.Signals][] = [];

  test.before(async () => {
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      {
        images: ['dev'],
        open: {
          fault: (point: FaultPoint) => {
            if (point === 'checkpoint:dumped') for (const [pid, sig] of whileFrozen) process.kill(pid, sig);
          },
        },
      },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  /** Host pid of the sandbox's process whose command line is exactly argv. */
  function pidOf(sb: Sandbox, argv: string[]): number {
    const e = ls.engine;
    const row = e.catalog.requireSandbox(sb.id);
    const want = argv.join('\0') + '\0';
    const pid = e.cgroups
      .pids(e.runtime.cgroupName(row.instance))
      .find((p) => fs.readFileSync(`/proc/${p}/cmdline`, 'utf8') === want);
    if (!pid) throw new Error(`no ${argv.join(' ')} in ${sb.id}`);
    return pid;
  }

  test.serial('a signal sent while the tree is frozen for a checkpoint interrupts a Python sleep', async (t) => {
    const sb = await ls.create({ image: 'dev' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    await sb.files.write('/workspace/sleeper.py', PY_SLEEPER);
    await sb.commands.spawn(['python3', '/workspace/sleeper.py'], { stderrPath: '/tmp/sleeper.err' });
    await eventually(() => fs.existsSync(hostPath(ls, sb.id, '/tmp/ready')), 60_000, 10);
    const count = () => fs.readFileSync(hostPath(ls, sb.id, '/tmp/count'), 'utf8');
    whileFrozen = [[pidOf(sb, ['python3', '/workspace/sleeper.py']), 'SIGUSR1']];
    try {
      for (let i = 1; i <= 3; i++) {
        await sb.checkpoint();
        // Missed, the count would stay put for the hour of the sleep.
        t.is(await eventually(() => count() === String(i) && count(), 30_000, 5), String(i), `checkpoint ${i}`);
        await sb.settled();
      }
    } finally {
      whileFrozen = [];
    }
  });

  test.serial('a read blocked on a pipe goes on reading after a checkpoint and an ignored signal', async (t) => {
    const sb = await ls.create({ image: 'dev' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    // head has no handlers: SIGWINCH is ignored, and its read must restart, never fail.
    await sb.commands.run(['mkfifo', '/tmp/fifo']);
    // The shell holds the FIFO open both ways, so head's read blocks (not an open waiting for a writer).
    await sb.commands.spawn([
      'sh',
      '-c',
      'exec 3<>/tmp/fifo; head -n 1 <&3 > /tmp/out; echo "head exited $?" >> /tmp/out',
    ]);
    const head = await eventually(() => pidOf(sb, ['head', '-n', '1']), 30_000, 10);
    // Blocked in read(2) on its standard input: /proc/PID/syscall names the call and its fd.
    await eventually(() => fs.readFileSync(`/proc/${head}/syscall`, 'utf8').startsWith('0 0x0 '), 30_000, 10);
    whileFrozen = [[head, 'SIGWINCH']];
    try {
      await sb.checkpoint();
    } finally {
      whileFrozen = [];
    }
    await sb.settled();
    const fifo = fs.openSync(hostPath(ls, sb.id, '/tmp/fifo'), 'w');
    fs.writeSync(fifo, 'still reading\n');
    fs.closeSync(fifo);
    const out = await eventually(() => {
      const text = fs.readFileSync(hostPath(ls, sb.id, '/tmp/out'), 'utf8');
      return text.includes('exited') && text;
    }, 30_000);
    t.is(out, 'still reading\nhead exited 0\n');
  });
});
