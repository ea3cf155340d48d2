/**
 * Errors that survive the wire: every ErrorCode has the class it arrives as
 * (CLASS_FOR_CODE, for lockstep/client, and the Python client's map), an
 * error body becomes an instance of that class with the server's code,
 * message and field, and an unknown code stays a LockstepError carrying it.
 */
import test from 'ava';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ERROR_CODES, LockstepError, type ErrorCode } from '../../src/errors.js';
import { CLASS_FOR_CODE, classForCode, errorFromWire } from '../../src/errors-from-wire.js';
import { HTTP_STATUS, toErrorResponse } from '../../src/http/errors.js';

const PYTHON_ERRORS = fileURLToPath(new URL('../../../clients/python/lockstep/errors.py', import.meta.url));

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
// Does not compile if CLASS_FOR_CODE misses a code or names one that is no ErrorCode.
const exhaustive: Equal<keyof typeof CLASS_FOR_CODE, ErrorCode> = true;

test('CLASS_FOR_CODE has exactly one class for every ErrorCode', (t) => {
  t.true(exhaustive);
  t.deepEqual(Object.keys(CLASS_FOR_CODE).sort(), [...ERROR_CODES].sort());
  for (const code of ERROR_CODES)
    t.true(CLASS_FOR_CODE[code] === LockstepError || CLASS_FOR_CODE[code].prototype instanceof LockstepError, code);
});

for (const code of ERROR_CODES) {
  test(`${code} round-trips through an error body into ${CLASS_FOR_CODE[code].name}`, (t) => {
    const sent = new LockstepError(code, `the server says ${code}`, { details: { field: 'someField' } });
    const { status, body, internal } = toErrorResponse(sent);
    t.is(status, HTTP_STATUS[code]);
    const got = errorFromWire(status, JSON.parse(JSON.stringify(body.error)));
    const cls = CLASS_FOR_CODE[code];
    t.true(got instanceof cls);
    t.true(got instanceof LockstepError);
    t.is(Object.getPrototypeOf(got), cls.prototype);
    t.is(got.name, cls.name);
    t.is(got.code, code);
    t.is(got.message, internal ? 'Internal error; the server log has the details' : sent.message);
    // A 5xx body hides the details; the others carry the field.
    t.deepEqual(got.details, internal ? { status } : { status, field: 'someField' });
    t.is((got as { field?: unknown }).field, internal ? undefined : 'someField');
  });
}

test('a code this client does not know is a LockstepError carrying it, whatever the status', (t) => {
  t.is(classForCode('FROM_A_NEWER_SERVER'), LockstepError);
  t.is(classForCode('constructor'), LockstepError);
  const e = errorFromWire(409, { code: 'FROM_A_NEWER_SERVER', message: 'new', field: 'x' });
  t.is(Object.getPrototypeOf(e), LockstepError.prototype);
  t.is(e.name, 'LockstepError');
  t.is(e.code as string, 'FROM_A_NEWER_SERVER');
  t.is(e.message, 'new');
  t.deepEqual(e.details, { status: 409, field: 'x' });
});

/** The Python client's CLASS_FOR_CODE, read from its source: code → class name. */
function pythonMap(): Map<string, string> {
  const text = fs.readFileSync(PYTHON_ERRORS, 'utf8');
  const block = /^CLASS_FOR_CODE\b[^\n]*= \{\n([\s\S]*?)^\}/m.exec(text);
  if (!block) throw new Error(`${PYTHON_ERRORS} has no CLASS_FOR_CODE = { ... } block`);
  const map = new Map<string, string>();
  for (const line of block[1]!.split('\n')) {
    if (/^\s*(#.*)?$/.test(line)) continue;
    const m = /^\s+"([A-Z0-9_]+)": (\w+),$/.exec(line);
    if (!m) throw new Error(`unexpected line in the Python CLASS_FOR_CODE: ${line}`);
    if (map.has(m[1]!)) throw new Error(`${m[1]} is listed twice in the Python CLASS_FOR_CODE`);
    map.set(m[1]!, m[2]!);
  }
  return map;
}

/** The Python class for each TypeScript class; the others arrive as the Python LockstepError. */
const PYTHON_CLASS: Record<string, string> = {
  InvalidArgumentError: 'InvalidArgumentError',
  NotFoundError: 'NotFoundError',
  InvalidStateError: 'InvalidStateError',
  CommandAbortedError: 'CommandAbortedError',
  ConnectionError: 'LockstepConnectionError',
};
/** Where the Python client is finer than the TypeScript one. */
const PYTHON_ONLY: Partial<Record<ErrorCode, string>> = { QUOTA_EXCEEDED: 'QuotaExceededError' };

test("the Python client's map names every ErrorCode, with the TypeScript client's class", (t) => {
  const py = pythonMap();
  t.deepEqual([...py.keys()].sort(), [...ERROR_CODES].sort());
  const defined = new Set([...fs.readFileSync(PYTHON_ERRORS, 'utf8').matchAll(/^class (\w+)\(/gm)].map((m) => m[1]!));
  for (const code of ERROR_CODES) {
    const expected = PYTHON_ONLY[code] ?? PYTHON_CLASS[CLASS_FOR_CODE[code].name] ?? 'LockstepError';
    t.is(py.get(code), expected, code);
    t.true(defined.has(expected), `${expected} is not defined in errors.py`);
  }
});
