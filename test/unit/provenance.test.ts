import test, { type ExecutionContext } from 'ava';
import Database from 'better-sqlite3';
import { type ObservationInput, ObservationLog } from '../../src/provenance/observations.js';
import { type VerdictInput, VerdictLog } from '../../src/provenance/verdicts.js';
import { openTestDb } from '../helpers/sqlite.js';

function openDb(t: ExecutionContext): Database.Database {
  return openTestDb(t, 'provenance');
}

/**
 * Checkpoint tree of the tests:
 *   ckpt_1 → ckpt_2 → ckpt_4
 *   ckpt_1 → ckpt_3            (taken after a rollback to ckpt_1)
 */
const parents: Record<string, string | null> = { ckpt_1: null, ckpt_2: 'ckpt_1', ckpt_3: 'ckpt_1', ckpt_4: 'ckpt_2' };
function ancestorOrSelf(target: string): (id: string) => boolean {
  return (id) => {
    for (let c: string | null | undefined = target; c; c = parents[c]) if (c === id) return true;
    return false;
  };
}

const on = { sandboxId: 'sbx_a', branchId: 'br_1', lineageId: 'sbx_a', epochCheckpointId: null };
function obs(log: ObservationLog, subject: string, extra: Partial<ObservationInput> = {}) {
  return log.record({ ...on, kind: 'file-read', subject, ...extra });
}

test('record assigns obs_ ids and a monotonic seq', (t) => {
  const log = new ObservationLog(openDb(t), () => 7);
  const a = obs(log, '/w/a');
  const b = log.record({
    ...on,
    kind: 'command',
    subject: 'npm test',
    exitCode: 1,
    summary: '3 failing',
    toolCallId: 'call_1',
  });
  t.regex(a.id, /^obs_[0-9a-f]{20}$/);
  t.true(b.seq > a.seq);
  t.like(b, {
    kind: 'command',
    subject: 'npm test',
    exitCode: 1,
    summary: '3 failing',
    toolCallId: 'call_1',
    sealedBy: null,
    staleRollbackId: null,
    createdAt: 7,
  });
  t.deepEqual(log.get(b.id), b);
  t.throws(() => log.get('obs_missing'), { code: 'OBSERVATION_NOT_FOUND' });
});

const badRecord = test.macro({
  exec(t, input: unknown, field: string) {
    const log = new ObservationLog(openDb(t));
    const err = t.throws(() => log.record(input as ObservationInput), { code: 'INVALID_ARGUMENT' });
    t.is((err as unknown as { field: string }).field, field);
  },
  title: (_title, _input, field: string) => `record rejects a bad ${field}`,
});
test(badRecord, { ...on, kind: 'file-peek', subject: 'x' }, 'observation.kind');
test(badRecord, { ...on, kind: 'command', subject: '' }, 'observation.subject');
test(badRecord, { ...on, kind: 'command', subject: 'ls', exitCode: 1.5 }, 'observation.exitCode');
test(badRecord, { ...on, sandboxId: undefined, kind: 'command', subject: 'ls' }, 'observation.sandboxId');

test('a rollback makes stale what was seen after the target, and only that', (t) => {
  const log = new ObservationLog(openDb(t));
  const o1 = obs(log, '/w/one');
  t.is(log.seal('sbx_a', 'ckpt_1'), 1);
  const o2 = obs(log, '/w/two');
  log.seal('sbx_a', 'ckpt_2');
  const o3 = obs(log, '/w/three'); // unsealed: after the latest checkpoint

  const stale = log.staleAfterRollback('sbx_a', 'ckpt_1', ancestorOrSelf('ckpt_1'));
  t.deepEqual(
    stale.map((o) => o.id),
    [o2.id, o3.id],
  );
  t.is(log.markStale([o2.id, o3.id], 'rb_1'), 2);
  t.is(log.markStale([o2.id], 'rb_other'), 0, 'the first stale mark stays');
  t.deepEqual(
    log.list('sbx_a', { includeStale: false }).map((o) => o.id),
    [o1.id],
  );
  t.is(log.get(o3.id).staleRollbackId, 'rb_1');

  // The new timeline: o4 is sealed by ckpt_3, the abandoned unsealed o3 is not.
  const o4 = obs(log, '/w/four', { branchId: 'br_2', epochCheckpointId: 'ckpt_1' });
  t.is(log.seal('sbx_a', 'ckpt_3'), 1);
  t.like(log.get(o3.id), { sealedBy: null });
  t.like(log.get(o4.id), { sealedBy: 'ckpt_3' });
});

test('applyRollback marks stale and revives what a rollback to an old checkpoint makes true again', (t) => {
  const log = new ObservationLog(openDb(t));
  const o1 = obs(log, '/w/one');
  log.seal('sbx_a', 'ckpt_1');
  const o2 = obs(log, '/w/two');
  log.seal('sbx_a', 'ckpt_2');
  const o3 = obs(log, '/w/three');

  const first = log.applyRollback('sbx_a', 'ckpt_1', ancestorOrSelf('ckpt_1'), 'rb_1');
  t.deepEqual(
    first.map((o) => [o.id, o.staleRollbackId]),
    [
      [o2.id, 'rb_1'],
      [o3.id, 'rb_1'],
    ],
  );
  const o4 = obs(log, '/w/four', { branchId: 'br_2' });
  log.seal('sbx_a', 'ckpt_3');

  // Back to ckpt_2 on the abandoned timeline: o2 holds again, o4 (ckpt_3) goes stale, o3 never was sealed.
  const second = log.applyRollback('sbx_a', 'ckpt_2', ancestorOrSelf('ckpt_2'), 'rb_2');
  t.deepEqual(
    second.map((o) => o.id),
    [o4.id],
  );
  t.deepEqual(
    log.list('sbx_a', { includeStale: false }).map((o) => o.id),
    [o1.id, o2.id],
  );
  t.is(log.get(o3.id).staleRollbackId, 'rb_1');
});

test('a fork inherits the observations of its fork point; its rollbacks do not touch the parent', (t) => {
  const log = new ObservationLog(openDb(t));
  const o1 = obs(log, '/w/one');
  log.seal('sbx_a', 'ckpt_1');
  const o2 = log.record({ ...on, kind: 'command', subject: 'make', exitCode: 0 });
  log.seal('sbx_a', 'ckpt_2');
  obs(log, '/w/after-fork-point');
  log.seal('sbx_a', 'ckpt_4');
  obs(log, '/w/unsealed');

  t.is(log.inheritForFork('sbx_a', 'ckpt_2', 'sbx_b', 'br_b', ancestorOrSelf('ckpt_2')), 2);
  t.is(log.inheritForFork('sbx_a', 'ckpt_2', 'sbx_b', 'br_b', ancestorOrSelf('ckpt_2')), 0, 'idempotent');
  const child = log.list('sbx_b');
  t.deepEqual(
    child.map((o) => [o.subject, o.inheritedFrom, o.sealedBy, o.branchId]),
    [
      ['/w/one', o1.id, 'ckpt_1', 'br_b'],
      ['make', o2.id, 'ckpt_2', 'br_b'],
    ],
  );

  // A grandchild forked from the child traces back to the original observation.
  t.is(log.inheritForFork('sbx_b', 'ckpt_2', 'sbx_c', 'br_c', ancestorOrSelf('ckpt_2')), 2);
  t.deepEqual(
    log.list('sbx_c').map((o) => o.inheritedFrom),
    [o1.id, o2.id],
  );

  const stale = log.applyRollback('sbx_b', 'ckpt_1', ancestorOrSelf('ckpt_1'), 'rb_b');
  t.deepEqual(
    stale.map((o) => o.subject),
    ['make'],
  );
  t.is(log.get(o2.id).staleRollbackId, null, "the parent's observation is still true in the parent");
});

// --- verdicts -----------------------------------------------------------------------------------

const at = { sandboxId: 'sbx_a', branchId: 'br_1' };
function hashes(files: Record<string, string>): (path: string) => string | null {
  return (p) => files[p] ?? null;
}

test('a verdict holds while its file keeps the judged content, and goes stale when it changes or vanishes', (t) => {
  const log = new VerdictLog(openDb(t));
  const kept = log.record({ ...at, path: '/w/a.ts', contentHash: 'h_a', verdict: 'tests:pass' });
  const changed = log.record({
    ...at,
    path: '/w/b.ts',
    contentHash: 'h_b1',
    verdict: 'lint:clean',
    toolCallId: 'call_9',
  });
  const gone = log.record({ ...at, path: '/w/c.ts', contentHash: 'h_c', verdict: 'tests:pass' });
  t.regex(kept.id, /^vrd_[0-9a-f]{20}$/);

  const stale = log.staleVerdicts('sbx_a', hashes({ '/w/a.ts': 'h_a', '/w/b.ts': 'h_b2' }));
  t.deepEqual(
    stale.map((v) => [v.id, v.currentHash]),
    [
      [changed.id, 'h_b2'],
      [gone.id, null],
    ],
  );
  t.is(stale[0]!.toolCallId, 'call_9');
});

test('the malware-scan verdict does not survive a rollback that restores the unscanned file', (t) => {
  const log = new VerdictLog(openDb(t));
  // The agent cleaned the repository, scanned the result and recorded the verdict on those bytes.
  log.record({ ...at, path: '/w/release.tgz', contentHash: 'sha256:cleaned', verdict: 'malware-scan:clean' });
  t.truthy(log.currentVerdict('sbx_a', '/w/release.tgz', 'malware-scan:clean', 'sha256:cleaned'));
  // Rollback restored the pre-cleanup file.
  const after = hashes({ '/w/release.tgz': 'sha256:infected' });
  t.is(log.currentVerdict('sbx_a', '/w/release.tgz', 'malware-scan:clean', after('/w/release.tgz')), null);
  t.deepEqual(
    log.staleVerdicts('sbx_a', after).map((v) => v.verdict),
    ['malware-scan:clean'],
  );
});

test('no verdict supersedes another: every one that no longer matches its file is stale', (t) => {
  const log = new VerdictLog(openDb(t));
  const older = log.record({ ...at, path: '/w/a.ts', contentHash: 'h1', verdict: 'tests:pass' });
  const newer = log.record({ ...at, path: '/w/a.ts', contentHash: 'h2', verdict: 'tests:pass' });
  const lint = log.record({ ...at, path: '/w/a.ts', contentHash: 'h1', verdict: 'lint:clean' });
  t.deepEqual(
    log.staleVerdicts('sbx_a', hashes({ '/w/a.ts': 'h2' })).map((v) => v.id),
    [older.id, lint.id],
  );
  t.deepEqual(
    log.staleVerdicts('sbx_a', hashes({ '/w/a.ts': 'h1' })).map((v) => v.id),
    [newer.id],
  );
  t.is(log.currentVerdict('sbx_a', '/w/a.ts', 'tests:pass', 'h2')?.id, newer.id);
});

test('a rollback judges the verdicts of the restored timeline and those it abandons, each once', (t) => {
  const log = new VerdictLog(openDb(t));
  const v1 = log.record({ ...at, path: '/w/a', contentHash: 'h1', verdict: 'ok' });
  log.seal('sbx_a', 'ckpt_1');
  const v2 = log.record({ ...at, path: '/w/a', contentHash: 'h2', verdict: 'ok' });
  log.seal('sbx_a', 'ckpt_2');
  const v3 = log.record({ ...at, path: '/w/b', contentHash: 'hb', verdict: 'ok' }); // unsealed

  const first = log.applyRollback('sbx_a', ancestorOrSelf('ckpt_1'), 'rb_1');
  t.deepEqual(
    first.restored.map((v) => v.id),
    [v1.id],
  );
  t.deepEqual(
    first.abandoned.map((v) => v.id),
    [v2.id, v3.id],
  );
  // ckpt_1's files: /w/a has h1, /w/b does not exist.
  t.deepEqual(
    log.staleAfterRollback(first, hashes({ '/w/a': 'h1' })).map((v) => [v.id, v.currentHash]),
    [
      [v2.id, 'h1'],
      [v3.id, null],
    ],
  );

  // The new timeline: v4 is sealed by ckpt_3, the abandoned unsealed v3 is not.
  const v4 = log.record({ ...at, branchId: 'br_2', path: '/w/a', contentHash: 'h4', verdict: 'ok' });
  t.is(log.seal('sbx_a', 'ckpt_3'), 1);
  t.like(
    log.list('sbx_a').find((v) => v.id === v3.id),
    { sealedBy: null, abandonedBy: 'rb_1' },
  );

  // Forward to ckpt_4 (after ckpt_2): v1 and v2 are its history again; v4 is left behind; v3 was reported at rb_1.
  const second = log.applyRollback('sbx_a', ancestorOrSelf('ckpt_4'), 'rb_2');
  t.deepEqual(
    second.restored.map((v) => [v.id, v.abandonedBy]),
    [
      [v1.id, null],
      [v2.id, null],
    ],
  );
  t.deepEqual(
    second.abandoned.map((v) => v.id),
    [v4.id],
  );
  t.deepEqual(
    log.staleAfterRollback(second, hashes({ '/w/a': 'h2' })).map((v) => v.id),
    [v1.id, v4.id],
  );
  // Asked about content alone, every verdict of the sandbox counts, on any timeline.
  t.deepEqual(
    log.staleVerdicts('sbx_a', hashes({ '/w/a': 'h2' })).map((v) => v.id),
    [v1.id, v3.id, v4.id],
  );
});

test('a fork inherits the verdicts of its fork point, sealed as they were; content decides whether they hold there', (t) => {
  const log = new VerdictLog(openDb(t));
  const v = log.record({ ...at, path: '/w/a.ts', contentHash: 'h1', verdict: 'tests:pass' });
  log.seal('sbx_a', 'ckpt_2');
  log.record({ ...at, path: '/w/a.ts', contentHash: 'h2', verdict: 'tests:pass' });
  log.seal('sbx_a', 'ckpt_4');
  log.record({ ...at, path: '/w/a.ts', contentHash: 'h3', verdict: 'tests:pass' }); // unsealed
  t.is(log.inheritForFork('sbx_a', 'sbx_b', 'br_b', ancestorOrSelf('ckpt_2')), 1);
  t.is(log.inheritForFork('sbx_a', 'sbx_b', 'br_b', ancestorOrSelf('ckpt_2')), 0);
  t.like(log.list('sbx_b')[0], {
    inheritedFrom: v.id,
    sandboxId: 'sbx_b',
    branchId: 'br_b',
    contentHash: 'h1',
    sealedBy: 'ckpt_2',
    abandonedBy: null,
  });
  t.is(log.staleVerdicts('sbx_b', hashes({ '/w/a.ts': 'h1' })).length, 0);
});

const badVerdict = test.macro({
  exec(t, input: unknown, field: string) {
    const log = new VerdictLog(openDb(t));
    const err = t.throws(() => log.record(input as VerdictInput), { code: 'INVALID_ARGUMENT' });
    t.is((err as unknown as { field: string }).field, field);
  },
  title: (_title, _input, field: string) => `verdict record rejects a bad ${field}`,
});
test(badVerdict, { ...at, path: '/w/a', verdict: 'ok' }, 'verdict.contentHash');
test(badVerdict, { ...at, path: '', contentHash: 'h', verdict: 'ok' }, 'verdict.path');
test(badVerdict, { ...at, path: '/w/a', contentHash: 'h', verdict: 'ok', observationId: 5 }, 'verdict.observationId');
