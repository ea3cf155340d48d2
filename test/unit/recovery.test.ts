import test, { type ExecutionContext } from 'ava';
import Database from 'better-sqlite3';
import { ContextStore } from '../../src/context/context-store.js';
import { type AgentContext, appendRecoveryNote, validateContext } from '../../src/context/formats.js';
import { buildRecoverySummary } from '../../src/context/recovery.js';
import { type EffectContext, EffectLedger } from '../../src/effects/effect-ledger.js';
import { ObservationLog } from '../../src/provenance/observations.js';
import { VerdictLog } from '../../src/provenance/verdicts.js';
import { openTestDb } from '../helpers/sqlite.js';

function openDb(t: ExecutionContext): Database.Database {
  return openTestDb(t, 'recovery');
}

const isAncestorOfCkpt1 = (id: string) => id === 'ckpt_1';

/**
 * The scenario from the issue: the agent works after ckpt_1 (reads and writes files, runs
 * tests, scans, pays), fails, and is rolled back to ckpt_1.
 */
async function abandonedTimeline(t: ExecutionContext) {
  const db = openDb(t);
  const contexts = new ContextStore(db);
  const observations = new ObservationLog(db);
  const verdicts = new VerdictLog(db);
  const ledger = new EffectLedger(db);
  const on = { sandboxId: 'sbx_a', branchId: 'br_1', lineageId: 'sbx_a', epochCheckpointId: null };
  const ctx: EffectContext = on;

  const atCheckpoint: AgentContext = {
    format: 'anthropic',
    system: 'You maintain the repository.',
    messages: [
      { role: 'user', content: 'Clean the repository, scan it, then pay the invoice.' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'tu_1', name: 'sh', input: { cmd: 'git status' } }] },
    ],
  };
  const { contextId } = contexts.put(atCheckpoint);
  observations.seal('sbx_a', 'ckpt_1');
  ledger.seal('sbx_a', 'ckpt_1');

  observations.record({ ...on, kind: 'file-read', subject: 'src/index.ts', contentHash: 'h1' });
  observations.record({ ...on, kind: 'file-write', subject: 'src/index.ts', contentHash: 'h2' });
  observations.record({ ...on, kind: 'file-list', subject: 'src/' });
  observations.record({
    ...on,
    kind: 'command',
    subject: 'npm   test',
    exitCode: 1,
    summary: '2 failing\n(parser)',
    toolCallId: 'tu_2',
  });
  const scan = observations.record({ ...on, kind: 'verdict', subject: 'release.tgz' });
  verdicts.record({
    sandboxId: 'sbx_a',
    branchId: 'br_1',
    path: 'release.tgz',
    contentHash: 'h_clean',
    verdict: 'malware-scan:clean',
    observationId: scan.id,
  });
  await ledger.run(
    ctx,
    { kind: 'payments.charge', input: { invoice: 'inv_7', amount: 1200 }, reversibility: 'irreversible' },
    async () => ({ chargeId: 'ch_77' }),
  );
  await ledger.run(
    ctx,
    { kind: 'fs.write', input: { path: 'dist/out.js' }, reversibility: 'sandbox-local' },
    async () => undefined,
  );
  await ledger.run(
    ctx,
    {
      kind: 'slack.post',
      input: { text: 'released' },
      reversibility: 'compensable',
      compensation: { kind: 'slack.delete', input: { text: 'released' } },
    },
    async () => ({ ts: '1.2' }),
  );
  await ledger
    .run(ctx, { kind: 'mail.send', input: { to: 'ops@example.com' }, reversibility: 'irreversible' }, async () => {
      throw new Error('SMTP timeout');
    })
    .catch(() => undefined);
  await ledger
    .run(ctx, { kind: 'sms.send', input: { to: '+100' }, reversibility: 'irreversible' }, async () => {
      throw Object.assign(new Error('invalid number'), { definite: true });
    })
    .catch(() => undefined);

  return {
    contexts,
    contextId,
    atCheckpoint,
    input: {
      failure: 'The release job failed: the parser rejects UTF-8 BOMs.',
      lessons: ['The parser rejects files that start with a UTF-8 BOM; strip it before parsing.'],
      staleObservations: observations.applyRollback('sbx_a', 'ckpt_1', isAncestorOfCkpt1, 'rb_1'),
      effectsAfter: ledger.applyRollback('sbx_a', 'ckpt_1', isAncestorOfCkpt1, 'rb_1'),
      staleVerdicts: verdicts.staleVerdicts('sbx_a', (p) => (p === 'release.tgz' ? 'h_infected' : null)),
      targetCheckpoint: { id: 'ckpt_1', label: 'before cleanup' },
    },
  };
}

test('the structured summary separates what went stale, what happened for good, and what was learnt', async (t) => {
  const { input } = await abandonedTimeline(t);
  const { structured } = buildRecoverySummary(input);
  t.deepEqual(structured.targetCheckpoint, { id: 'ckpt_1', label: 'before cleanup' });
  t.is(structured.failure, input.failure);
  t.deepEqual(structured.commandsRun, [
    { command: 'npm   test', exitCode: 1, summary: '2 failing\n(parser)', toolCallId: 'tu_2' },
  ]);
  t.deepEqual(structured.filesTouched, [
    { path: 'src/index.ts', how: ['read', 'write'] },
    { path: 'src/', how: ['list'] },
  ]);
  t.deepEqual(
    structured.effectsCommitted.map((e) => [e.kind, e.status, e.reversibility]),
    [
      ['payments.charge', 'committed', 'irreversible'],
      ['fs.write', 'committed', 'sandbox-local'],
      ['slack.post', 'committed', 'compensable'],
      ['mail.send', 'unknown', 'irreversible'],
    ],
    'the definitely failed sms is left out',
  );
  t.deepEqual(
    structured.irreversibleEffects.map((e) => [e.kind, e.output]),
    [
      ['payments.charge', { chargeId: 'ch_77' }],
      ['mail.send', undefined],
    ],
  );
  t.deepEqual(structured.staleVerdicts, [
    { path: 'release.tgz', verdict: 'malware-scan:clean', contentHash: 'h_clean', currentHash: 'h_infected' },
  ]);
  t.deepEqual(structured.lessons, input.lessons);
});

test('the text tells the model where it is, what is no longer true and what must not be repeated', async (t) => {
  const { input } = await abandonedTimeline(t);
  const { text } = buildRecoverySummary(input);
  t.log(text);
  t.true(text.startsWith('<lockstep-recovery>') && text.endsWith('</lockstep-recovery>'));
  t.regex(text, /checkpoint ckpt_1 \("before cleanup"\)/);
  t.regex(text, /Reason: The release job failed/);
  t.regex(
    text,
    /No longer true[^\n]*\n- ran `npm test` \(exit 1\): 2 failing \(parser\)\n- read\/write src\/index\.ts\n- list src\//,
  );
  t.regex(text, /verdict "malware-scan:clean" on release\.tgz no longer applies/);
  t.regex(
    text,
    /MUST NOT be repeated[^\n]*\n- payments\.charge \{"amount":1200,"invoice":"inv_7"\} → \{"chargeId":"ch_77"\}/,
  );
  t.regex(text, /mail\.send .* outcome unknown: it may have happened; do not retry/);
  t.regex(text, /slack\.post .* still in effect/);
  t.regex(text, /Undone by the rollback \(may be done again if still needed\): fs\.write/);
  t.regex(text, /Still valid[^\n]*\n- The parser rejects files that start with a UTF-8 BOM/);
  t.notRegex(text, /sms\.send/);
});

test('the note goes back into the restored context in its own format', async (t) => {
  const { contexts, contextId, atCheckpoint, input } = await abandonedTimeline(t);
  const restored = contexts.get(contextId);
  t.deepEqual(restored, atCheckpoint);
  const { text } = buildRecoverySummary(input);
  const resumed = appendRecoveryNote(restored, text);
  validateContext(resumed);
  const last = (resumed as { messages: { role: string; content: unknown }[] }).messages.at(-1);
  // The checkpoint fell between tool_use and tool_result: both are answered in one user turn.
  t.like(last, { role: 'user' });
  t.deepEqual(
    (last!.content as { type: string }[]).map((b) => b.type),
    ['tool_result', 'text'],
  );
});

test('long lists are cut with a count of what was left out', (t) => {
  const staleObservations = Array.from({ length: 25 }, (_, i) => ({
    id: `obs_${i}`,
    seq: i,
    sandboxId: 's',
    branchId: 'b',
    lineageId: 's',
    epochCheckpointId: null,
    kind: 'command' as const,
    toolCallId: null,
    subject: `make step${i}`,
    contentHash: null,
    exitCode: 0,
    summary: null,
    sealedBy: null,
    staleRollbackId: null,
    staleAt: null,
    inheritedFrom: null,
    createdAt: 0,
  }));
  const { structured, text } = buildRecoverySummary({
    staleObservations,
    effectsAfter: [],
    staleVerdicts: [],
    targetCheckpoint: { id: 'ckpt_9' },
  });
  t.is(structured.commandsRun.length, 25);
  t.regex(text, /- ran `make step19` \(exit 0\)\n- … and 5 more/);
  t.notRegex(text, /step20/);
  t.notRegex(text, /Reason:|MUST NOT|Still valid/);
});

test('bad input is rejected naming the field', (t) => {
  const base = { staleObservations: [], effectsAfter: [], staleVerdicts: [], targetCheckpoint: { id: 'ckpt_1' } };
  t.throws(() => buildRecoverySummary({ ...base, targetCheckpoint: { id: '' } }), {
    code: 'INVALID_ARGUMENT',
    message: /input\.targetCheckpoint\.id/,
  });
  t.throws(() => buildRecoverySummary({ ...base, effectsAfter: undefined as never }), {
    code: 'INVALID_ARGUMENT',
    message: /input\.effectsAfter/,
  });
  t.throws(() => buildRecoverySummary({ ...base, lessons: [1 as never] }), {
    code: 'INVALID_ARGUMENT',
    message: /input\.lessons/,
  });
});
