/**
 * Every code thrown in src/ is an ErrorCode with an HTTP status, and every
 * fault point is spelled as FAULT_POINTS lists it. The compiler checks the
 * literals it can see; this test reads the source for the codes built at
 * run time (NotFoundError's `<KIND>_NOT_FOUND`, answer bodies).
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ERROR_CODES, HostError, NotFoundError, type ErrorCode } from '../../src/errors.js';
import { HTTP_STATUS, statusForCode } from '../../src/http/errors.js';
import { ALL_FAULT_POINTS, FAULT_POINTS, envFaultHook, isFaultPoint } from '../../src/faults.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

function sources(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? sources(p) : e.name.endsWith('.ts') ? [p] : [];
  });
}

/** Codes the source throws or answers with, each with the first place it appears. */
function codesInSource(): Map<string, string> {
  const found = new Map<string, string>();
  const patterns = [
    /new \w*Error\(\s*(?:\d+,\s*)?'([A-Z][A-Z0-9_]+)'/g, // new HostError('NOT_ROOT', ...), new HttpError(401, 'UNAUTHENTICATED', ...)
    /super\(\s*'([A-Z][A-Z0-9_]+)'/g, // subclasses with a fixed code
    /\bcode: '([A-Z][A-Z0-9_]+)'/g, // answer bodies and per-fork results
  ];
  for (const file of sources(path.join(root, 'src'))) {
    const text = fs.readFileSync(file, 'utf8');
    const where = path.relative(root, file);
    for (const re of patterns) for (const m of text.matchAll(re)) if (!found.has(m[1]!)) found.set(m[1]!, where);
    for (const m of text.matchAll(/new NotFoundError\(\s*'([a-z]+)'/g))
      found.set(`${m[1]!.toUpperCase()}_NOT_FOUND`, where);
    for (const m of text.matchAll(/new AlreadyExistsError\(\s*'([a-z]+)'/g))
      found.set(`${m[1]!.toUpperCase()}_EXISTS`, where);
  }
  return found;
}

test('every code thrown or answered in src/ is an ErrorCode', (t) => {
  const found = codesInSource();
  t.true(found.size > 60, `the scan found only ${found.size} codes: the patterns no longer match the source`);
  const missing = [...found]
    .filter(([code]) => !(ERROR_CODES as readonly string[]).includes(code))
    .map(([code, where]) => `${code} (${where})`);
  t.deepEqual(missing, []);
});

test('every ErrorCode has an HTTP status, and no status is a silent fallback', (t) => {
  t.deepEqual(Object.keys(HTTP_STATUS).sort(), [...ERROR_CODES].sort());
  for (const code of ERROR_CODES) {
    const status = statusForCode(code);
    t.true(status >= 400 && status < 600, `${code} → ${status}`);
  }
  t.is(new Set(ERROR_CODES).size, ERROR_CODES.length, 'a code is listed twice');
});

test('a NotFoundError of each kind has a code in the union', (t) => {
  for (const kind of [
    'sandbox',
    'image',
    'checkpoint',
    'effect',
    'observation',
    'context',
    'layer',
    'tenant',
    'bundle',
  ] as const) {
    const code: ErrorCode = new NotFoundError(kind, 'x').code;
    t.is(statusForCode(code), 404, kind);
  }
});

test('fault points: the flat list is FAULT_POINTS, and a misspelled LOCKSTEP_FAULT is refused', (t) => {
  t.is(
    ALL_FAULT_POINTS.length,
    Object.values(FAULT_POINTS).reduce((n, steps) => n + steps.length, 0),
  );
  t.true(isFaultPoint('checkpoint:frozen'));
  t.false(isFaultPoint('checkpoint:frozem'));
  const err = t.throws(() => envFaultHook('checkpoint:frozem'), { instanceOf: HostError });
  t.is(err.code, 'CONFIG_INVALID');
  t.regex(err.message, /checkpoint:frozen/);
  t.notThrows(() => envFaultHook(undefined)('checkpoint:frozen'));
});

test('every fault point the source reaches is a FaultPoint', (t) => {
  const used = new Set<string>();
  for (const file of sources(path.join(root, 'src'))) {
    for (const m of fs.readFileSync(file, 'utf8').matchAll(/fault\('([a-z-]+:[a-z-]+)'\)/g)) used.add(m[1]!);
  }
  t.true(used.size > 10);
  t.deepEqual(
    [...used].filter((p) => !isFaultPoint(p)),
    [],
  );
});
