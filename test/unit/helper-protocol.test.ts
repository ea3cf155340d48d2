/**
 * The manager's side of the helper protocol (src/host/helper-protocol.ts):
 * requests survive a round trip byte for byte, and what the helper would
 * misread (a NUL inside a token, an empty supervisor token, a request past
 * the helper's limits) is refused with a typed error before it is sent.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  HelperRequestError,
  MAX_SUPERVISOR_REQUEST_BYTES,
  MAX_VERB_REQUEST_BYTES,
  STATUS_FD,
  createArgs,
  decodeSupervisorRequest,
  decodeVerbRequest,
  encodeSupervisorRequest,
  encodeVerbRequest,
  enterTokens,
  parseErrorLine,
  parseHelperAnswer,
} from '../../src/host/helper-protocol.js';
import { InvalidArgumentError } from '../../src/errors.js';

const enter = enterTokens({
  initPid: 4242,
  initStart: 987654321,
  cgroupProcs: ['/sys/fs/cgroup/a/cgroup.procs', '/sys/fs/cgroup/b/cgroup.procs'],
  options: ['--cwd', '/workspace', '--env', 'GREETING=héllo wörld', '--env', 'EMPTY='],
  argv: ['sh', '-c', 'echo "$GREETING"', ''],
});

test('an enter request carries the init identity, status fd, options, cgroups and command, in that order', (t) => {
  t.deepEqual(enter, [
    '--pid',
    '4242',
    '--start',
    '987654321',
    '--status-fd',
    String(STATUS_FD),
    '--cwd',
    '/workspace',
    '--env',
    'GREETING=héllo wörld',
    '--env',
    'EMPTY=',
    '--cgroup',
    '/sys/fs/cgroup/a/cgroup.procs',
    '--cgroup',
    '/sys/fs/cgroup/b/cgroup.procs',
    '--',
    'sh',
    '-c',
    'echo "$GREETING"',
    '',
  ]);
});

test('a verb request round-trips, empty tokens and UTF-8 included; each token ends with one NUL', (t) => {
  const encoded = encodeVerbRequest(enter);
  t.is(encoded.split('\0').length - 1, enter.length);
  t.true(encoded.endsWith('\0'));
  t.deepEqual(decodeVerbRequest(encoded), enter);
  t.is(encodeVerbRequest([]), '');
  t.deepEqual(decodeVerbRequest(''), []);
});

test('a supervisor request round-trips and ends with an empty token', (t) => {
  const tokens = [
    'run',
    '/usr/lib/lockstep/lockstep-helper',
    ...createArgs({
      root: '/var/lib/lockstep/run/sbx_1/root',
      dev: '/var/lib/lockstep/run/sbx_1/dev',
      shm: '/var/lib/lockstep/layers/sbx_1/shm',
      hostname: 'sbx-1',
      cgroupProcs: ['/sys/fs/cgroup/x/cgroup.procs'],
      idRange: { base: 1_000_000, count: 65536 },
    }),
  ];
  const encoded = encodeSupervisorRequest(tokens);
  t.true(encoded.endsWith('\0\0'));
  t.false(encoded.slice(0, -2).includes('\0\0'));
  t.deepEqual(decodeSupervisorRequest(encoded), tokens);
  t.deepEqual(tokens.slice(2, 4), ['create', '--root']);
  t.deepEqual(tokens.slice(-4), ['--id-base', '1000000', '--id-count', '65536']);
});

test('create without a user namespace has no id range options', (t) => {
  const args = createArgs({ root: '/r', dev: '/d', shm: '/s', hostname: 'h', cgroupProcs: [], idRange: null });
  t.deepEqual(args, ['create', '--root', '/r', '--dev', '/d', '--shm', '/s', '--hostname', 'h']);
});

test('a NUL byte inside a token is refused with a typed error naming the token', (t) => {
  for (const encode of [encodeVerbRequest, encodeSupervisorRequest]) {
    const e = t.throws(() => encode(['--env', 'A=1\0--detach']), { instanceOf: HelperRequestError });
    t.true(e instanceof InvalidArgumentError);
    t.is(e.code, 'INVALID_ARGUMENT');
    t.is(e.field.endsWith('token 1'), true, e.field);
  }
});

test('an empty supervisor token is refused: the supervisor would take it for the end of the request', (t) => {
  const e = t.throws(() => encodeSupervisorRequest(['run', '/helper', '', 'create']), {
    instanceOf: HelperRequestError,
  });
  t.is(e.field, 'supervisor request token 2');
  t.notThrows(() => encodeVerbRequest(['--', 'sh', '-c', '']));
});

test('requests past the helper limits are refused; the largest allowed is accepted', (t) => {
  // A verb request: every token plus its NUL, at most MAX_VERB_REQUEST_BYTES.
  const fits = 'x'.repeat(MAX_VERB_REQUEST_BYTES - 1);
  t.is(encodeVerbRequest([fits]).length, MAX_VERB_REQUEST_BYTES);
  const over = t.throws(() => encodeVerbRequest([fits + 'x']), { instanceOf: HelperRequestError });
  t.is(over.code, 'INVALID_ARGUMENT');
  t.regex(
    over.message,
    new RegExp(`at most ${MAX_VERB_REQUEST_BYTES} bytes, received "${MAX_VERB_REQUEST_BYTES + 1} bytes"`),
  );
  // Bytes, not characters: a 2-byte character counts twice.
  t.throws(() => encodeVerbRequest(['é'.repeat(Math.ceil(MAX_VERB_REQUEST_BYTES / 2))]), {
    instanceOf: HelperRequestError,
  });

  // A supervisor request: the tokens, their separators and the two final NULs.
  const sup = 'y'.repeat(MAX_SUPERVISOR_REQUEST_BYTES - 2);
  t.is(encodeSupervisorRequest([sup]).length, MAX_SUPERVISOR_REQUEST_BYTES);
  t.throws(() => encodeSupervisorRequest([sup + 'y']), { instanceOf: HelperRequestError });
});

test('a malformed request is refused when decoded', (t) => {
  t.throws(() => decodeVerbRequest('--pid\x001'), { instanceOf: HelperRequestError });
  t.throws(() => decodeSupervisorRequest('run\0/x\0'), { instanceOf: HelperRequestError });
});

test("the helper's answers: a result, or its SystemError-shaped error as HELPER_FAILED", (t) => {
  t.deepEqual(parseHelperAnswer<{ pid: number }>('noise\n{"pid":17}\n', 'starting'), { pid: 17 });
  const err =
    '{"error":{"code":"EPERM","errno":-1,"syscall":"mount(proc)","path":"proc","message":"Operation not permitted"}}';
  const e = t.throws(() => parseHelperAnswer(err + '\n', 'starting sandbox sbx_1'), { code: 'HELPER_FAILED' });
  t.is(e.message, "starting sandbox sbx_1: mount(proc) failed: EPERM (Operation not permitted), path 'proc'");
  t.throws(() => parseHelperAnswer('\n', 'preparing'), { code: 'HELPER_NO_ANSWER' });

  const status = parseErrorLine('{"error":{"code":"ESRCH","errno":-3,"syscall":"identity","path":"/proc/9"}}');
  t.like(status, { code: 'ESRCH', errno: -3, syscall: 'identity', path: '/proc/9', message: 'failed' });
  t.is(parseErrorLine('{"nsPid":5}'), undefined);
  t.is(parseErrorLine('not json'), undefined);
});

test("the limits are the helper's own (native/helper/main.c MAX_REQUEST, supervise.c REQUEST_MAX), less one", (t) => {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
  const main = fs.readFileSync(path.join(root, 'native/helper/main.c'), 'utf8');
  const supervise = fs.readFileSync(path.join(root, 'native/helper/supervise.c'), 'utf8');
  const verb = /#define MAX_REQUEST \((\d+)u << (\d+)\)/.exec(main);
  const sup = /#define REQUEST_MAX (\d+)/.exec(supervise);
  t.truthy(verb, 'MAX_REQUEST not found in main.c');
  t.truthy(sup, 'REQUEST_MAX not found in supervise.c');
  t.is(MAX_VERB_REQUEST_BYTES, Number(verb![1]) * 2 ** Number(verb![2]) - 1);
  t.is(MAX_SUPERVISOR_REQUEST_BYTES, Number(sup![1]) - 1);
});
