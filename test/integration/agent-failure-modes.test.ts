/**
 * The five failure modes of resuming an agent from a checkpoint ("Safe to
 * Resume?", issue 4 §6), each on a real sandbox:
 * (1) incomplete internal state coverage, (2) inconsistent checkpoint state,
 * (3) external state mismatch, (4) unbound nondeterministic replay,
 * (5) unrecorded external effects.
 * The outside world is a real HTTP stub on 127.0.0.1 that counts its calls.
 */
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import { Lockstep, type AgentContext, type CheckpointInfo, type EffectSpec, type Sandbox } from '../../src/index.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { startStub, type StubServer } from '../fixtures/stub-http.js';
import {
  SEQ_LOG,
  SEQ_SCRIPT,
  counterValue,
  expectedPySum,
  hostPath,
  layerPath,
  oneTo,
  seqLines,
  startCounter,
  startPyState,
  tellPy,
  waitCounter,
  waitPy,
} from '../fixtures/stub-workloads.js';

const RUNNER = fileURLToPath(new URL('../../../test/fixtures/crash-runner.mjs', import.meta.url));
const sha256 = (b: string | Buffer) => createHash('sha256').update(b).digest('hex');

/** A scripted agent's Anthropic Messages context after `turns` tool calls that each wrote a file. */
function anthropicContext(turns: { path: string; content: string }[]): AgentContext {
  const messages: Extract<AgentContext, { format: 'anthropic' }>['messages'] = [
    { role: 'user', content: 'Keep the plan in /workspace/notes.md up to date.' },
  ];
  turns.forEach((turn, i) => {
    messages.push({
      role: 'assistant',
      content: [
        { type: 'text', text: `Step ${i + 1}: writing ${turn.path}.` },
        {
          type: 'tool_use',
          id: `toolu_${i + 1}`,
          name: 'write_file',
          input: { path: turn.path, content: turn.content },
        },
      ],
    });
    messages.push({
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: `toolu_${i + 1}`, content: `wrote ${turn.content.length} bytes` }],
    });
  });
  return { format: 'anthropic', system: 'You are a careful agent. Ünïcode stays as it is: ✓', messages };
}

integration(test, () => {
  let ls: Lockstep;
  let stub: StubServer;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { images: ['base', 'dev'] },
    );
    stub = await startStub();
  });
  test.after.always(async () => {
    await stub?.close();
    await ls?.close();
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext, image = 'base'): Promise<Sandbox> {
    const sb = await ls.create({ image });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  test.serial(
    '(1) incomplete internal state coverage: process memory, files and context come back together',
    async (t) => {
      const sb = await sandbox(t, 'dev');
      await startPyState(sb, ls);
      await tellPy(ls, sb.id, 'alpha');
      await sb.files.write('/workspace/notes.md', 'plan v1\n');
      const ctx1 = anthropicContext([{ path: '/workspace/notes.md', content: 'plan v1\n' }]);
      const c1 = await sb.checkpoint({ label: 'plan v1', context: ctx1 });
      const atC1 = JSON.parse(fs.readFileSync(layerPath(ls, c1, '/tmp/state.json'), 'utf8')) as { ticks: number };

      // The abandoned attempt changes all three kinds of state (and checkpoints them).
      await tellPy(ls, sb.id, 'beta');
      await sb.files.write('/workspace/notes.md', 'plan v2\n');
      const ctx2 = anthropicContext([
        { path: '/workspace/notes.md', content: 'plan v1\n' },
        { path: '/workspace/notes.md', content: 'plan v2\n' },
      ]);
      await sb.checkpoint({ label: 'plan v2', context: ctx2 });
      const before = await waitPy(ls, sb.id, (s) => s.ticks >= atC1.ticks + 20);

      const report = await sb.rollback(c1.id);
      t.deepEqual(report.context, ctx1, 'the context is the one of the checkpoint');
      const mem = await waitPy(ls, sb.id, (s) => s.ticks > atC1.ticks);
      t.deepEqual(mem.notes, ['alpha'], 'the process memory is the one of the checkpoint');
      t.true(mem.ticks < before.ticks);
      t.is(mem.sum, expectedPySum(mem.ticks));
      t.is(
        (await sb.files.read('/workspace/notes.md')).content.toString(),
        'plan v1\n',
        'the files are those of the checkpoint',
      );
    },
  );

  test.serial(
    '(2) inconsistent checkpoint state: the stored context is exactly the one given at that checkpoint',
    async (t) => {
      const sb = await sandbox(t);
      const ctx1 = anthropicContext([{ path: '/workspace/a', content: 'a' }]);
      const given1 = structuredClone(ctx1);
      const c1 = await sb.checkpoint({ context: ctx1 });
      // The caller keeps using (and mutating) its own object afterwards.
      (ctx1 as { messages: unknown[] }).messages.push({ role: 'user', content: 'added after the checkpoint' });
      (ctx1 as { system: string }).system = 'changed';
      const ctx2 = anthropicContext([
        { path: '/workspace/a', content: 'a' },
        { path: '/workspace/b', content: 'b' },
      ]);
      const c2 = await sb.checkpoint({ context: ctx2 });
      const c3 = await sb.checkpoint();

      t.deepEqual(sb.context(c1.id), given1);
      t.deepEqual(sb.context(c2.id), ctx2);
      t.is(sb.context(c3.id), null);
      t.deepEqual((await sb.rollback(c1.id)).context, given1);
      t.deepEqual((await sb.rollback(c2.id)).context, ctx2);
      t.is((await sb.rollback(c3.id)).context, null);
    },
  );

  test.serial(
    '(2) inconsistent checkpoint state: the layer and the process image are from the same frozen instant',
    async (t) => {
      const sb = await sandbox(t);
      // The process keeps i in memory and appends it to a log through one fd:
      // if the process image were from a different instant than the files, the
      // log would show a gap (memory ahead) or a repeat (memory behind).
      await sb.commands.spawn(SEQ_SCRIPT);
      const log = () => seqLines(hostPath(ls, sb.id, SEQ_LOG));
      const ckpts: CheckpointInfo[] = [];
      for (let i = 0; i < 3; i++) {
        await eventually(() => log().length >= 5 * (i + 1), 5000, 5);
        ckpts.push(await sb.checkpoint());
      }
      await eventually(() => log().length >= seqLines(layerPath(ls, ckpts[2]!, SEQ_LOG)).length + 10, 5000, 5);
      for (const c of [ckpts[0]!, ckpts[2]!, ckpts[1]!]) {
        const frozen = seqLines(layerPath(ls, c, SEQ_LOG));
        t.deepEqual(frozen, oneTo(frozen.length));
        await sb.rollback(c.id);
        await eventually(() => log().length >= frozen.length + 3, 5000, 5);
        const lines = log();
        t.deepEqual(
          lines,
          oneTo(lines.length),
          `after rollback to a checkpoint at line ${frozen.length} the process writes ${frozen.length + 1} next`,
        );
      }
    },
  );

  test.serial(
    '(3) external state mismatch: a verdict goes stale exactly when a rollback changes its file',
    async (t) => {
      const sb = await sandbox(t);
      const v1 = randomBytes(4096);
      const v2 = Buffer.concat([v1, Buffer.from('patched')]);
      const c0 = await sb.checkpoint({ label: 'before the download' });
      await sb.files.write('/workspace/pkg.tgz', v1);
      await sb.files.write('/workspace/README', 'unchanged\n');
      const c1 = await sb.checkpoint({ label: 'v1' });
      await sb.files.write('/workspace/pkg.tgz', v2);
      const scan = await sb.verdicts.record({
        path: '/workspace/pkg.tgz',
        verdict: 'malware-scan:clean',
        toolCallId: 'call-scan',
      });
      const review = await sb.verdicts.record({ path: '/workspace/README', verdict: 'reviewed' });
      t.is(scan.contentHash, sha256(v2));
      const c2 = await sb.checkpoint({ label: 'v2 scanned' });

      const toV1 = await sb.rollback(c1.id);
      t.deepEqual(
        toV1.staleVerdicts.map((v) => [v.id, v.contentHash, v.currentHash]),
        [[scan.id, sha256(v2), sha256(v1)]],
        'the scan is stale: the file has other bytes now; the review of the unchanged README is not',
      );
      t.deepEqual(
        (await sb.verdicts.stale()).map((v) => v.id),
        [scan.id],
      );

      const toV2 = await sb.rollback(c2.id);
      t.deepEqual(toV2.staleVerdicts, [], 'back on the scanned bytes, the scan holds again');

      const toNothing = await sb.rollback(c0.id);
      t.deepEqual(
        toNothing.staleVerdicts.map((v) => [v.id, v.currentHash]),
        [
          [scan.id, null],
          [review.id, null],
        ],
      );
    },
  );

  test.serial(
    '(4) unbound nondeterministic replay: a replayed effect returns its recorded output; a sandbox-local one runs again',
    async (t) => {
      const sb = await sandbox(t);
      const c0 = await sb.checkpoint();
      let quoteCalls = 0;
      const quote = (toolCallId: string): Promise<unknown> =>
        sb.effects.run(
          { kind: 'quote.request', input: { sku: 'A-1', qty: 2 }, reversibility: 'irreversible', toolCallId },
          async () => {
            quoteCalls++;
            return stub.post('/quote', { sku: 'A-1' }); // a fresh random id on every real call
          },
        );
      let genCalls = 0;
      const generate = (toolCallId: string): Promise<unknown> =>
        sb.effects.run(
          {
            kind: 'workspace.generate',
            input: { file: '/workspace/gen.txt' },
            reversibility: 'sandbox-local',
            toolCallId,
          },
          async () => {
            genCalls++;
            const content = randomBytes(8).toString('hex');
            await sb.files.write('/workspace/gen.txt', content);
            return { sha256: sha256(content) };
          },
        );

      const first = await quote('call-1');
      const gen1 = (await generate('call-2')) as { sha256: string };
      t.is(stub.count('/quote'), 1);
      t.deepEqual(await generate('call-2b'), gen1, 'on the same branch the sandbox-local effect is not repeated');
      t.is(genCalls, 1);

      await sb.rollback(c0.id);
      t.false(await sb.files.exists('/workspace/gen.txt'));
      // The agent re-issues the same calls under fresh tool-call ids.
      t.deepEqual(await quote('call-3'), first, 'the recorded output, not a new sample');
      t.is(quoteCalls, 1, 'fn did not run');
      t.is(stub.count('/quote'), 1);
      const gen2 = (await generate('call-4')) as { sha256: string };
      t.is(genCalls, 2, 'the rollback undid the sandbox-local effect, so it runs again on the new branch');
      t.not(gen2.sha256, gen1.sha256);
      t.is(sha256((await sb.files.read('/workspace/gen.txt')).content), gen2.sha256);
    },
  );

  test.serial(
    '(5) unrecorded external effects: an effect is recorded before it runs, so a crash mid-way leaves it unknown, never retried',
    async (t) => {
      const sb = await sandbox(t);
      const path = '/mail/forward';
      const callsBefore = stub.count(path);
      const child = spawn(process.execPath, [RUNNER, 'effect-hang', ls.home, sb.id, stub.url], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (b: Buffer) => (output += b.toString()));
      child.stderr.on('data', (b: Buffer) => (output += b.toString()));
      const exited = new Promise<NodeJS.Signals | null>((r) => child.on('close', (_c, s) => r(s)));
      await eventually(() => output.includes('called'), 20_000, 10).catch(() => t.fail(output));
      child.kill('SIGKILL'); // after the relay answered, before the outcome was recorded
      t.is(await exited, 'SIGKILL');
      t.is(stub.count(path), callsBefore + 1);

      // Reopening as the only manager turns the dead runner's pending attempt into "unknown".
      await ls.close();
      ls = await Lockstep.open({ home: ls.home });
      const reopened = ls.get(sb.id);
      const [effect] = reopened.effects.list();
      t.like(effect, {
        kind: 'mail.forward',
        status: 'unknown',
        toolCallId: 'call-crash-1',
        input: { to: 'ops@example.test', messageId: 'msg-crash' },
      });

      const spec: EffectSpec = {
        kind: 'mail.forward',
        input: { to: 'ops@example.test', messageId: 'msg-crash' },
        reversibility: 'irreversible',
        toolCallId: 'call-retry',
      };
      let ran = 0;
      const retry = () => reopened.effects.run(spec, async () => void ran++);
      await t.throwsAsync(retry(), { code: 'EFFECT_OUTCOME_UNKNOWN' });
      t.is(ran, 0);
      t.is(stub.count(path), callsBefore + 1, 'the relay was called exactly once');

      // The operator checks the relay's log and settles it; from then on it replays.
      reopened.effects.resolveUnknown(effect!.id, { outcome: 'committed', output: { relayed: true } });
      t.deepEqual(await retry(), { relayed: true });
      t.is(ran, 0);
      t.is(stub.count(path), callsBefore + 1);
    },
  );

  test.serial(
    '(5) unrecorded external effects: rollback across an irreversible effect warns by default and policy "refuse" blocks it',
    async (t) => {
      const sb = await sandbox(t);
      await startCounter(sb, ls);
      const c0 = await sb.checkpoint();
      const sent = await sb.effects.run(
        {
          kind: 'mail.send',
          input: { to: 'boss@example.test', subject: 'done' },
          reversibility: 'irreversible',
          toolCallId: 'call-mail',
        },
        () => stub.post('/mail/send', { to: 'boss@example.test' }),
      );
      const [effect] = sb.effects.list();
      await sb.files.write('/workspace/marker', 'after the mail\n');
      const before = sb.info();

      await t.throwsAsync(sb.rollback(c0.id, { policy: 'refuse' }), { code: 'ROLLBACK_REFUSED_IRREVERSIBLE' });
      t.like(sb.info(), {
        headCheckpointId: before.headCheckpointId,
        branchId: before.branchId,
        pid: before.pid,
        state: 'running',
      });
      t.is((await sb.files.read('/workspace/marker')).content.toString(), 'after the mail\n');
      const now = await counterValue(ls, sb.id);
      t.true((await waitCounter(ls, sb.id, (v) => v > now)) > now, 'the processes were not touched');
      t.like(sb.effects.get(effect!.id), { status: 'committed', abandonedBy: null });

      const report = await sb.rollback(c0.id);
      t.deepEqual(
        report.warnings.map((w) => [w.effectId, w.kind, w.reason]),
        [[effect!.id, 'mail.send', 'irreversible']],
      );
      t.deepEqual(
        report.recoverySummary.structured.irreversibleEffects.map((e) => [e.effectId, e.output]),
        [[effect!.id, sent]],
      );
      t.regex(report.recoverySummary.text, /MUST NOT be repeated[\s\S]*mail\.send/);
      t.false(await sb.files.exists('/workspace/marker'));
    },
  );

  test.serial('(5) unrecorded external effects: compensations run in reverse order of the effects, once', async (t) => {
    const sb = await sandbox(t);
    const c0 = await sb.checkpoint();
    const kinds = ['hotel.book', 'car.book', 'flight.book'];
    for (const kind of kinds) {
      await sb.effects.run(
        {
          kind,
          input: { trip: 'T-7' },
          reversibility: 'compensable',
          compensation: { kind: kind.replace('.book', '.cancel'), input: { trip: 'T-7' } },
          toolCallId: `call-${kind}`,
        },
        () => stub.post(`/${kind}`, { trip: 'T-7' }),
      );
    }
    const report = await sb.rollback(c0.id);
    t.deepEqual(
      report.warnings.map((w) => [w.kind, w.reason]),
      kinds.map((k) => [k, 'not-compensated']),
    );

    const ran: string[] = [];
    const runner = async (e: { kind: string; compensation: { kind: string } | null }) => {
      ran.push(e.compensation!.kind);
      return stub.post(`/${e.compensation!.kind}`, { trip: 'T-7' });
    };
    const ids = report.effectsAfter.filter((e) => e.reversibility === 'compensable').map((e) => e.id);
    const results = await sb.effects.compensate(ids, runner);
    t.deepEqual(ran, ['flight.cancel', 'car.cancel', 'hotel.cancel']);
    t.true(results.every((r) => !r.replayed));
    t.deepEqual(
      kinds.map((k) => stub.count(`/${k.replace('.book', '.cancel')}`)),
      [1, 1, 1],
    );
    for (const id of ids) t.is(sb.effects.get(id).status, 'compensated');

    // Asking again (say, after another crash) does not cancel twice.
    const again = await sb.effects.compensate(ids, runner);
    t.true(again.every((r) => r.replayed));
    t.is(ran.length, 3);
  });
});
