/** Admission: per-key and total bounds refuse at once with RATE_LIMITED and a Retry-After; releases are idempotent. */
import test from 'ava';
import { Admission } from '../../src/admission.js';
import { RateLimitedError } from '../../src/errors.js';

test('per-key bound refuses the next one for that key only, and admits again after a release', (t) => {
  const a = new Admission({ what: 'command waits', perKey: 2, total: 10, retryAfterS: 3 });
  const r1 = a.enter('t1');
  a.enter('t1');
  const err = t.throws(() => a.enter('t1'), { instanceOf: RateLimitedError });
  t.is(err.code, 'RATE_LIMITED');
  t.is(err.retryAfterS, 3);
  t.deepEqual(err.details, { what: 'command waits', limit: 2, scope: 'tenant', retryAfterS: 3 });
  t.notThrows(() => a.enter('t2'));
  r1();
  r1(); // idempotent: does not free a second slot
  t.is(a.inFlight('t1'), 1);
  t.notThrows(() => a.enter('t1'));
  t.throws(() => a.enter('t1'), { instanceOf: RateLimitedError });
  t.is(a.inFlight(), 3);
});

test('the total bound refuses every key, naming the manager', (t) => {
  const a = new Admission({ what: 'listings', perKey: 5, total: 2 });
  a.enter('a');
  a.enter('b');
  const err = t.throws(() => a.enter('c'), { instanceOf: RateLimitedError });
  t.is(err.details.scope, 'manager');
  t.regex(err.message, /at most 2/);
});

test('run releases when the work throws', async (t) => {
  const a = new Admission({ what: 'streams', perKey: 1, total: 1 });
  await t.throwsAsync(
    a.run('k', () => Promise.reject(new Error('boom'))),
    { message: 'boom' },
  );
  t.is(a.inFlight(), 0);
  t.is(await a.run('k', () => Promise.resolve(7)), 7);
});

test('limits must be positive integers', (t) => {
  t.throws(() => new Admission({ what: 'x', perKey: 0, total: 1 }), { instanceOf: RangeError });
  t.throws(() => new Admission({ what: 'x', perKey: 1, total: 1.5 }), { instanceOf: RangeError });
});
