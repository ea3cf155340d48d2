/**
 * Interactive processes on real sandboxes: stdin of background commands
 * (bytes exact, bounded when the process does not read), PTYs with Python's
 * REPL on a terminal of the sandbox's own devpts (write, resize, kill), and
 * what checkpoint, rollback and fork do to an open PTY: the relay, the
 * terminal pair and the REPL are in the process tree, so the checkpoint
 * dumps them, a rollback brings the REPL back with its state of that instant,
 * a fork has its own, and a PTY started after the checkpoint reports
 * `rolled-back`.
 */
import { createHash, randomBytes } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep, PtyHandle, Sandbox } from '../../src/index.js';
import { MAX_PENDING_INPUT_BYTES } from '../../src/index.js';
import { Sandbox as RemoteSandbox } from '../../src/client/index.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';
import { dropStandby } from '../../src/checkpoints/standby.js';

const KiB = 1024;

/** Reads a PTY's transcript until `want` shows up after `from`; returns the text and the new offset. */
async function readUntil(
  pty: { output(from?: number): Promise<{ data: Uint8Array; offset: number; rewound: boolean }> },
  from: number,
  want: string | RegExp,
  timeoutMs = 30_000,
): Promise<{ text: string; offset: number }> {
  let text = '';
  let offset = from;
  await eventually(
    async () => {
      const r = await pty.output(offset);
      if (r.rewound) text = '';
      text += Buffer.from(r.data).toString('utf8');
      offset = r.offset;
      return typeof want === 'string' ? text.includes(want) : want.test(text);
    },
    timeoutMs,
    50,
  );
  return { text, offset };
}

/** Runs `line` in the REPL and returns what it printed (the echoed input and the prompt stripped). */
async function repl(
  pty: PtyHandle,
  from: number,
  line: string,
  expect: RegExp,
): Promise<{ out: string; offset: number }> {
  await pty.write(line + '\n');
  const r = await readUntil(pty, from, expect);
  return { out: r.text, offset: r.offset };
}

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];
  test.before(async () => {
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { images: ['base', 'dev'] },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext, image = 'base'): Promise<Sandbox> {
    const sb = await ls.create({ image, memoryMb: 256 });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  test.serial('stdin of a background command: every byte arrives, in order, and EOF after closeStdin', async (t) => {
    const sb = await sandbox(t);
    const h = await sb.commands.run('sha256sum; wc -c', { background: true, stdin: true });
    // Every byte value, including NUL, CR, LF and ^D, in chunks that do not line up with records.
    const data = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(300 * KiB)]);
    for (let at = 0; at < data.length;) {
      const n = 1 + ((at * 7919) % (70 * KiB));
      await h.sendStdin(data.subarray(at, at + n));
      at += n;
    }
    await h.closeStdin();
    await h.closeStdin(); // twice is not an error
    t.deepEqual(await h.wait({ timeoutMs: 60_000 }), { exitCode: 0 });
    // sha256sum read to EOF, so `wc -c` found nothing left.
    const out = (await h.output()).stdout.split('\n');
    t.is(out[0], `${createHash('sha256').update(data).digest('hex')}  -`);
    t.is(out[1]!.trim(), '0');
    const after = await t.throwsAsync(h.sendStdin('late'));
    t.is((after as { code?: string }).code, 'STDIN_CLOSED');
  });

  test.serial('text stdin reaches a reader line by line; a command without stdin: true refuses input', async (t) => {
    const sb = await sandbox(t);
    const h = await sb.commands.run('while read l; do echo "got:$l"; done', { background: true, stdin: true });
    await h.sendStdin('héllo\n');
    await eventually(async () => (await h.output()).stdout === 'got:héllo\n', 20_000);
    // Reattached by pid, the same stdin.
    const again = await sb.commands.connect(h.pid);
    await again.sendStdin('second\n');
    await eventually(async () => (await h.output()).stdout === 'got:héllo\ngot:second\n', 20_000);
    await again.closeStdin();
    t.deepEqual(await h.wait({ timeoutMs: 30_000 }), { exitCode: 0 });

    const plain = await sb.commands.run('sleep 600', { background: true });
    const err = await t.throwsAsync(plain.sendStdin('x'));
    t.is((err as { code?: string }).code, 'STDIN_CLOSED');
    t.true(await plain.kill());
  });

  test.serial(
    'a process that never reads its stdin fills a bounded queue: STDIN_FULL, and the manager carries on',
    async (t) => {
      const sb = await sandbox(t);
      const h = await sb.commands.run('exec sleep 600', { background: true, stdin: true });
      const chunk = randomBytes(64 * KiB);
      let accepted = 0;
      let refusal: unknown;
      for (let i = 0; i < 64 && !refusal; i++) {
        try {
          await h.sendStdin(chunk);
          accepted += chunk.length;
        } catch (e) {
          refusal = e;
        }
      }
      t.is((refusal as { code?: string }).code, 'STDIN_FULL');
      // What was taken: the manager's bound plus what the kernel's FIFO and pipe hold (64 KiB each here), no more.
      t.true(accepted <= MAX_PENDING_INPUT_BYTES + 4 * 64 * KiB, `accepted ${accepted}`);
      t.true(accepted >= MAX_PENDING_INPUT_BYTES - chunk.length, `accepted ${accepted}`);
      // The manager is not stalled: other commands run, and the stuck one can be killed.
      t.is((await sb.commands.run('echo alive')).stdout, 'alive\n');
      t.true(await h.kill());
      await h.wait({ timeoutMs: 30_000 });
      t.false(h.isRunning());
    },
  );

  test.serial('a PTY runs Python on a terminal of the sandbox: write, read 42, resize, stty size, kill', async (t) => {
    const sb = await sandbox(t, 'dev');
    const pty = await sb.pty.create({ cols: 80, rows: 24, cmd: ['python3', '-q'] });
    let at = (await readUntil(pty, 0, '>>> ')).offset;
    let r = await repl(pty, at, 'print(6*7)', /\r\n42\r\n>>> $/);
    t.regex(r.out, /print\(6\*7\)\r\n42\r\n/);
    at = r.offset;

    // The terminal is the sandbox's own: the first pty of its devpts instance, and the REPL's controlling tty.
    r = await repl(
      pty,
      at,
      'import os; print("tty", os.ttyname(0), os.getsid(0) == os.getpid(), os.tcgetpgrp(0) == os.getpgrp(), sorted(os.listdir("/dev/pts")))',
      /tty .*\]\r\n>>> $/,
    );
    t.regex(r.out, /tty \/dev\/pts\/0 True True \['0', 'ptmx'\]/);
    at = r.offset;

    // Readline redraws its prompt on SIGWINCH (`\r\x1b[K\r>>> `), before or after this command's output.
    await pty.resize(100, 40);
    r = await repl(pty, at, 'os.system("stty size")', /\r\n40 100\r\n0\r\n>>> /);
    at = r.offset;

    // Reattached by id, the same terminal; the list shows it.
    const again = await sb.pty.connect(pty.pid);
    r = await repl(again, at, 'print("again")', /again\r\n>>> $/);
    t.deepEqual(await sb.pty.list(), [{ pid: pty.pid, running: true, exitCode: null }]);

    t.true(await pty.kill());
    t.deepEqual(await pty.wait({ timeoutMs: 30_000 }), { exitCode: null, reason: 'killed' });
    // No Python left in the sandbox.
    t.is((await sb.commands.run('ps -eo comm= | grep -c python3 || true')).stdout.trim(), '0');
    const late = await t.throwsAsync(pty.write('x'));
    t.is((late as { code?: string }).code, 'STDIN_CLOSED');
  });

  test.serial(
    'a PTY whose input FIFO the sandbox replaced (symlink, regular file) is refused, and nothing is written through it',
    async (t) => {
      const sb = await sandbox(t);
      for (const plant of ['ln -s /workspace/target', 'touch']) {
        const pty = await sb.pty.create({ cols: 80, rows: 24, cmd: ['sleep', '600'] });
        const fifo = `/run/lockstep/pty/${pty.pid}.in`;
        await sb.commands.run(
          `echo keep > /workspace/target; while [ ! -p ${fifo} ]; do sleep 0.05; done; rm ${fifo}; ${plant} ${fifo}`,
        );
        const err = await t.throwsAsync(pty.write('overwrite\n'));
        t.is((err as { code?: string }).code, 'STDIN_CLOSED', plant);
        t.is((await sb.files.read('/workspace/target')).content.toString(), 'keep\n', plant);
        t.true(await pty.kill());
      }
    },
  );

  test.serial('a PTY that exits reports its code; follow() streams its output until then', async (t) => {
    const sb = await sandbox(t);
    const pty = await sb.pty.create({ cols: 40, rows: 10, cmd: 'read x; echo "you said $x"; exit 3' });
    const seen: Buffer[] = [];
    const following = pty.follow((d) => seen.push(Buffer.from(d)));
    await pty.write('yes\n');
    t.deepEqual(await following, { exitCode: 3, reason: 'exited' });
    t.regex(Buffer.concat(seen).toString(), /you said yes\r\n/);
    t.deepEqual(await sb.pty.list(), [{ pid: pty.pid, running: false, exitCode: 3 }]);
  });

  const ptyAcrossRollback = test.macro({
    async exec(t, path: 'standby' | 'restore') {
      const sb = await sandbox(t, 'dev');
      const pty = await sb.pty.create({ cols: 80, rows: 24, cmd: ['python3', '-q'] });
      let at = (await readUntil(pty, 0, '>>> ')).offset;
      at = (await repl(pty, at, 'x = 1; open("/workspace/f", "w").write("one")', /\r\n3\r\n>>> $/)).offset;
      const ckpt = await sb.checkpoint({ label: 'repl' });
      const atCheckpoint = at;

      // Keep typing after the checkpoint: state, a file, a second terminal.
      at = (await repl(pty, at, 'x = 2; open("/workspace/f", "w").write("two!")', /\r\n4\r\n>>> $/)).offset;
      const later = await sb.pty.create({ cols: 80, rows: 24, cmd: ['sleep', '600'] });
      t.is((await sb.files.read('/workspace/f')).content.toString(), 'two!');

      await sb.settled(); // the warm standby of ckpt is ready
      if (path === 'restore') await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      const report = await sb.rollback(ckpt.id);
      t.is(report.checkpointId, ckpt.id);
      t.is(report.path, path);
      // The REPL of the checkpoint runs again, under the same id, with x == 1; its transcript is cut back to that instant.
      t.true(pty.isRunning());
      const back = await pty.output(at);
      t.true(back.rewound);
      t.is(back.offset, atCheckpoint);
      const r = await repl(pty, atCheckpoint, 'print("x is", x)', /x is \d\r\n>>> $/);
      t.regex(r.out, /x is 1\r\n/);
      t.is((await sb.files.read('/workspace/f')).content.toString(), 'one');
      // The PTY started after the checkpoint is not in this timeline.
      t.deepEqual(await later.wait({ timeoutMs: 30_000 }), { exitCode: null, reason: 'rolled-back' });
      t.deepEqual(
        (await sb.pty.list()).map((p) => p.pid),
        [pty.pid],
      );
      const gone = await t.throwsAsync(later.write('x'));
      t.is((gone as { code?: string }).code, 'STDIN_CLOSED');

      if (path === 'standby') {
        // A fork of the checkpoint has its own REPL with the same past.
        const [fork] = await sb.fork(ckpt.id);
        t.true(fork!.ok);
        const forked = ls.get((fork as { id: string }).id);
        t.teardown(() => ls.remove(forked.id).catch(() => undefined));
        const fpty = await forked.pty.connect(pty.pid);
        const fr = await repl(fpty, atCheckpoint, 'x += 10; print("fork x", x)', /fork x \d+\r\n>>> $/);
        t.regex(fr.out, /fork x 11\r\n/);
        // Typing in the fork does not reach the parent's REPL.
        const p2 = await repl(pty, r.offset, 'print("parent x", x)', /parent x \d+\r\n>>> $/);
        t.regex(p2.out, /parent x 1\r\n/);
      }

      // And the restored sandbox still checkpoints with the PTY open.
      const again = await sb.checkpoint({ label: 'after' });
      t.truthy(again.id);
      t.true(await pty.kill());
    },
    title: (_t, path) =>
      `checkpoint with an open Python PTY, type on, roll back (${path} path): the REPL is back as it was, a later PTY is rolled-back${path === 'standby' ? ', a fork has its own' : ''}`,
  });
  test.serial(ptyAcrossRollback, 'standby');
  test.serial(ptyAcrossRollback, 'restore');

  test.serial('through lockstep/client: stdin bytes exact, and a Python PTY over the NDJSON stream', async (t) => {
    const { client } = await startServer(t, ls);
    const sbx = await RemoteSandbox.create({
      apiUrl: client.base,
      apiKey: tenantToken(ls, 'acme'),
      image: 'dev',
      memoryMb: 256,
    });
    t.teardown(() => sbx.kill().then(() => undefined));

    const h = await sbx.commands.run('sha256sum', { background: true, stdin: true });
    const data = randomBytes(200 * KiB);
    await h.sendStdin(data.subarray(0, 100 * KiB));
    await h.sendStdin(data.subarray(100 * KiB));
    await h.closeStdin();
    t.deepEqual(await h.wait({ timeoutMs: 60_000 }), { exitCode: 0 });
    t.is((await h.output()).stdout, `${createHash('sha256').update(data).digest('hex')}  -\n`);
    const full = await t.throwsAsync(h.sendStdin('late'));
    t.is((full as { code?: string }).code, 'STDIN_CLOSED');

    let text = '';
    const pty = await sbx.pty.create({
      cols: 80,
      rows: 24,
      cmd: ['python3', '-q'],
      onData: (d) => (text += Buffer.from(d).toString()),
    });
    await eventually(() => text.includes('>>> '), 30_000);
    await pty.write('print(6*7)\n');
    await eventually(() => /\r\n42\r\n/.test(text), 30_000);
    await pty.resize(120, 50);
    await pty.write('import os; os.system("stty size")\n');
    await eventually(() => /\r\n50 120\r\n/.test(text), 30_000);
    t.deepEqual(
      (await sbx.pty.list()).map((p) => p.pid),
      [pty.pid],
    );
    t.true(await pty.kill());
    t.deepEqual(await pty.wait({ timeoutMs: 30_000 }), { exitCode: null, reason: 'killed' });
    const bad = await t.throwsAsync(sbx.pty.connect(pty.pid + 1000));
    t.is((bad as { code?: string }).code, 'INVALID_ARGUMENT');
  });
});
