/**
 * Stored replies are bounded (issue 23, finding 11): per reply, per tenant and
 * in all. A real SQLite database in memory; the store's rules only.
 */
import test from 'ava';
import Database from 'better-sqlite3';
import { IdempotencyStore, type ReplyLimits } from '../../src/http/idempotency.js';
import { StoredReplies } from '../../src/tenants/replies.js';
import { HttpError } from '../../src/http/errors.js';

const limits: ReplyLimits = { replyBytes: 1000, tenantBytes: 8000, totalBytes: 12_000 };

function store(now = { t: 1_700_000_000_000 }) {
  const db = new Database(':memory:');
  return { db, now, s: new IdempotencyStore(new StoredReplies(db), () => now.t, limits) };
}

function run(s: IdempotencyStore, tenant: string, key: string, body: string): boolean {
  if (s.claim(tenant, key, 'h' + key) !== undefined) throw new Error(`${key} replayed`);
  const kept = s.store(tenant, key, 'h' + key, { status: 200, body, streamed: false });
  s.release(tenant, key);
  return kept;
}

test('a reply over the per-reply limit is not kept: a retry is IDEMPOTENCY_KEY_CONFLICT, not a re-run', (t) => {
  const { s } = store();
  t.false(run(s, 'a', 'big', 'x'.repeat(1001)));
  t.true(s.storedBytes('a').tenant < 200, `a "ran, not kept" row costs ${s.storedBytes('a').tenant} bytes`);
  const e = t.throws(() => s.claim('a', 'big', 'hbig'), { instanceOf: HttpError });
  t.is(e!.code, 'IDEMPOTENCY_KEY_CONFLICT');
  t.like((e as HttpError).details, { replyBytes: 1001, replyLimitBytes: 1000 });
  t.is((e as HttpError).statusCode, 409);
  // The same key for another request is still REUSED.
  t.throws(() => s.claim('a', 'big', 'other'), { code: 'IDEMPOTENCY_KEY_REUSED' });
  // A small one is kept and replayed.
  t.true(run(s, 'a', 'small', 'ok'));
  t.deepEqual(s.claim('a', 'small', 'hsmall'), { status: 200, body: 'ok', streamed: false });
});

test('replies fill the tenant budget less its headroom; then only "ran" rows; at the budget keyed requests are RATE_LIMITED with Retry-After; other tenants are not', (t) => {
  const { s, now, db } = store();
  let kept = 0;
  let i = 0;
  for (; i < 100; i++) {
    try {
      if (run(s, 'a', `k${i}`, 'y'.repeat(900))) kept++;
    } catch (e) {
      t.is((e as HttpError).code, 'RATE_LIMITED');
      t.true(((e as HttpError).details as { retryAfterS: number }).retryAfterS > 0);
      t.like((e as HttpError).details, { scope: 'tenant', limit: 8000 });
      break;
    }
  }
  t.true(i < 100, 'the budget refused a keyed request');
  t.true(kept >= 6 && kept <= 7, `${kept} replies of ~1 KB kept in 8000 - 1000 bytes`);
  const used = s.storedBytes('a').tenant;
  t.true(used <= 8000, `${used} bytes stored, within 8000`);
  const rows = (db.prepare('SELECT SUM(length(body)) AS n FROM http_idempotency').get() as { n: number }).n;
  t.true(rows <= 7000, `bodies hold ${rows} bytes`);
  // Another tenant still has its own budget.
  t.true(run(s, 'b', 'k0', 'z'.repeat(900)));
  // A day later the rows expire and the tenant is served again.
  now.t += 24 * 3600 * 1000 + 1;
  s.sweep();
  t.true(run(s, 'a', 'later', 'fresh'));
});

test('the manager-wide budget bounds all tenants together', (t) => {
  const { s } = store();
  let refused: HttpError | undefined;
  for (let n = 0; n < 200 && !refused; n++) {
    try {
      run(s, `t${n % 4}`, `k${n}`, 'w'.repeat(900));
    } catch (e) {
      refused = e as HttpError;
    }
  }
  t.is(refused?.code, 'RATE_LIMITED');
  t.true(s.storedBytes('t0').total <= 12_000, `${s.storedBytes('t0').total} bytes in all`);
});
