/**
 * The CLI's exit codes come from one table keyed by error code
 * (src/cli/output.ts, EXIT_CODE), and docs/cli.md's "Exit codes" table is
 * that table: every code in exactly one row, the row of its exit code.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ERROR_CODES, LockstepError, type ErrorCode } from '../../src/errors.js';
import { EXIT, EXIT_CODE, exitCodeFor } from '../../src/cli/output.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** docs/cli.md's "Exit codes" table: exit code -> the error codes its row lists. */
function documentedExitCodes(): Map<number, string[]> {
  const text = fs.readFileSync(path.join(root, 'docs', 'cli.md'), 'utf8');
  const start = text.indexOf('\n## Exit codes\n');
  if (start < 0) throw new Error('docs/cli.md has no "## Exit codes" section');
  const section = text.slice(start + 1);
  const table = section.slice(0, section.search(/\n#{2,4} /));
  const rows = new Map<number, string[]>();
  for (const line of table.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    if (cells.length < 4 || !/^\d+$/.test(cells[1]!)) continue;
    rows.set(
      Number(cells[1]),
      [...cells[3]!.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((m) => m[1]!),
    );
  }
  return rows;
}

test('every error code has an exit code of the documented set, and exitCodeFor uses it', (t) => {
  const allowed = new Set<number>(Object.values(EXIT));
  t.deepEqual(Object.keys(EXIT_CODE).sort(), [...ERROR_CODES].sort());
  for (const code of ERROR_CODES) {
    t.true(allowed.has(EXIT_CODE[code]), code);
    t.not(EXIT_CODE[code], EXIT.ok, code);
    t.is(exitCodeFor(new LockstepError(code, 'x')), EXIT_CODE[code], code);
  }
});

test('what is not a known Lockstep error exits 1, never 0', (t) => {
  t.is(exitCodeFor(new Error('plain')), EXIT.failure);
  t.is(exitCodeFor(undefined), EXIT.failure);
  // A newer server may answer with a code this client does not know.
  t.is(exitCodeFor(new LockstepError('SOMETHING_NEW' as ErrorCode, 'x')), EXIT.failure);
});

test("docs/cli.md's table lists every code once, in the row of its exit code", (t) => {
  const rows = documentedExitCodes();
  t.deepEqual(
    [...rows.keys()].sort(),
    Object.values(EXIT).sort((a, b) => a - b),
  );
  const listed = [...rows.values()].flat();
  const twice = listed.filter((c, i) => listed.indexOf(c) !== i);
  t.deepEqual(twice, [], 'listed in more than one row');
  const unknown = listed.filter((c) => !(ERROR_CODES as readonly string[]).includes(c));
  t.deepEqual(unknown, [], 'not an ErrorCode');
  for (const [exit, codes] of rows) {
    const expected = ERROR_CODES.filter((c) => EXIT_CODE[c] === exit).sort();
    t.deepEqual([...codes].sort(), expected, `exit ${exit}`);
  }
});
