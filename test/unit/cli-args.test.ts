/**
 * The CLI's argument helpers (src/cli/args.ts) and the mapping from errors to
 * documented exit codes (src/cli/output.ts): 2 bad usage or input, 3 not
 * found, 4 conflict, 5 host problem, 1 anything else.
 */
import test from 'ava';
import { envFlags, intFlag, need, parse, splitCommand } from '../../src/cli/args.js';
import { EXIT, UsageError, exitCodeFor, reportError } from '../../src/cli/output.js';
import {
  AlreadyExistsError,
  CriuError,
  HostError,
  InvalidArgumentError,
  InvalidStateError,
  LockstepError,
  NotFoundError,
} from '../../src/errors.js';

const USAGE = 'lockstep thing ID [--json]';

test('parse: flags and positionals', (t) => {
  const r = parse(
    ['sbx_1', '--json', '--env', 'A=1', '--env', 'B=2', '--cwd', '/tmp'],
    { json: { type: 'boolean' }, env: { type: 'string', multiple: true }, cwd: { type: 'string' } },
    USAGE,
  );
  t.deepEqual(r.positionals, ['sbx_1']);
  t.true(r.values.json);
  t.deepEqual(r.values.env, ['A=1', 'B=2']);
  t.is(r.values.cwd, '/tmp');
});

test('parse: an unknown flag is a USAGE error that shows the usage', (t) => {
  const err = t.throws(() => parse(['--nope'], { json: { type: 'boolean' } }, USAGE), { instanceOf: UsageError });
  t.is(err?.code, 'USAGE');
  t.true(err?.message.includes('--nope'));
  t.true(err?.message.includes(`usage: ${USAGE}`));
});

test('parse: a string flag without its value is a USAGE error', (t) => {
  const err = t.throws(() => parse(['--cwd'], { cwd: { type: 'string' } }, USAGE), { instanceOf: UsageError });
  t.true(err?.message.includes('--cwd'));
});

const split = test.macro({
  exec(t, argv: string[], flags: string[], cmd: string[]) {
    t.deepEqual(splitCommand(argv), [flags, cmd]);
  },
  title: (_p, argv: string[]) => `splitCommand ${JSON.stringify(argv)}`,
});
test(split, ['sbx_1', '--json', '--', 'sh', '-c', 'exit 7'], ['sbx_1', '--json'], ['sh', '-c', 'exit 7']);
test(split, ['sbx_1', '--json'], ['sbx_1', '--json'], []);
test(split, ['sbx_1', '--'], ['sbx_1'], []);
test(split, ['sbx_1', '--', 'echo', '--', '--json'], ['sbx_1'], ['echo', '--', '--json']);
test(split, [], [], []);

test('intFlag: absent, positive and negative integers', (t) => {
  t.is(intFlag(undefined, 'memory'), undefined);
  t.is(intFlag('512', 'memory'), 512);
  t.is(intFlag('-3', 'memory'), -3); // range checks belong to the library, which names its own field
  t.is(intFlag('007', 'pids'), 7);
});

for (const v of ['', 'abc', '1.5', '1e3', '0x10', ' 5', '5 ', '--5']) {
  test(`intFlag ${JSON.stringify(v)} is a USAGE error naming the flag`, (t) => {
    const err = t.throws(() => intFlag(v, 'memory'), { instanceOf: UsageError });
    t.is(err?.code, 'USAGE');
    t.true(err?.message.includes('--memory'));
    t.true(err?.message.includes(JSON.stringify(v)));
  });
}

test('envFlags: K=V pairs, values may hold "=" and be empty', (t) => {
  t.is(envFlags(undefined), undefined);
  t.is(envFlags([]), undefined);
  t.deepEqual(envFlags(['A=1', 'B=x=y', 'EMPTY=']), { A: '1', B: 'x=y', EMPTY: '' });
  t.deepEqual(envFlags(['A=1', 'A=2']), { A: '2' }, 'the last one wins');
});

for (const kv of ['noequals', '=value', '']) {
  test(`envFlags ${JSON.stringify(kv)} is a USAGE error naming --env`, (t) => {
    const err = t.throws(() => envFlags([kv]), { instanceOf: UsageError });
    t.true(err?.message.includes('--env'));
  });
}

test('need: exactly n positionals', (t) => {
  t.deepEqual(need(['a', 'b'], 2, USAGE), ['a', 'b']);
  t.deepEqual(need([], 0, USAGE), []);
  const missing = t.throws(() => need(['a'], 2, USAGE), { instanceOf: UsageError });
  t.true(missing?.message.startsWith('missing arguments'));
  t.true(missing?.message.includes(USAGE));
  const extra = t.throws(() => need(['a', 'b', 'c'], 2, USAGE), { instanceOf: UsageError });
  t.true(extra?.message.includes('unexpected argument "c"'));
});

const exitCode = test.macro({
  exec(t, error: unknown, expected: number) {
    t.is(exitCodeFor(error) as number, expected);
  },
  title: (_p, error: unknown, expected: number) =>
    `exit code ${expected} for ${error instanceof LockstepError ? error.code : String(error)}`,
});

test(exitCode, new UsageError('bad'), EXIT.usage);
test(exitCode, new InvalidArgumentError('memoryMb', 'an integer', -1), EXIT.usage);
test(exitCode, new LockstepError('PATH_ESCAPES_SANDBOX', 'escape'), EXIT.usage);
test(exitCode, new NotFoundError('sandbox', 'sbx_x'), EXIT.notFound);
test(exitCode, new NotFoundError('image', 'nope'), EXIT.notFound);
test(exitCode, new NotFoundError('checkpoint', 'ckpt_x'), EXIT.notFound);
test(exitCode, new LockstepError('FILE_NOT_FOUND', 'x'), EXIT.notFound);
test(exitCode, new AlreadyExistsError('image', 'base'), EXIT.conflict);
test(exitCode, new InvalidStateError('SANDBOX_BUSY', 'busy'), EXIT.conflict);
test(exitCode, new InvalidStateError('IMAGE_IN_USE', 'in use'), EXIT.conflict);
test(exitCode, new LockstepError('ROLLBACK_REFUSED_IRREVERSIBLE', 'x'), EXIT.conflict);
test(exitCode, new LockstepError('EFFECT_OUTCOME_UNKNOWN', 'x'), EXIT.conflict);
test(exitCode, new CriuError('CRIU_DUMP_FAILED', 'dump failed', 'log tail'), EXIT.host);
test(exitCode, new HostError('HOST_PROVISIONING_FAILED', 'x'), EXIT.host);
test(exitCode, new HostError('NOT_ROOT', 'x'), EXIT.host);
test(exitCode, new HostError('NATIVE_NOT_BUILT', 'x'), EXIT.host);
test(exitCode, new InvalidStateError('SANDBOX_NOT_RUNNING', 'x'), EXIT.conflict);
test(exitCode, new LockstepError('COMMAND_TIMEOUT', 'x'), EXIT.failure);
test(exitCode, new Error('plain'), EXIT.failure);
test(exitCode, 'a string', EXIT.failure);
test(exitCode, undefined, EXIT.failure);

/** Runs fn with process.stdout/stderr writes captured. */
function capture(fn: () => number): { code: number; stdout: string; stderr: string } {
  const out: string[] = [];
  const err: string[] = [];
  const ow = process.stdout.write;
  const ew = process.stderr.write;
  process.stdout.write = ((s: string) => (out.push(String(s)), true)) as typeof process.stdout.write;
  process.stderr.write = ((s: string) => (err.push(String(s)), true)) as typeof process.stderr.write;
  try {
    return { code: fn(), stdout: out.join(''), stderr: err.join('') };
  } finally {
    process.stdout.write = ow;
    process.stderr.write = ew;
  }
}

test.serial('reportError --json prints {"error":{code,...}} on stdout and returns the exit code', (t) => {
  const r = capture(() => reportError(new InvalidArgumentError('pids', 'an integer from 8 to 4194304', 0), true));
  t.is(r.code, EXIT.usage);
  t.is(r.stderr, '');
  const parsed = JSON.parse(r.stdout) as { error: { code: string; field: string; message: string } };
  t.is(parsed.error.code, 'INVALID_ARGUMENT');
  t.is(parsed.error.field, 'pids');
  t.true(parsed.error.message.includes('pids'));
});

test.serial('reportError --json wraps a foreign error as INTERNAL', (t) => {
  const r = capture(() => reportError(new TypeError('boom'), true));
  t.is(r.code, EXIT.failure);
  t.like(JSON.parse(r.stdout), { error: { code: 'INTERNAL', name: 'TypeError', message: 'boom' } });
});

test.serial('reportError without --json prints "lockstep: message" on stderr', (t) => {
  const r = capture(() => reportError(new NotFoundError('sandbox', 'sbx_gone'), false));
  t.is(r.code, EXIT.notFound);
  t.is(r.stdout, '');
  t.is(r.stderr, 'lockstep: No sandbox with id "sbx_gone"\n');
});
