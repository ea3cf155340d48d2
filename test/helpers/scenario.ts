/**
 * The one scenario every client must pass (issue 12's "done when"), written
 * against the shape the in-process SDK and `lockstep/client` share. Each
 * scenario-*.test.ts file supplies a target (how to create, connect to and
 * list sandboxes) and registers these tests with it.
 */
import type { ExecutionContext, TestFn } from 'ava';
import { createHash, randomBytes } from 'node:crypto';
import type { BeginResult, CheckpointInfo, EffectSpec, ForkResult, ObservedRunResult } from '../../src/index.js';
import { eventually } from './harness.js';

type Awaitable<T> = T | Promise<T>;

interface BackgroundHandle {
  pid: number;
  sendStdin(data: string | Uint8Array): Promise<void>;
  closeStdin(): Promise<void>;
  wait(): Promise<{ exitCode: number | null }>;
  kill(): Promise<boolean>;
  output(from?: { stdout: number; stderr: number }): Promise<{
    stdout: string;
    stderr: string;
    offsets: { stdout: number; stderr: number };
    rewound: boolean;
    running: boolean;
  }>;
}

interface PtyLike {
  pid: number;
  write(data: string | Uint8Array): Promise<void>;
  resize(cols: number, rows: number): Promise<void>;
  output(from?: number): Promise<{ data: Uint8Array; offset: number; rewound: boolean; running: boolean }>;
  wait(): Promise<{ exitCode: number | null; reason: string }>;
  kill(): Promise<boolean>;
}

/** What the scenario uses of a sandbox: the members both SDKs have, with the same names. */
export interface ScenarioSandbox {
  readonly id: string;
  commands: {
    run(
      cmd: string | string[],
      opts?: {
        cwd?: string;
        envs?: Record<string, string>;
        onStdout?: (s: string) => void;
        onStderr?: (s: string) => void;
        signal?: AbortSignal;
      },
    ): Promise<ObservedRunResult>;
    run(cmd: string | string[], opts: { background: true; stdin?: boolean }): Promise<BackgroundHandle>;
    connect(pid: number): Promise<BackgroundHandle>;
    list(): Promise<{ pid: number; running: boolean; exitCode: number | null }[]>;
  };
  pty: {
    create(opts: { cols: number; rows: number; cmd?: string | string[] }): Promise<PtyLike>;
    connect(pid: number): Promise<PtyLike>;
  };
  files: {
    write(path: string, data: string | Uint8Array): Promise<{ sha256: string; bytes: number }>;
    read(path: string): Promise<{ content: Buffer; sha256: string }>;
    exists(path: string): Promise<boolean>;
  };
  effects: {
    begin(spec: EffectSpec): Awaitable<BeginResult>;
    commit(effectId: string, output?: unknown): Awaitable<unknown>;
    run<T>(spec: EffectSpec, fn: () => T | Promise<T>): Promise<T>;
  };
  checkpoint(opts: { label?: string; context?: unknown }): Promise<CheckpointInfo>;
  rollback(
    checkpointId: string,
    opts?: { failure?: string },
  ): Promise<{
    checkpointId: string;
    context: unknown;
    effectsAfter: { id: string }[];
    warnings: { effectId: string; reason: string }[];
  }>;
  fork(checkpointId: string, opts?: { count?: number }): Promise<ForkResult[]>;
  kill(): Promise<unknown>;
}

/** How a client reaches sandboxes. */
export interface ScenarioTarget {
  create(opts: { metadata?: Record<string, string>; memoryMb?: number }): Promise<ScenarioSandbox>;
  connect(id: string): Promise<ScenarioSandbox>;
  /** Ids of the caller's sandboxes whose metadata includes every given pair. */
  list(metadata: Record<string, string>): Promise<string[]>;
}

/** Registers the scenario tests; `open` builds a fresh target per test (torn down with t.teardown). */
export function scenarioTests(
  test: TestFn,
  label: string,
  open: (t: ExecutionContext) => Promise<ScenarioTarget>,
): void {
  test.serial(
    `${label}: create, list by metadata, connect; commands with streamed output; a background process`,
    async (t) => {
      const target = await open(t);
      const tag = randomBytes(4).toString('hex');
      const sbx = await target.create({ metadata: { suite: 'scenario', tag }, memoryMb: 128 });
      t.teardown(() =>
        sbx.kill().then(
          () => undefined,
          () => undefined,
        ),
      );
      t.regex(sbx.id, /^sbx_/);
      t.deepEqual(await target.list({ tag }), [sbx.id]);
      t.deepEqual(await target.list({ tag: 'no-such-tag' }), []);
      const again = await target.connect(sbx.id);
      t.is(again.id, sbx.id);

      const chunks: string[] = [];
      const errs: string[] = [];
      const r = await again.commands.run('for i in 1 2 3; do echo line $i; done; echo warn >&2; exit 4', {
        onStdout: (s) => chunks.push(s),
        onStderr: (s) => errs.push(s),
      });
      t.is(r.exitCode, 4);
      t.is(r.stdout, 'line 1\nline 2\nline 3\n');
      t.is(chunks.join(''), r.stdout);
      t.is(errs.join(''), 'warn\n');
      t.is(r.stderr, 'warn\n');
      const argv = await again.commands.run(['sh', '-c', 'pwd; echo "$X"'], { cwd: '/tmp', envs: { X: 'from envs' } });
      t.is(argv.stdout, '/tmp\nfrom envs\n');

      const bg = await sbx.commands.run('sleep 0.2; exit 7', { background: true });
      t.true(bg.pid > 1);
      t.deepEqual(await bg.wait(), { exitCode: 7 });
      const forever = await sbx.commands.run('sleep 600', { background: true });
      t.true(await forever.kill());
      t.is((await forever.wait()).exitCode, null);

      // Output of a background command, read by offsets, and after reattaching by pid.
      const talker = await sbx.commands.run(
        'echo out 1; echo err 1 >&2; sleep 0.3; printf "out 2 \\303\\251\\n"; exit 5',
        { background: true },
      );
      const first = await eventually(async () => {
        const o = await talker.output();
        return o.stdout.includes('out 1') && o.stderr.includes('err 1') ? o : undefined;
      }, 10_000);
      t.deepEqual(await talker.wait(), { exitCode: 5 });
      const rest = await talker.output(first!.offsets);
      t.is(first!.stdout + rest.stdout, 'out 1\nout 2 \u00e9\n');
      t.is(rest.stderr, '');
      t.false(rest.rewound);
      t.false(rest.running);
      const reattached = await (await target.connect(sbx.id)).commands.connect(talker.pid);
      t.is((await reattached.output()).stdout, 'out 1\nout 2 \u00e9\n');
      t.deepEqual(await reattached.wait(), { exitCode: 5 });
      const listed = await sbx.commands.list();
      t.deepEqual(
        listed.find((c) => c.pid === talker.pid),
        { pid: talker.pid, running: false, exitCode: 5 },
      );
      t.deepEqual(
        listed.find((c) => c.pid === bg.pid),
        { pid: bg.pid, running: false, exitCode: 7 },
      );
      const unknown = await t.throwsAsync(sbx.commands.connect(999_999));
      t.like(unknown, { code: 'INVALID_ARGUMENT', field: 'pid' });
    },
  );

  test.serial(
    `${label}: interactive processes: bytes to a background command's stdin, a program on a PTY`,
    async (t) => {
      const target = await open(t);
      const sbx = await target.create({ memoryMb: 128 });
      t.teardown(() =>
        sbx.kill().then(
          () => undefined,
          () => undefined,
        ),
      );
      const sum = await sbx.commands.run('sha256sum', { background: true, stdin: true });
      const data = randomBytes(100_000);
      await sum.sendStdin(data.subarray(0, 1));
      await sum.sendStdin(data.subarray(1));
      await sum.closeStdin();
      t.deepEqual(await sum.wait(), { exitCode: 0 });
      t.is((await sum.output()).stdout, `${createHash('sha256').update(data).digest('hex')}  -\n`);

      const pty = await sbx.pty.create({
        cols: 80,
        rows: 24,
        cmd: 'read go; stty size; read l; echo "got:$l"; exit 5',
      });
      await pty.resize(100, 30);
      await pty.write('go\n');
      const text = async (p: PtyLike) => Buffer.from((await p.output(0)).data).toString();
      await eventually(async () => (await text(pty)).includes('30 100\r\n'), 20_000);
      await pty.write('hello\n');
      t.deepEqual(await pty.wait(), { exitCode: 5, reason: 'exited' });
      const again = await (await target.connect(sbx.id)).pty.connect(pty.pid);
      t.regex(await text(again), /^go\r\n30 100\r\nhello\r\ngot:hello\r\n$/);
    },
  );

  test.serial(
    `${label}: files, checkpoint with a context, an irreversible effect, rollback with its report, the effect not run twice, fork`,
    async (t) => {
      const target = await open(t);
      const sbx = await target.create({ memoryMb: 128 });
      t.teardown(() =>
        sbx.kill().then(
          () => undefined,
          () => undefined,
        ),
      );

      // A process that lives across the checkpoint: its counter carries on after the rollback.
      await sbx.commands.run('n=0; while true; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done', {
        background: true,
      });
      await eventually(async () => Number((await sbx.files.read('/tmp/counter')).content.toString()) > 2, 10_000);

      const bin = Buffer.from([0, 1, 2, 200, 255, 10]);
      t.is((await sbx.files.write('/workspace/data/blob.bin', bin)).bytes, bin.length);
      await sbx.files.write('notes.txt', 'version 1\n');
      t.deepEqual((await sbx.files.read('/workspace/data/blob.bin')).content, bin);

      const context = {
        format: 'openai-chat',
        messages: [
          { role: 'system', content: 'You fix bugs.' },
          { role: 'user', content: 'Fix the notes.' },
        ],
      };
      const ck = await sbx.checkpoint({ label: 'before edit', context });
      t.regex(ck.id, /^ckpt_/);
      t.truthy(ck.contextId);

      // The abandoned attempt: files change and an e-mail goes out (irreversible).
      await sbx.files.write('notes.txt', 'version 2 (broken)\n');
      await sbx.files.write('new.txt', 'new');
      const spec: EffectSpec = {
        kind: 'email.send',
        input: { to: 'ops@example.com' },
        reversibility: 'irreversible',
        key: 'mail-1',
      };
      let sent = 0;
      const first = await sbx.effects.run(spec, () => {
        sent++;
        return { messageId: 'm-1' };
      });
      t.deepEqual(first, { messageId: 'm-1' });

      const report = await sbx.rollback(ck.id, { failure: 'The edit broke the notes' });
      t.is(report.checkpointId, ck.id);
      t.deepEqual(report.context, context);
      t.is(report.effectsAfter.length, 1);
      t.true(report.warnings.some((w) => w.effectId === report.effectsAfter[0]!.id && w.reason === 'irreversible'));
      t.is((await sbx.files.read('notes.txt')).content.toString(), 'version 1\n');
      t.false(await sbx.files.exists('new.txt'));

      // Retrying the effect after the rollback returns what it returned, without running it.
      const retried = await sbx.effects.run(spec, () => {
        sent++;
        return { messageId: 'm-2' };
      });
      t.deepEqual(retried, { messageId: 'm-1' });
      t.is(sent, 1);
      const begun = await sbx.effects.begin(spec);
      t.true(begun.replayed);

      // The restored process runs on.
      const after = Number((await sbx.files.read('/tmp/counter')).content.toString());
      await eventually(async () => Number((await sbx.files.read('/tmp/counter')).content.toString()) > after, 10_000);

      // A fork starts from the checkpoint's files, and knows the effect too.
      const forks = await sbx.fork(ck.id, { count: 1 });
      t.is(forks.length, 1);
      const f = forks[0]!;
      if (!f.ok) return t.fail(`fork failed: ${f.error.code} ${f.error.message}`);
      const child = await target.connect(f.id);
      t.teardown(() =>
        child.kill().then(
          () => undefined,
          () => undefined,
        ),
      );
      t.is((await child.files.read('notes.txt')).content.toString(), 'version 1\n');
      t.deepEqual((await child.files.read('/workspace/data/blob.bin')).content, bin);
      const inFork = await child.effects.run(spec, () => {
        sent++;
        return { messageId: 'm-3' };
      });
      t.deepEqual(inFork, { messageId: 'm-1' });
      t.is(sent, 1);
    },
  );

  test.serial(
    `${label}: a background command's output is part of the sandbox: a rollback rewinds it with the process, a fork copies it`,
    async (t) => {
      const target = await open(t);
      const sbx = await target.create({ memoryMb: 64 });
      t.teardown(() =>
        sbx.kill().then(
          () => undefined,
          () => undefined,
        ),
      );
      const proc = await sbx.commands.run(
        'echo a; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo b; exec sleep 600',
        { background: true },
      );
      await eventually(async () => (await proc.output()).stdout === 'a\n', 10_000);
      const ck = await sbx.checkpoint({ label: 'after a' });

      await sbx.files.write('go', '');
      const seen = await eventually(async () => {
        const o = await proc.output();
        return o.stdout === 'a\nb\n' ? o : undefined;
      }, 10_000);

      // The output file went back to what it was at the checkpoint: reading on from the old offsets says so.
      await sbx.rollback(ck.id);
      const back = await proc.output(seen!.offsets);
      t.true(back.rewound);
      t.is(back.stdout, 'a\n');
      t.true(back.running, 'the restored process waits again');
      await sbx.files.write('go', '');
      await eventually(async () => (await proc.output()).stdout === 'a\nb\n', 10_000);

      // A fork has the same command at the same point, with its output so far.
      const [f] = await sbx.fork(ck.id, { count: 1 });
      if (!f?.ok) return t.fail(`fork failed: ${JSON.stringify(f)}`);
      const child = await target.connect(f.id);
      t.teardown(() =>
        child.kill().then(
          () => undefined,
          () => undefined,
        ),
      );
      const inFork = await child.commands.connect(proc.pid);
      t.is((await inFork.output()).stdout, 'a\n');
      await child.files.write('go', '');
      await eventually(async () => (await inFork.output()).stdout === 'a\nb\n', 10_000);
    },
  );

  test.serial(`${label}: typed errors name what was wrong`, async (t) => {
    const target = await open(t);
    const missing = await t.throwsAsync(target.connect('sbx_doesnotexist0'));
    t.is((missing as { code?: string }).code, 'SANDBOX_NOT_FOUND');
    const sbx = await target.create({ memoryMb: 64 });
    t.teardown(() =>
      sbx.kill().then(
        () => undefined,
        () => undefined,
      ),
    );
    const nofile = await t.throwsAsync(sbx.files.read('/workspace/none.txt'));
    t.is((nofile as { code?: string }).code, 'FILE_NOT_FOUND');
    const escape = await t.throwsAsync(sbx.files.read('../../etc/shadow'));
    t.is((escape as { code?: string }).code, 'PATH_ESCAPES_SANDBOX');
    const cwd = await t.throwsAsync(sbx.commands.run('true', { cwd: '/no/such/dir' }));
    t.like(cwd, { code: 'INVALID_ARGUMENT', field: 'cwd' });
    const ckpt = await t.throwsAsync(sbx.rollback('ckpt_doesnotexist0'));
    t.is((ckpt as { code?: string }).code, 'CHECKPOINT_NOT_FOUND');
  });
}
