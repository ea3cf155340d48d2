/** The HTTP layer's pure parts: error mapping, idempotency store, wire formats, operation drain. */
import test from 'ava';
import Database from 'better-sqlite3';
import { HttpError, describeValidation, fieldName, statusForCode, toErrorResponse } from '../../src/http/errors.js';
import {
  IDEMPOTENCY_TTL_MS,
  IdempotencyStore,
  requestHash,
  validateIdempotencyKey,
} from '../../src/http/idempotency.js';
import { OperationTracker } from '../../src/http/operations.js';
import { contextFromWire, contextToWire, renameField } from '../../src/api/wire.js';
import { InvalidArgumentError, InvalidStateError, LockstepError, NotFoundError } from '../../src/errors.js';
import { QuotaExceededError } from '../../src/tenants/quotas.js';
import { StoredReplies } from '../../src/tenants/replies.js';

const statuses: [string, number][] = [
  ['SANDBOX_NOT_FOUND', 404],
  ['CHECKPOINT_NOT_FOUND', 404],
  ['EFFECT_NOT_FOUND', 404],
  ['FILE_NOT_FOUND', 404],
  ['INVALID_ARGUMENT', 400],
  ['PATH_ESCAPES_SANDBOX', 400],
  ['FILE_TYPE_NOT_SUPPORTED', 400],
  ['FILE_BUSY', 409],
  ['FILE_TOO_LARGE', 413],
  ['SANDBOX_BUSY', 409],
  ['TENANT_EXISTS', 409],
  ['IMAGE_IN_USE', 409],
  ['EFFECT_OUTCOME_UNKNOWN', 409],
  ['ROLLBACK_REFUSED_IRREVERSIBLE', 409],
  ['CHECKPOINT_CORRUPT', 409],
  ['DISK_FULL', 507],
  ['QUOTA_EXCEEDED', 429],
  ['COMMAND_TIMEOUT', 504],
  ['SUPERVISOR_UNREACHABLE', 503],
  ['SUPERVISOR_TIMEOUT', 503],
  ['CRIU_DUMP_FAILED', 500],
  ['SOMETHING_NEW', 500],
];
for (const [code, status] of statuses) test(`${code} → ${status}`, (t) => t.is(statusForCode(code), status));

test('other state errors are conflicts; HttpErrors keep their status', (t) => {
  t.is(statusForCode('EFFECT_ALREADY_SETTLED', new InvalidStateError('EFFECT_ALREADY_SETTLED', 'x')), 409);
  t.is(statusForCode('UNAUTHENTICATED', new HttpError(401, 'UNAUTHENTICATED', 'x')), 401);
});

test('error bodies: field for bad input, the message for 4xx, nothing internal for 5xx', (t) => {
  t.deepEqual(toErrorResponse(new InvalidArgumentError('memoryMb', 'an integer', 'x')), {
    status: 400,
    internal: false,
    body: {
      error: {
        code: 'INVALID_ARGUMENT',
        message: 'Invalid memoryMb: expected an integer, received "x"',
        field: 'memoryMb',
      },
    },
  });
  t.deepEqual(toErrorResponse(new NotFoundError('sandbox', 'sbx_1')).body, {
    error: { code: 'SANDBOX_NOT_FOUND', message: 'No sandbox with id "sbx_1"' },
  });
  t.is(toErrorResponse(new QuotaExceededError('acme', 'maxSandboxes', 1, 1, 1)).status, 429);
  const secret = new LockstepError(
    'CRIU_DUMP_FAILED',
    'dump failed\n--- criu log (tail) ---\n/var/lib/lockstep/secret/path',
  );
  const five = toErrorResponse(secret);
  t.is(five.status, 500);
  t.true(five.internal);
  t.false(JSON.stringify(five.body).includes('/var/lib'));
  t.deepEqual(toErrorResponse(new TypeError("Cannot read properties of undefined (reading 'x')")).body, {
    error: { code: 'INTERNAL', message: 'Internal error; the server log has the details' },
  });
  t.deepEqual(
    toErrorResponse(Object.assign(new Error('too big'), { code: 'FST_ERR_CTP_BODY_TOO_LARGE', statusCode: 413 }))
      .status,
    413,
  );
});

test('ajv errors name the field in the body, query or path', (t) => {
  t.is(fieldName(''), '');
  t.is(fieldName('/memoryMb'), 'memoryMb');
  t.is(fieldName('/cmd/1'), 'cmd[1]');
  t.is(fieldName('/context/messages/0/role'), 'context.messages[0].role');
  t.is(fieldName('/envs', 'A~1B'), 'envs.A~1B');
  t.deepEqual(
    describeValidation([{ keyword: 'required', instancePath: '', params: { missingProperty: 'cmd' } }], 'body'),
    { field: 'cmd', message: 'Missing required field cmd' },
  );
  t.deepEqual(
    describeValidation(
      [{ keyword: 'additionalProperties', instancePath: '/compensation', params: { additionalProperty: 'x' } }],
      'body',
    ),
    {
      field: 'compensation.x',
      message: 'Unknown field compensation.x',
    },
  );
  t.deepEqual(
    describeValidation(
      [{ keyword: 'type', instancePath: '/memoryMb', message: 'must be integer', params: {} }],
      'body',
    ),
    { field: 'memoryMb', message: 'Invalid field memoryMb: must be integer' },
  );
  t.deepEqual(
    describeValidation(
      [{ keyword: 'enum', instancePath: '/encoding', message: 'x', params: { allowedValues: ['utf8', 'base64'] } }],
      'querystring',
    ),
    {
      field: 'encoding',
      message: 'Invalid query parameter encoding: must be one of "utf8", "base64"',
    },
  );
  t.deepEqual(
    describeValidation(
      [{ keyword: 'pattern', instancePath: '/envs', propertyName: '1X', message: 'must match pattern', params: {} }],
      'body',
    ).field,
    'envs.1X',
  );
  t.deepEqual(
    describeValidation([{ keyword: 'type', instancePath: '', message: 'must be object', params: {} }], 'body').field,
    'body',
  );
});

test('the library names some inputs differently: errors are renamed to the wire names', (t) => {
  const e = renameField(new InvalidArgumentError('command[0]', 'a non-empty program name', ''), {
    command: 'cmd',
  }) as InvalidArgumentError;
  t.is(e.field, 'cmd[0]');
  t.is(e.details.field, 'cmd[0]');
  t.is(e.message, 'Invalid cmd[0]: expected a non-empty program name, received ""');
  const other = new InvalidArgumentError('cwd', 'x', 1);
  t.is((renameField(other, { command: 'cmd' }) as InvalidArgumentError).field, 'cwd');
});

function store(now: { t: number }) {
  const db = new Database(':memory:');
  return { db, s: new IdempotencyStore(new StoredReplies(db), () => now.t) };
}

test('idempotency: the first response is stored and replayed; another request under the key is refused', (t) => {
  const now = { t: 1_000_000 };
  const { s } = store(now);
  const h1 = requestHash('POST', '/v1/sandboxes', { memoryMb: 64 });
  t.is(s.claim('acme', 'k', h1), undefined);
  t.throws(() => s.claim('acme', 'k', h1), { code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
  t.throws(() => s.claim('acme', 'k', requestHash('POST', '/v1/sandboxes', { memoryMb: 128 })), {
    code: 'IDEMPOTENCY_KEY_REUSED',
  });
  s.store('acme', 'k', h1, { status: 201, body: '{"id":"sbx_1"}', streamed: false });
  s.release('acme', 'k');
  t.deepEqual(s.claim('acme', 'k', h1), { status: 201, body: '{"id":"sbx_1"}', streamed: false });
  const e = t.throws(() => s.claim('acme', 'k', requestHash('POST', '/v1/sandboxes', {})), {
    code: 'IDEMPOTENCY_KEY_REUSED',
  });
  t.is((e as HttpError).statusCode, 409);
  // Keys are per tenant.
  t.is(s.claim('other', 'k', h1), undefined);
});

test('idempotency: a released claim without a stored response lets the retry run; stored responses expire after 24 h', (t) => {
  const now = { t: 1_000_000 };
  const { s } = store(now);
  const h = requestHash('POST', '/x', {});
  t.is(s.claim('acme', 'k', h), undefined);
  s.release('acme', 'k');
  t.is(s.claim('acme', 'k', h), undefined);
  s.store('acme', 'k', h, { status: 200, body: '1', streamed: true });
  s.release('acme', 'k');
  now.t += IDEMPOTENCY_TTL_MS - 1;
  t.deepEqual(s.claim('acme', 'k', h), { status: 200, body: '1', streamed: true });
  now.t += 1;
  t.is(
    s.claim('acme', 'k', requestHash('POST', '/x', { different: true })),
    undefined,
    'expired: the key is free, even for another body',
  );
  s.release('acme', 'k');
  t.is(s.sweep(), 1);
  t.is(s.sweep(), 0);
});

test('request hashes ignore key order but not values, paths or methods', (t) => {
  const h = requestHash('POST', '/a', { x: 1, y: [1, { b: 2, a: 1 }] });
  t.is(requestHash('POST', '/a', { y: [1, { a: 1, b: 2 }], x: 1 }), h);
  t.not(requestHash('POST', '/a', { x: 2, y: [1, { a: 1, b: 2 }] }), h);
  t.not(requestHash('POST', '/b', { x: 1, y: [1, { b: 2, a: 1 }] }), h);
  t.not(requestHash('PUT', '/a', { x: 1, y: [1, { b: 2, a: 1 }] }), h);
  t.not(requestHash('POST', '/a', Buffer.from('{}')), requestHash('POST', '/a', {}));
  t.is(validateIdempotencyKey('order-42/retry'), 'order-42/retry');
  for (const bad of ['', 'x'.repeat(256), 'has space', 'tab\t', 'é', ['a']])
    t.throws(() => validateIdempotencyKey(bad), { code: 'INVALID_ARGUMENT' });
});

test('contexts on the wire: payload plus contextFormat, and bytes as base64 both ways', (t) => {
  t.deepEqual(contextFromWire([{ role: 'user', content: 'hi' }], 'openai-chat'), {
    format: 'openai-chat',
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.deepEqual(contextFromWire([{ role: 'user', content: 'hi' }], 'openai-responses'), {
    format: 'openai-responses',
    items: [{ role: 'user', content: 'hi' }],
  });
  t.deepEqual(contextFromWire({ messages: [] }, 'anthropic'), { format: 'anthropic', messages: [] });
  const bytes = contextFromWire(
    { format: 'bytes', mediaType: 'application/x-pickle', data: Buffer.from([1, 2, 255]).toString('base64') },
    undefined,
  );
  t.true(bytes.format === 'bytes' && bytes.data instanceof Uint8Array);
  t.deepEqual(contextToWire(bytes), { format: 'bytes', mediaType: 'application/x-pickle', data: 'AQL/' });
  t.throws(() => contextFromWire([{ role: 'user', content: 'x' }], undefined), {
    code: 'INVALID_ARGUMENT',
    message: /contextFormat/,
  });
  t.throws(() => contextFromWire({ format: 'anthropic', messages: [] }, 'openai-chat'), { message: /contextFormat/ });
  t.throws(() => contextFromWire({ format: 'bytes', mediaType: 'x', data: '!!' }, undefined), {
    message: /context\.data/,
  });
  t.throws(() => contextFromWire({ messages: [] }, undefined), { message: /context\.format/ });
  t.notThrows(() => contextFromWire({ checkpoint: {} }, 'langgraph'));
  t.throws(() => contextFromWire([], 'langgraph'), { message: /an object for format langgraph/ });
});

test('drain: waits for operations, aborts them at the deadline, reports those that ignore the abort', async (t) => {
  const ops = new OperationTracker();
  const quick = ops.run('quick', () => new Promise((r) => setTimeout(r, 20)));
  t.deepEqual(await ops.drain(5000, 1000), { aborted: [], abandoned: [] });
  await quick;
  t.true(ops.isDraining);

  const ops2 = new OperationTracker();
  const abortable = ops2.run(
    'command',
    (signal) => new Promise((_, reject) => signal.addEventListener('abort', () => reject(new Error('aborted')))),
  );
  let finish!: () => void;
  const stubborn = ops2.run('rollback', () => new Promise<void>((r) => (finish = r)));
  t.is(ops2.size, 2);
  t.deepEqual(await ops2.drain(30, 30), { aborted: ['command', 'rollback'], abandoned: ['rollback'] });
  await t.throwsAsync(abortable, { message: 'aborted' });
  finish();
  await stubborn;
  t.is(ops2.size, 0);
});

test('an operation whose linked signal aborts (the client went away) is aborted', async (t) => {
  const ops = new OperationTracker();
  const client = new AbortController();
  const p = ops.run(
    'command',
    (signal) => new Promise((_, reject) => signal.addEventListener('abort', () => reject(new Error('gone')))),
    client.signal,
  );
  client.abort();
  await t.throwsAsync(p, { message: 'gone' });
  t.is(ops.size, 0);
});
