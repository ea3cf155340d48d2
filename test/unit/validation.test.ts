/**
 * Validation at the edge: tables of good and bad inputs for every validator a
 * caller's data goes through first. Bad input must fail with INVALID_ARGUMENT
 * naming the field, and the message must say which field it was.
 */
import test, { type ExecutionContext } from 'ava';
import { InvalidArgumentError } from '../../src/errors.js';
import { validateImageName } from '../../src/images/image-store.js';
import { LIMITS, validateCreateOptions, type CreateOptions } from '../../src/lifecycle/create.js';
import { validateCommand } from '../../src/instances/commands.js';
import { sandboxRelative } from '../../src/instances/files.js';
import { MAX_FORKS, validateForkCount } from '../../src/checkpoints/fork.js';
import { validateLabel } from '../../src/checkpoints/checkpoint.js';
import { isUnsafeEntry, splitReference } from '../../src/host/docker.js';

/** Asserts that fn throws INVALID_ARGUMENT for `field`, and that the message names it. */
function rejects(t: ExecutionContext, fn: () => unknown, field: string): void {
  const err = t.throws(fn, { instanceOf: InvalidArgumentError });
  t.is(err?.code, 'INVALID_ARGUMENT');
  t.is(err?.field, field);
  t.true(err?.message.startsWith(`Invalid ${field}:`), err?.message);
}

const show = (v: unknown) =>
  typeof v === 'string' ? JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…(${v.length})` : v) : String(v);

// ---- image names ------------------------------------------------------------

const goodImage = test.macro({
  exec(t, name: string) {
    t.is(validateImageName(name), name);
  },
  title: (_p, name: string) => `image name ${show(name)} is accepted`,
});

const badImage = test.macro({
  exec(t, name: unknown, field: string = 'image') {
    rejects(t, () => (field === 'image' ? validateImageName(name) : validateImageName(name, field)), field);
  },
  title: (_p, name: unknown, field: string = 'image') => `image name ${show(name)} is rejected (field ${field})`,
});

for (const name of ['base', 'dev', 'a', '0', 'my-image_1.0', 'x'.repeat(63)]) test(goodImage, name);
for (const name of [
  '',
  '..',
  '../base',
  '../../etc',
  'a/b',
  '/etc',
  'base/',
  'a..b',
  '.hidden',
  '-dash',
  '_under',
  'Base',
  'a b',
  'a:b',
  'x'.repeat(64),
  'a\0b',
])
  test(badImage, name);
for (const name of [undefined, null, 42, ['base'], { name: 'base' }]) test(badImage, name);
test(badImage, '../x', 'name');

// ---- create options ---------------------------------------------------------

test('create options: defaults', (t) => {
  t.like(validateCreateOptions({}), { image: 'base', memoryMb: LIMITS.memoryMb.default, pids: LIMITS.pids.default });
});

test('create options: the bounds themselves are accepted', (t) => {
  t.like(validateCreateOptions({ memoryMb: LIMITS.memoryMb.min, pids: LIMITS.pids.min }), { memoryMb: 16, pids: 8 });
  t.like(validateCreateOptions({ memoryMb: LIMITS.memoryMb.max, pids: LIMITS.pids.max }), {
    memoryMb: LIMITS.memoryMb.max,
    pids: LIMITS.pids.max,
  });
  t.like(
    validateCreateOptions({ image: 'dev', hostname: 'agent-1', envs: { A_1: 'x' }, metadata: { 'any key': 'v' } }),
    { image: 'dev', hostname: 'agent-1' },
  );
});

const badCreate = test.macro({
  exec(t, opts: CreateOptions, field: string) {
    rejects(t, () => validateCreateOptions(opts), field);
  },
  title: (_p, opts: CreateOptions, field: string) =>
    `create options ${JSON.stringify(opts, (_k, v) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v))} are rejected (field ${field})`,
});

const badNumbers: unknown[] = [
  -1,
  0,
  1.5,
  Number.NaN,
  Number.POSITIVE_INFINITY,
  1e15,
  Number.MAX_SAFE_INTEGER + 2,
  '64',
  true,
];
for (const v of badNumbers) {
  test(badCreate, { memoryMb: v as number }, 'memoryMb');
  test(badCreate, { pids: v as number }, 'pids');
}
test(badCreate, { memoryMb: LIMITS.memoryMb.min - 1 }, 'memoryMb');
test(badCreate, { memoryMb: LIMITS.memoryMb.max + 1 }, 'memoryMb');
test(badCreate, { pids: LIMITS.pids.min - 1 }, 'pids');
test(badCreate, { pids: LIMITS.pids.max + 1 }, 'pids');
test(badCreate, { image: '../base' }, 'image');
test(badCreate, { image: 'a/b' }, 'image');
test(badCreate, { hostname: '-lead' }, 'hostname');
test(badCreate, { hostname: 'has_underscore' }, 'hostname');
test(badCreate, { hostname: 'x'.repeat(64) }, 'hostname');
test(badCreate, { hostname: 'a.b' }, 'hostname');
test(badCreate, { envs: { '1BAD': 'x' } }, 'envs.1BAD');
test(badCreate, { envs: { 'A-B': 'x' } }, 'envs.A-B');
test(badCreate, { envs: { A: 1 as unknown as string } }, 'envs.A');
test(badCreate, { envs: ['A=1'] as unknown as Record<string, string> }, 'envs');
test(badCreate, { metadata: { k: null as unknown as string } }, 'metadata.k');
test(badCreate, { metadata: 'x' as unknown as Record<string, string> }, 'metadata');

// ---- commands ---------------------------------------------------------------

test('command: argv, cwd, env and timeout that are fine', (t) => {
  t.deepEqual(validateCommand(['sh', '-c', 'echo hi']), ['sh', '-c', 'echo hi']);
  t.deepEqual(
    validateCommand(['/bin/true', ''], { cwd: '/tmp', env: { _X: '', PATH: '/bin', A1: 'a=b' }, timeoutMs: 1 }),
    ['/bin/true', ''],
  );
});

const badCommand = test.macro({
  exec(t, argv: unknown, opts: Parameters<typeof validateCommand>[1], field: string) {
    rejects(t, () => validateCommand(argv, opts), field);
  },
  title: (_p, argv: unknown, opts: Parameters<typeof validateCommand>[1], field: string) =>
    `command ${JSON.stringify(argv)} ${JSON.stringify(opts)} is rejected (field ${field})`,
});

test(badCommand, [], {}, 'command');
test(badCommand, 'echo hi', {}, 'command');
test(badCommand, undefined, {}, 'command');
test(badCommand, [''], {}, 'command[0]');
test(badCommand, [42], {}, 'command[0]');
test(badCommand, ['echo', 'a\0b'], {}, 'command[1]');
test(badCommand, ['ec\0ho'], {}, 'command[0]');
test(badCommand, ['echo', null], {}, 'command[1]');
test(badCommand, ['pwd'], { cwd: 'tmp' }, 'cwd');
test(badCommand, ['pwd'], { cwd: '' }, 'cwd');
test(badCommand, ['pwd'], { cwd: '/tmp\0x' }, 'cwd');
test(badCommand, ['pwd'], { cwd: 7 }, 'cwd');
test(badCommand, ['env'], { env: { '1A': 'x' } }, 'env.1A');
test(badCommand, ['env'], { env: { 'A=B': 'x' } }, 'env.A=B');
test(badCommand, ['env'], { env: { 'A B': 'x' } }, 'env.A B');
test(badCommand, ['env'], { env: { '': 'x' } }, 'env.');
test(badCommand, ['env'], { env: { A: 'x\0y' } }, 'env.A');
test(badCommand, ['env'], { env: { A: 1 } }, 'env.A');
test(badCommand, ['env'], { env: ['A=1'] }, 'env');
test(badCommand, ['env'], { env: null }, 'env');
test(badCommand, ['true'], { timeoutMs: 0 }, 'timeoutMs');
test(badCommand, ['true'], { timeoutMs: -5 }, 'timeoutMs');
test(badCommand, ['true'], { timeoutMs: Number.NaN }, 'timeoutMs');
test(badCommand, ['true'], { timeoutMs: '100' }, 'timeoutMs');

// ---- sandbox paths ----------------------------------------------------------

const goodPath = test.macro({
  exec(t, input: string, expected: string) {
    t.is(sandboxRelative(input), expected);
  },
  title: (_p, input: string, expected: string) =>
    `sandbox path ${JSON.stringify(input)} -> ${JSON.stringify(expected)}`,
});
test(goodPath, '/', '');
test(goodPath, '/etc/passwd', 'etc/passwd');
test(goodPath, '//etc//passwd', 'etc//passwd');
test(goodPath, 'notes.txt', 'workspace/notes.txt');
test(goodPath, 'src/main.py', 'workspace/src/main.py');
// ".." is left for the kernel to refuse (openat2 RESOLVE_BENEATH), so it is passed through unchanged.
test(goodPath, '../../etc/shadow', 'workspace/../../etc/shadow');
test(goodPath, '/../etc/shadow', '../etc/shadow');

const badPath = test.macro({
  exec(t, input: unknown, field: string = 'path') {
    rejects(t, () => (field === 'path' ? sandboxRelative(input) : sandboxRelative(input, field)), field);
  },
  title: (_p, input: unknown, field: string = 'path') => `sandbox path ${show(input)} is rejected (field ${field})`,
});
test(badPath, '');
test(badPath, 'a\0b');
test(badPath, '/etc/passwd\0');
test(badPath, '/' + 'a'.repeat(4096));
test(badPath, 42);
test(badPath, undefined);
test(badPath, '', 'stdoutPath');

test('sandbox path: exactly 4096 characters is accepted', (t) => {
  t.is(sandboxRelative('/' + 'a'.repeat(4095)), 'a'.repeat(4095));
});

// ---- fork count and checkpoint label ------------------------------------------

test('fork count: default and range', (t) => {
  t.is(validateForkCount(undefined), 1);
  t.is(validateForkCount(1), 1);
  t.is(validateForkCount(MAX_FORKS), MAX_FORKS);
});
for (const v of [0, -1, MAX_FORKS + 1, 1.5, Number.NaN, '2', null]) {
  test(`fork count ${show(v)} is rejected (field count)`, (t) => rejects(t, () => validateForkCount(v), 'count'));
}

test('checkpoint label: absent, plain and longest', (t) => {
  t.is(validateLabel(undefined), null);
  t.is(validateLabel(null), null);
  t.is(validateLabel(''), '');
  t.is(validateLabel('before refactor: tests green ✔'), 'before refactor: tests green ✔');
  t.is(validateLabel('x'.repeat(200)), 'x'.repeat(200));
});
for (const v of ['x'.repeat(201), 'two\nlines', 'nul\0byte', 5, { label: 'x' }]) {
  test(`checkpoint label ${show(v)} is rejected (field label)`, (t) => rejects(t, () => validateLabel(v), 'label'));
}

// ---- Docker references and tar entries -------------------------------------------

const ref = test.macro({
  exec(t, input: string, repo: string, tag: string) {
    t.deepEqual(splitReference(input), { repo, tag });
  },
  title: (_p, input: string, repo: string, tag: string) => `docker reference ${input} -> ${repo} : ${tag}`,
});
test(ref, 'busybox', 'busybox', 'latest');
test(ref, 'busybox:1.36', 'busybox', '1.36');
test(ref, 'lockstep-test-abc:v1', 'lockstep-test-abc', 'v1');
test(ref, 'library/debian:bookworm-slim', 'library/debian', 'bookworm-slim');
test(ref, 'localhost:5000/agent', 'localhost:5000/agent', 'latest');
test(ref, 'localhost:5000/team/agent:v2', 'localhost:5000/team/agent', 'v2');

const entry = test.macro({
  exec(t, type: string | null | undefined, unsafe: boolean) {
    t.is(isUnsafeEntry({ type }), unsafe);
  },
  title: (_p, type: string | null | undefined, unsafe: boolean) =>
    `tar entry of type ${String(type)} is ${unsafe ? 'dropped' : 'kept'}`,
});
for (const type of ['block-device', 'character-device', 'fifo']) test(entry, type, true);
for (const type of ['file', 'directory', 'symlink', 'link', 'contiguous-file', null, undefined])
  test(entry, type, false);
