import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test, { type ExecutionContext } from 'ava';
import Database from 'better-sqlite3';
import {
  type EffectContext,
  type EffectSpec,
  type EffectStatus,
  EffectLedger,
  EffectOutcomeUnknownError,
  IrreversibleEffectError,
  checkRollbackPolicy,
} from '../../src/effects/effect-ledger.js';
import { canonicalJson, deriveKey } from '../../src/effects/idempotency.js';

function openDb(t: ExecutionContext): { db: Database.Database; file: string } {
  const dir = mkdtempSync(join(tmpdir(), 'lockstep-effects-'));
  const file = join(dir, 'state.db');
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  t.teardown(() => {
    if (db.open) db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return { db, file };
}

function ledger(t: ExecutionContext): EffectLedger {
  let now = 1_000;
  return new EffectLedger(openDb(t).db, () => now++);
}

const root: EffectContext = { sandboxId: 'sbx_root', lineageId: 'sbx_root', branchId: 'br_1', epochCheckpointId: null };
const pay: EffectSpec = {
  kind: 'payments.charge',
  input: { amount: 500, currency: 'EUR', to: 'acct_42' },
  reversibility: 'irreversible',
};

/** A call counter standing in for the outside world. */
function world<T>(output: T): { calls: number; fn: () => Promise<T> } {
  const w = {
    calls: 0,
    fn: async () => {
      w.calls++;
      return output;
    },
  };
  return w;
}

test('run twice with the same effect runs it once and replays the recorded output', async (t) => {
  const l = ledger(t);
  const w = world({ chargeId: 'ch_1' });
  t.deepEqual(await l.run(root, pay, w.fn), { chargeId: 'ch_1' });
  t.deepEqual(await l.run(root, pay, w.fn), { chargeId: 'ch_1' });
  t.is(w.calls, 1);
  const rows = l.list('sbx_root');
  t.is(rows.length, 1);
  t.like(rows[0], {
    status: 'committed',
    kind: 'payments.charge',
    output: { chargeId: 'ch_1' },
    attempt: 1,
    scope: 'lineage',
  });
  t.regex(rows[0]!.id, /^eff_[0-9a-f]{20}$/);
});

test('begin records the intent before the effect runs', (t) => {
  const l = ledger(t);
  const b = l.begin(root, pay);
  t.false(b.replayed);
  t.like(l.get(b.effectId), {
    status: 'pending',
    output: undefined,
    input: { amount: 500, currency: 'EUR', to: 'acct_42' },
  });
  l.commit(b.effectId, null);
  const again = l.begin(root, pay);
  t.true(again.replayed);
  t.is(again.replayed && again.output, null, 'a null output replays as null, not undefined');
});

test('a crash while run() is executing the effect leaves it unknown, never retried blindly', async (t) => {
  const { db, file } = openDb(t);
  const before = new EffectLedger(db);
  let started!: () => void;
  const inFlight = new Promise<void>((r) => (started = r));
  void before.run(root, pay, () => {
    started();
    return new Promise<never>(() => undefined); // the payment is in flight...
  });
  await inFlight;
  const [pending] = before.list(root.sandboxId);
  db.close(); // ...when the process dies

  const db2 = new Database(file);
  t.teardown(() => db2.close());
  const after = new EffectLedger(db2);
  t.deepEqual(after.recoverAfterCrash(() => true).length, 0, 'a live runner is left alone');
  after.recoverAfterCrash(() => false); // the runner process is gone
  t.like(after.get(pending!.id), { status: 'unknown', error: { name: 'Interrupted' } });
  const err = t.throws(() => after.begin(root, pay), {
    code: 'EFFECT_OUTCOME_UNKNOWN',
    instanceOf: EffectOutcomeUnknownError,
  });
  t.is((err as EffectOutcomeUnknownError).effect.id, pending!.id);

  const w = world('x');
  await t.throwsAsync(after.run(root, pay, w.fn), { code: 'EFFECT_OUTCOME_UNKNOWN' });
  t.is(w.calls, 0);
});

test('an effect begun by a caller stays pending across manager restarts and blocks a blind retry', (t) => {
  const { db, file } = openDb(t);
  const b = new EffectLedger(db).begin(root, pay);
  db.close();
  const db2 = new Database(file);
  t.teardown(() => db2.close());
  const after = EffectLedger.open(db2);
  t.like(after.get(b.effectId), { status: 'pending' });
  t.throws(() => after.begin(root, pay), { code: 'EFFECT_OUTCOME_UNKNOWN' });
  after.commit(b.effectId, { paid: true });
  const again = after.begin(root, pay);
  t.true(again.replayed);
});

test('an operator settles an unknown effect: committed replays, failed allows a new attempt', async (t) => {
  const l = ledger(t);
  const a = l.begin(root, pay);
  l.fail(a.effectId, new Error('socket hang up'), { definite: false });
  t.like(l.get(a.effectId), { status: 'unknown', error: { message: 'socket hang up' } });
  t.throws(() => l.resolveUnknown(a.effectId, { outcome: 'maybe' } as never), { code: 'INVALID_ARGUMENT' });
  l.resolveUnknown(a.effectId, { outcome: 'committed', output: { chargeId: 'ch_found' } });
  const w = world('never');
  t.deepEqual(await l.run(root, pay, w.fn), { chargeId: 'ch_found' });
  t.is(w.calls, 0);

  const mail: EffectSpec = { kind: 'mail.send', input: { to: 'a@b.c' }, reversibility: 'irreversible' };
  const m = l.begin(root, mail);
  l.fail(m.effectId, new Error('timeout'), { definite: false });
  t.like(l.resolveUnknown(m.effectId, { outcome: 'failed' }), { status: 'failed', definite: true });
  t.throws(() => l.resolveUnknown(m.effectId, { outcome: 'failed' }), { code: 'EFFECT_NOT_UNKNOWN' });
  t.is(await l.run(root, mail, world('sent').fn), 'sent');
  t.deepEqual(
    l
      .list('sbx_root')
      .filter((e) => e.kind === 'mail.send')
      .map((e) => [e.attempt, e.status]),
    [
      [1, 'failed'],
      [2, 'committed'],
    ],
  );
});

const failure = test.macro({
  async exec(t, thrown: unknown, expected: { status: EffectStatus; retried: boolean }) {
    const l = ledger(t);
    let calls = 0;
    const rejection = await l
      .run(root, pay, async () => {
        calls++;
        throw thrown;
      })
      .then(
        () => 'resolved',
        (e: unknown) => e,
      );
    t.is(rejection, thrown, 'the original error is rethrown');
    t.is(l.list('sbx_root')[0]!.status, expected.status);
    const second = l.run(root, pay, async () => {
      calls++;
      return 'ok';
    });
    if (expected.retried) t.is(await second, 'ok');
    else await t.throwsAsync(second, { code: 'EFFECT_OUTCOME_UNKNOWN' });
    t.is(calls, expected.retried ? 2 : 1);
  },
  title: (title) => `a throw from fn: ${title}`,
});
test('a plain error is an unknown outcome', failure, new Error('ECONNRESET'), { status: 'unknown', retried: false });
test(
  'an error marked definite may be retried',
  failure,
  Object.assign(new Error('card declined'), { definite: true }),
  { status: 'failed', retried: true },
);
test('a non-Error throw is an unknown outcome', failure, 'boom', { status: 'unknown', retried: false });

// --- scope across forks and rollbacks -----------------------------------------------------------

const fork: EffectContext = {
  sandboxId: 'sbx_fork',
  lineageId: 'sbx_root',
  branchId: 'br_fork',
  epochCheckpointId: 'ckpt_1',
};
const rolledBack: EffectContext = { ...root, branchId: 'br_2', epochCheckpointId: 'ckpt_1' };
const otherLineage: EffectContext = {
  sandboxId: 'sbx_other',
  lineageId: 'sbx_other',
  branchId: 'br_9',
  epochCheckpointId: null,
};

const scoped = test.macro({
  async exec(t, spec: EffectSpec, second: EffectContext, expectedCalls: number) {
    const l = ledger(t);
    const w = world('done');
    await l.run(root, spec, w.fn);
    await l.run(second, spec, w.fn);
    t.is(w.calls, expectedCalls);
  },
  title: (title, spec: EffectSpec, _second, expectedCalls: number) =>
    `${spec.reversibility}/${spec.scope ?? 'default'} ${title}: runs ${expectedCalls}x`,
});
const refund = { kind: 'refund', input: { charge: 'ch_1' } };
test('again in a fork of the lineage', scoped, pay, fork, 1);
test('again after a rollback', scoped, pay, rolledBack, 1);
test('again in another lineage', scoped, pay, otherLineage, 2);
test('again in a fork of the lineage', scoped, { ...pay, reversibility: 'compensable', compensation: refund }, fork, 1);
test('again in a fork of the lineage', scoped, { ...pay, scope: 'branch' }, fork, 2);
test('again on the same branch', scoped, { ...pay, scope: 'branch' }, root, 1);
test(
  'again after a rollback',
  scoped,
  { kind: 'fs.write', input: { path: '/w/a' }, reversibility: 'sandbox-local' },
  rolledBack,
  2,
);
test(
  'again on the same branch',
  scoped,
  { kind: 'fs.write', input: { path: '/w/a' }, reversibility: 'sandbox-local' },
  root,
  1,
);

test('a caller key dedupes within its lineage only, and cannot be reused for another effect', async (t) => {
  const l = ledger(t);
  const w = world(1);
  await l.run(root, { ...pay, key: 'order-7' }, w.fn);
  await l.run(fork, { ...pay, key: 'order-7' }, w.fn);
  await l.run(otherLineage, { ...pay, key: 'order-7' }, w.fn);
  t.is(w.calls, 2);
  t.throws(() => l.begin(root, { ...pay, input: { amount: 1 }, key: 'order-7' }), { code: 'IDEMPOTENCY_KEY_CONFLICT' });
});

// --- keys and validation ------------------------------------------------------------------------

test('deriveKey hashes canonical JSON: key order and whitespace do not matter, scope does', (t) => {
  t.is(
    canonicalJson({ b: [1, { d: 'x', c: null }], a: true, skip: undefined }),
    '{"a":true,"b":[1,{"c":null,"d":"x"}]}',
  );
  const base = { lineageId: 'L', kind: 'k', scope: 'lineage' as const };
  const k = deriveKey({ ...base, input: { a: 1, b: 2 } });
  t.regex(k, /^[0-9a-f]{64}$/);
  t.is(deriveKey({ ...base, input: { b: 2, a: 1 } }), k);
  t.is(deriveKey({ ...base, branchId: 'B1', input: { a: 1, b: 2 } }), k, 'lineage scope ignores the branch');
  t.not(deriveKey({ ...base, lineageId: 'L2', input: { a: 1, b: 2 } }), k);
  t.not(deriveKey({ ...base, toolCallId: 'call_1', input: { a: 1, b: 2 } }), k);
  t.not(
    deriveKey({ ...base, scope: 'branch', branchId: 'B1', input: { a: 1, b: 2 } }),
    deriveKey({ ...base, scope: 'branch', branchId: 'B2', input: { a: 1, b: 2 } }),
  );
  t.not(deriveKey({ ...base, input: null, key: 'x' }), deriveKey({ ...base, lineageId: 'L2', input: null, key: 'x' }));
  t.throws(() => deriveKey({ ...base, scope: 'branch', input: 1 }), { code: 'INVALID_ARGUMENT', message: /branchId/ });
});

const badBegin = test.macro({
  exec(t, ctx: EffectContext, spec: EffectSpec, field: string) {
    const l = ledger(t);
    const err = t.throws(() => l.begin(ctx, spec), { code: 'INVALID_ARGUMENT' });
    t.is((err as unknown as { field: string }).field, field);
    t.is(l.list({ lineageId: 'sbx_root' }).length, 0, 'nothing recorded');
  },
  title: (title, _ctx, _spec, field: string) => `begin rejects a bad ${field}${title ? ` (${title})` : ''}`,
});
test(badBegin, root, { ...pay, input: { cb: () => 1 } as never }, 'spec.input.cb');
test(badBegin, root, { ...pay, input: { n: 10n } as never }, 'spec.input.n');
test(badBegin, root, { ...pay, input: { list: [1, undefined] } as never }, 'spec.input.list[1]');
test(badBegin, root, { ...pay, input: { amount: Number.NaN } }, 'spec.input.amount');
test(badBegin, root, { ...pay, input: { when: new Date(0) } as never }, 'spec.input.when');
test(badBegin, root, { ...pay, reversibility: 'undoable' as never }, 'spec.reversibility');
test(badBegin, root, { ...pay, reversibility: 'compensable' }, 'spec.compensation');
test('on an irreversible effect', badBegin, root, { ...pay, compensation: refund }, 'spec.compensation');
test(badBegin, root, { kind: 'fs.write', input: {}, reversibility: 'sandbox-local', scope: 'lineage' }, 'spec.scope');
test(badBegin, root, { ...pay, kind: '' }, 'spec.kind');
test(badBegin, { ...root, lineageId: '' }, pay, 'ctx.lineageId');

test('settling twice or settling an unknown id are typed errors', (t) => {
  const l = ledger(t);
  const b = l.begin(root, pay);
  l.commit(b.effectId, 'ok');
  t.throws(() => l.commit(b.effectId, 'again'), { code: 'EFFECT_ALREADY_SETTLED' });
  t.throws(() => l.fail(b.effectId, new Error('x'), { definite: true }), { code: 'EFFECT_ALREADY_SETTLED' });
  t.throws(() => l.commit('eff_missing', 'x'), { code: 'EFFECT_NOT_FOUND' });
  t.throws(() => l.commit(l.begin(root, { ...pay, kind: 'other' }).effectId, { f: () => 1 } as never), {
    code: 'INVALID_ARGUMENT',
    message: /output\.f/,
  });
});

// --- timelines: seal, cursor, effectsAfter, rollback policy ---------------------------------------

/** Checkpoint tree: ckpt_1 → ckpt_2, and ckpt_1 → ckpt_3 (the timeline after a rollback). */
const parents: Record<string, string | null> = { ckpt_1: null, ckpt_2: 'ckpt_1', ckpt_3: 'ckpt_1' };
function ancestorOrSelf(target: string): (id: string) => boolean {
  return (id) => {
    for (let c: string | null | undefined = target; c; c = parents[c]) if (c === id) return true;
    return false;
  };
}

test('effectsAfter lists what happened after the target checkpoint, and the policy warns or refuses', async (t) => {
  const l = ledger(t);
  await l.run(root, { ...pay, input: { amount: 1 } }, async () => 'ch_early');
  t.is(l.seal('sbx_root', 'ckpt_1'), 1);
  const c1 = l.cursor('sbx_root');
  const at1 = { ...root, epochCheckpointId: 'ckpt_1' };
  await l.run(
    at1,
    {
      kind: 'hotel.book',
      input: { night: 1 },
      reversibility: 'compensable',
      compensation: { kind: 'hotel.cancel', input: { night: 1 } },
    },
    async () => ({ booking: 'b1' }),
  );
  await l.run(at1, { kind: 'fs.write', input: { path: 'a' }, reversibility: 'sandbox-local' }, async () => undefined);
  l.seal('sbx_root', 'ckpt_2');
  await l.run(at1, { ...pay, input: { amount: 2 } }, async () => 'ch_late');
  await l
    .run(at1, { ...pay, input: { amount: 3 } }, async () => {
      throw Object.assign(new Error('declined'), { definite: true });
    })
    .catch(() => undefined);
  t.true(l.cursor('sbx_root') > c1);

  const after = l.effectsAfter('sbx_root', 'ckpt_1', ancestorOrSelf('ckpt_1'));
  t.deepEqual(
    after.map((e) => [e.kind, e.status, e.sealedBy]),
    [
      ['hotel.book', 'committed', 'ckpt_2'],
      ['fs.write', 'committed', 'ckpt_2'],
      ['payments.charge', 'committed', null],
      ['payments.charge', 'failed', null],
    ],
  );
  t.deepEqual(
    l.effectsAfter('sbx_root', 'ckpt_2', ancestorOrSelf('ckpt_2')).map((e) => e.output),
    ['ch_late', undefined],
  );

  const warnings = checkRollbackPolicy(after, 'warn');
  t.deepEqual(
    warnings.map((w) => [w.kind, w.reason]),
    [
      ['hotel.book', 'not-compensated'],
      ['payments.charge', 'irreversible'],
    ],
  );
  const err = t.throws(() => checkRollbackPolicy(after, 'refuse'), {
    code: 'ROLLBACK_REFUSED_IRREVERSIBLE',
    instanceOf: IrreversibleEffectError,
  });
  t.deepEqual(
    (err as IrreversibleEffectError).effects.map((e) => e.output),
    ['ch_late'],
  );
  t.throws(() => checkRollbackPolicy(after, 'ignore' as never), { code: 'INVALID_ARGUMENT' });

  // Roll back to ckpt_1; the next checkpoint (ckpt_3) must not seal the abandoned effects.
  l.applyRollback('sbx_root', 'ckpt_1', ancestorOrSelf('ckpt_1'), 'rb_1');
  await l.run(
    { ...root, branchId: 'br_2', epochCheckpointId: 'ckpt_1' },
    { kind: 'fs.write', input: { path: 'b' }, reversibility: 'sandbox-local' },
    async () => undefined,
  );
  t.is(l.seal('sbx_root', 'ckpt_3'), 1);
  t.deepEqual(
    l.effectsAfter('sbx_root', 'ckpt_3', ancestorOrSelf('ckpt_3')).map((e) => [e.kind, e.abandonedBy]),
    [
      ['hotel.book', null],
      ['fs.write', null],
      ['payments.charge', 'rb_1'],
      ['payments.charge', 'rb_1'],
    ],
  );
});

test('an unknown irreversible effect also blocks a refusing rollback', (t) => {
  const l = ledger(t);
  const b = l.begin(root, pay);
  l.fail(b.effectId, new Error('timeout'), { definite: false });
  const warnings = checkRollbackPolicy(
    l.effectsAfter('sbx_root', 'ckpt_1', () => false),
    'warn',
  );
  t.deepEqual(
    warnings.map((w) => w.reason),
    ['outcome-unknown'],
  );
  t.throws(
    () =>
      checkRollbackPolicy(
        l.effectsAfter('sbx_root', 'ckpt_1', () => false),
        'refuse',
      ),
    { code: 'ROLLBACK_REFUSED_IRREVERSIBLE' },
  );
});

test('a fork sees its parent effects up to the fork point when it rolls back past it', async (t) => {
  const l = ledger(t);
  await l.run(root, pay, async () => 'ch_1');
  l.seal('sbx_root', 'ckpt_1');
  await l.run(root, { ...pay, input: { amount: 9 } }, async () => 'ch_after_fork_point');
  l.seal('sbx_root', 'ckpt_2');
  t.is(l.inheritForFork('sbx_root', 'ckpt_1', 'sbx_fork', ancestorOrSelf('ckpt_1')), 1);
  t.is(l.inheritForFork('sbx_root', 'ckpt_1', 'sbx_fork', ancestorOrSelf('ckpt_1')), 0, 'idempotent');
  await l.run(fork, { kind: 'fs.write', input: {}, reversibility: 'sandbox-local' }, async () => undefined);
  // Rolling the fork back to before ckpt_1 (nothing is an ancestor) reports the inherited charge too.
  t.deepEqual(
    l.effectsAfter('sbx_fork', 'ckpt_0', () => false).map((e) => e.output),
    ['ch_1', undefined],
  );
  t.deepEqual(
    l.effectsAfter('sbx_fork', 'ckpt_1', ancestorOrSelf('ckpt_1')).map((e) => e.kind),
    ['fs.write'],
  );
  t.deepEqual(
    l.list('sbx_fork').map((e) => e.kind),
    ['fs.write'],
    'list() shows rows the sandbox recorded',
  );
  t.is(l.list({ lineageId: 'sbx_root' }).length, 3);
});

// --- compensation -----------------------------------------------------------------------------

function book(night: number): EffectSpec {
  return {
    kind: 'hotel.book',
    input: { night },
    reversibility: 'compensable',
    compensation: { kind: 'hotel.cancel', input: { night } },
  };
}

test('compensate runs compensations in reverse commit order, each as its own linked row', async (t) => {
  const l = ledger(t);
  const ids: string[] = [];
  for (const night of [1, 2, 3]) {
    const b = l.begin(root, book(night));
    ids.push(b.effectId);
  }
  // Commit out of begin order: commit order is what counts.
  l.commit(ids[1]!, 'b2');
  l.commit(ids[0]!, 'b1');
  l.commit(ids[2]!, 'b3');
  const order: unknown[] = [];
  const results = await l.compensate(ids, async (e) => {
    order.push(e.compensation!.input);
    return { cancelled: e.output ?? null };
  });
  t.deepEqual(order, [{ night: 3 }, { night: 1 }, { night: 2 }]);
  t.deepEqual(
    results.map((r) => r.output),
    [{ cancelled: 'b3' }, { cancelled: 'b1' }, { cancelled: 'b2' }],
  );
  for (const r of results) {
    t.like(l.get(r.effectId), { status: 'compensated', compensatedBy: r.compensationId });
    t.like(l.get(r.compensationId), { status: 'committed', kind: 'hotel.cancel', compensatesId: r.effectId });
  }
  // Again: nothing runs twice.
  let calls = 0;
  const again = await l.compensate(ids, async () => {
    calls++;
  });
  t.is(calls, 0);
  t.true(again.every((r) => r.replayed));
  // A compensated effect may be done again for real.
  t.is(await l.run(root, book(1), async () => 'b1-again'), 'b1-again');
});

test('compensate { after } picks the compensable effects after the target and stops at a failure', async (t) => {
  const l = ledger(t);
  await l.run(root, book(1), async () => 'b1');
  l.seal('sbx_root', 'ckpt_1');
  await l.run(root, book(2), async () => 'b2');
  await l.run(root, book(3), async () => 'b3');
  await l.run(root, pay, async () => 'ch');
  const seen: unknown[] = [];
  await t.throwsAsync(
    l.compensate(
      { after: { sandboxId: 'sbx_root', targetCheckpointId: 'ckpt_1', isAncestorOrSelf: ancestorOrSelf('ckpt_1') } },
      async (e) => {
        seen.push(e.output);
        throw new Error('hotel API down');
      },
    ),
    { message: 'hotel API down' },
  );
  t.deepEqual(seen, ['b3'], 'stopped after the first failure');
  const rows = l.list('sbx_root');
  t.deepEqual(
    rows.map((e) => [e.kind, e.status]),
    [
      ['hotel.book', 'committed'],
      ['hotel.book', 'committed'],
      ['hotel.book', 'committed'],
      ['payments.charge', 'committed'],
      ['hotel.cancel', 'unknown'],
    ],
  );
  await t.throwsAsync(
    l.compensate(
      { after: { sandboxId: 'sbx_root', targetCheckpointId: 'ckpt_1', isAncestorOrSelf: ancestorOrSelf('ckpt_1') } },
      async () => 'x',
    ),
    { code: 'EFFECT_OUTCOME_UNKNOWN' },
  );
});

test('compensate refuses effects that are not committed compensable ones', async (t) => {
  const l = ledger(t);
  await l.run(root, pay, async () => 'ch');
  const [charge] = l.list('sbx_root');
  await t.throwsAsync(
    l.compensate([charge!.id], async () => 'x'),
    { code: 'EFFECT_NOT_COMPENSABLE' },
  );
  await t.throwsAsync(
    l.compensate(['eff_missing'], async () => 'x'),
    { code: 'EFFECT_NOT_FOUND' },
  );
  await t.throwsAsync(
    l.compensate('eff_x' as never, async () => 'x'),
    { code: 'INVALID_ARGUMENT' },
  );
});
