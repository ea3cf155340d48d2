/**
 * One limit, three doors: the library's validation, the HTTP JSON schemas and
 * the MCP tools' zod schemas refuse the same inputs, each past the constant of
 * src/limits.ts (image names of 63 characters, command timeouts of 24 h as
 * integers, sandbox lifetimes of 1 s to 30 days).
 */
import test, { type ExecutionContext } from 'ava';
import Fastify from 'fastify';
import { InvalidArgumentError } from '../../src/errors.js';
import { COMMAND_TIMEOUT_MAX_MS, IMAGE_NAME_MAX, SANDBOX_LIFETIME_MS } from '../../src/limits.js';
import { validateImageName } from '../../src/images/image-store.js';
import { validateCommand } from '../../src/instances/commands.js';
import { validateCreateOptions } from '../../src/lifecycle/create.js';
import { AJV_OPTIONS, createBody, runBody } from '../../src/http/schemas.js';
import { commandTimeoutArg, imageArg } from '../../src/mcp/server.js';

/**
 * A fastify app with the server's ajv options (src/http/server.ts: no
 * coercion, no stripping) and the create and run body schemas; the status
 * code says whether a body got past the schema.
 */
const app = Fastify({
  ajv: { customOptions: { ...AJV_OPTIONS } },
});
app.post('/create', { schema: { body: createBody } }, async () => ({}));
app.post('/run', { schema: { body: runBody } }, async () => ({}));
test.after.always(() => app.close());

/** Whether the HTTP schema of `route` lets `body` through. */
async function httpTakes(route: 'create' | 'run', body: unknown): Promise<boolean> {
  const res = await app.inject({ method: 'POST', url: `/${route}`, payload: body as object });
  if (res.statusCode !== 200 && res.statusCode !== 400) throw new Error(`unexpected ${res.statusCode}: ${res.body}`);
  return res.statusCode === 200;
}

function refusedByLibrary(t: ExecutionContext, fn: () => unknown, field: string): void {
  const err = t.throws(fn, { instanceOf: InvalidArgumentError });
  t.is(err?.code, 'INVALID_ARGUMENT');
  t.is(err?.field, field);
}

// ---- image names ------------------------------------------------------------

const longest = 'x'.repeat(IMAGE_NAME_MAX);
const tooLong = 'x'.repeat(IMAGE_NAME_MAX + 1);

test('image names: the library takes IMAGE_NAME_MAX characters and refuses one more', (t) => {
  t.is(IMAGE_NAME_MAX, 63);
  t.is(validateImageName(longest), longest);
  refusedByLibrary(t, () => validateImageName(tooLong), 'image');
  refusedByLibrary(t, () => validateCreateOptions({ image: tooLong }), 'image');
});

test('image names: the HTTP create schema has the same limit', async (t) => {
  t.is((createBody.properties as Record<string, { maxLength: number }>).image.maxLength, IMAGE_NAME_MAX);
  t.true(await httpTakes('create', { image: longest }));
  t.false(await httpTakes('create', { image: tooLong }));
});

test('image names: the MCP create_sandbox schema has the same limit', (t) => {
  t.is(imageArg.maxLength, IMAGE_NAME_MAX);
  t.true(imageArg.safeParse(longest).success);
  t.false(imageArg.safeParse(tooLong).success);
});

// ---- command timeouts -------------------------------------------------------

const badTimeouts = [0, -1, 1.5, COMMAND_TIMEOUT_MAX_MS + 1, Number.POSITIVE_INFINITY];

test('command timeouts: the library takes integers from 1 ms to 24 h and refuses the rest', (t) => {
  t.is(COMMAND_TIMEOUT_MAX_MS, 24 * 3600 * 1000);
  for (const ok of [1, 30_000, COMMAND_TIMEOUT_MAX_MS])
    t.deepEqual(validateCommand(['true'], { timeoutMs: ok }), ['true']);
  for (const bad of badTimeouts) refusedByLibrary(t, () => validateCommand(['true'], { timeoutMs: bad }), 'timeoutMs');
});

test('command timeouts: the HTTP run schema has the same limit', async (t) => {
  const timeoutMs = (runBody.properties as Record<string, { maximum: number }>).timeoutMs;
  t.is(timeoutMs.maximum, COMMAND_TIMEOUT_MAX_MS);
  t.true(await httpTakes('run', { cmd: 'true', timeoutMs: COMMAND_TIMEOUT_MAX_MS }));
  for (const bad of badTimeouts.filter(Number.isFinite))
    t.false(await httpTakes('run', { cmd: 'true', timeoutMs: bad }), String(bad));
});

test('command timeouts: the MCP run_command schema has the same limit', (t) => {
  t.is(commandTimeoutArg.maxValue, COMMAND_TIMEOUT_MAX_MS);
  t.true(commandTimeoutArg.safeParse(COMMAND_TIMEOUT_MAX_MS).success);
  for (const bad of badTimeouts) t.false(commandTimeoutArg.safeParse(bad).success, String(bad));
});

// ---- sandbox lifetimes ------------------------------------------------------

test('sandbox lifetimes: the library and the HTTP create schema share 1 s to 30 days', async (t) => {
  const lifetime = (createBody.properties as Record<string, { minimum: number; maximum: number }>).timeoutMs;
  t.deepEqual([lifetime.minimum, lifetime.maximum], [SANDBOX_LIFETIME_MS.min, SANDBOX_LIFETIME_MS.max]);
  for (const ok of [SANDBOX_LIFETIME_MS.min, SANDBOX_LIFETIME_MS.max]) {
    t.is(validateCreateOptions({ timeoutMs: ok }).timeoutMs, ok);
    t.true(await httpTakes('create', { timeoutMs: ok }));
  }
  for (const bad of [SANDBOX_LIFETIME_MS.min - 1, SANDBOX_LIFETIME_MS.max + 1, 1500.5]) {
    refusedByLibrary(t, () => validateCreateOptions({ timeoutMs: bad }), 'timeoutMs');
    t.false(await httpTakes('create', { timeoutMs: bad }), String(bad));
  }
});
