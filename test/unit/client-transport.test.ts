/**
 * The client's retry and error decisions, without root: a scripted HTTP
 * server on loopback answers each request with the next canned response and
 * records what arrived, so a test can see how many attempts were made and
 * with which Idempotency-Key.
 */
import test from 'ava';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { AddressInfo } from 'node:net';
import {
  CommandAbortedError,
  ConnectionError,
  InvalidArgumentError,
  InvalidStateError,
  LockstepError,
  NotFoundError,
  RemoteCommandHandle,
  RequestAbortedError,
  Sandbox,
} from '../../src/client/index.js';
import { WAIT_SLICE_MS } from '../../src/client/transport.js';
import type { ErrorCode } from '../../src/errors.js';

interface Canned {
  status: number;
  body: unknown;
  /** Raw text instead of JSON. */
  text?: string;
}

async function scripted(
  t: { teardown: (fn: () => Promise<void>) => void },
  answers: Canned[],
): Promise<{ url: string; seen: http.IncomingHttpHeaders[] }> {
  const seen: http.IncomingHttpHeaders[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push(req.headers);
      const a = answers[Math.min(seen.length - 1, answers.length - 1)]!;
      const text = a.text ?? JSON.stringify(a.body);
      res.writeHead(a.status, { 'content-type': a.text ? 'text/html' : 'application/json' });
      res.end(text);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  server.unref();
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

const info = { id: 'sbx_abc', image: 'base', state: 'running', metadata: {} };
const err = (code: string, message = code, field?: string) => ({
  error: { code, message, ...(field ? { field } : {}) },
});
const fast = { apiKey: 'lst_test', retryDelayMs: 1 };

test('a POST retried after 503 SERVER_SHUTTING_DOWN and 409 IDEMPOTENCY_KEY_IN_PROGRESS carries one Idempotency-Key', async (t) => {
  const s = await scripted(t, [
    { status: 503, body: err('SERVER_SHUTTING_DOWN') },
    { status: 409, body: err('IDEMPOTENCY_KEY_IN_PROGRESS') },
    { status: 201, body: info },
  ]);
  const sbx = await Sandbox.create({ ...fast, apiUrl: s.url });
  t.is(sbx.id, 'sbx_abc');
  t.is(s.seen.length, 3);
  const keys = new Set(s.seen.map((h) => h['idempotency-key']));
  t.is(keys.size, 1);
  t.regex([...keys][0] as string, /^[0-9a-f-]{36}$/);
  t.is(s.seen[0]!.authorization, 'Bearer lst_test');
});

test('a caller-chosen Idempotency-Key is sent as given', async (t) => {
  const s = await scripted(t, [{ status: 201, body: info }]);
  await Sandbox.create({ ...fast, apiUrl: s.url, idempotencyKey: 'my-key-1' });
  t.is(s.seen[0]!['idempotency-key'], 'my-key-1');
});

test('a 503 that waiting does not fix (the host is not set up) is not retried', async (t) => {
  const s = await scripted(t, [{ status: 503, body: err('CRIU_NOT_INSTALLED', 'run setup') }]);
  const e = await t.throwsAsync(Sandbox.create({ ...fast, apiUrl: s.url }));
  t.is((e as LockstepError).code, 'CRIU_NOT_INSTALLED');
  t.is(s.seen.length, 1);
});

test('retries stop after maxAttempts', async (t) => {
  const s = await scripted(t, [{ status: 503, body: err('SERVER_SHUTTING_DOWN') }]);
  const e = await t.throwsAsync(Sandbox.list({ ...fast, apiUrl: s.url, maxAttempts: 3 }));
  t.is((e as LockstepError).code, 'SERVER_SHUTTING_DOWN');
  t.is(s.seen.length, 3);
});

const mapping: [ErrorCode, number, string | undefined, abstract new (...a: never[]) => Error][] = [
  ['INVALID_ARGUMENT', 400, 'memoryMb', InvalidArgumentError],
  ['SANDBOX_NOT_FOUND', 404, undefined, NotFoundError],
  ['FILE_NOT_FOUND', 404, 'path', NotFoundError],
  ['SANDBOX_BUSY', 409, undefined, InvalidStateError],
  ['ROLLBACK_REFUSED_IRREVERSIBLE', 409, undefined, InvalidStateError],
  ['COMMAND_TIMEOUT', 504, undefined, CommandAbortedError],
  ['QUOTA_EXCEEDED', 429, undefined, LockstepError],
];
for (const [code, status, field, cls] of mapping) {
  test(`${status} ${code} becomes ${cls.name} with the server's code, message and field`, async (t) => {
    const s = await scripted(t, [{ status, body: err(code, `server says ${code}`, field) }]);
    const e = (await t.throwsAsync(Sandbox.list({ ...fast, apiUrl: s.url }))) as LockstepError;
    t.true(e instanceof cls);
    t.true(e instanceof LockstepError);
    t.is(e.code, code);
    t.is(e.message, `server says ${code}`);
    t.is(e.details.status, status);
    t.is((e as { field?: string }).field, field);
    t.is(s.seen.length, 1);
  });
}

test("an answer that is not the API's (a proxy's page) is a ConnectionError naming the status", async (t) => {
  const s = await scripted(t, [{ status: 502, body: null, text: '<html>Bad Gateway</html>' }]);
  const e = await t.throwsAsync(Sandbox.list({ ...fast, apiUrl: s.url }));
  t.true(e instanceof ConnectionError);
  t.regex(e!.message, /502/);
});

test('an aborted call is REQUEST_ABORTED; an aborted command is COMMAND_ABORTED, as in-process', async (t) => {
  const s = await scripted(t, [{ status: 200, body: info }]);
  const ctl = new AbortController();
  ctl.abort();
  const e = await t.throwsAsync(Sandbox.connect('sbx_abc', { ...fast, apiUrl: s.url, signal: ctl.signal }));
  t.true(e instanceof RequestAbortedError);
  t.is((e as LockstepError).code, 'REQUEST_ABORTED');
  const sbx = await Sandbox.connect('sbx_abc', { ...fast, apiUrl: s.url });
  const c = await t.throwsAsync(sbx.commands.run('true', { signal: ctl.signal }));
  t.true(c instanceof CommandAbortedError);
  t.is((c as LockstepError).code, 'COMMAND_ABORTED');
});

test('a sandbox id is checked before any request', async (t) => {
  const s = await scripted(t, [{ status: 200, body: info }]);
  const e = await t.throwsAsync(Sandbox.connect('../tenant', { ...fast, apiUrl: s.url }));
  t.like(e, { code: 'INVALID_ARGUMENT', field: 'id' });
  t.is(s.seen.length, 0);
});

test('lockstep/client loads nothing native and no server code: only its own modules, the errors and the default address', (t) => {
  // Walk the compiled import graph from the entry point (type-only imports are erased by tsc).
  const root = fileURLToPath(new URL('../../src/', import.meta.url));
  const seen = new Set<string>();
  const walk = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const m of fs.readFileSync(file, 'utf8').matchAll(/^(?:import|export)\b[^'"]*from '([^']+)';$/gm)) {
      const spec = m[1]!;
      if (spec.startsWith('node:')) continue;
      t.true(spec.startsWith('.'), `${path.relative(root, file)} imports the package ${spec}`);
      walk(path.resolve(path.dirname(file), spec));
    }
  };
  walk(path.join(root, 'client/index.js'));
  const outside = [...seen].map((f) => path.relative(root, f)).filter((f) => !f.startsWith('client/'));
  t.deepEqual(outside.sort(), ['errors-from-wire.js', 'errors.js', 'server-defaults.js']);
});

test("wait() waits in slices on the server: a slice that times out is followed by another, within the caller's deadline", async (t) => {
  const bodies: string[] = [];
  const answers: Canned[] = [
    { status: 200, body: info },
    { status: 504, body: err('COMMAND_TIMEOUT') },
    { status: 504, body: err('COMMAND_TIMEOUT') },
    { status: 200, body: { pid: 7, exitCode: 3 } },
  ];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      bodies.push(body);
      const a = answers[Math.min(bodies.length - 1, answers.length - 1)]!;
      res.writeHead(a.status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(a.body));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const apiUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const sbx = await Sandbox.connect('sbx_abc', { ...fast, apiUrl });
  const handle = new RemoteCommandHandle(sbx, 7);
  t.deepEqual(await handle.wait(), { exitCode: 3 });
  const waits = bodies.slice(1).map((b) => JSON.parse(b) as { timeoutMs: number });
  t.is(waits.length, 3);
  for (const w of waits) t.true(w.timeoutMs > 0 && w.timeoutMs <= WAIT_SLICE_MS);

  // With a deadline of its own, the caller gets COMMAND_TIMEOUT once it has passed.
  answers.splice(0, answers.length, { status: 504, body: err('COMMAND_TIMEOUT') });
  const e = await t.throwsAsync(handle.wait({ timeoutMs: 50 }));
  t.is((e as LockstepError).code, 'COMMAND_TIMEOUT');
});
