/**
 * Property-based fuzzing of every HTTP route, against a real server on
 * loopback over real sandboxes of two tenants.
 *
 * The routes come from the server itself (`server.routes`, fastify's onRoute),
 * so a new route is fuzzed without editing this file, or this file fails
 * until the route has a generator in GENERATORS. Each run sends one request
 * built by fast-check: ids of the caller's own objects, of the other
 * tenant's, of none, or garbage; path tricks (`..`, encoded slashes, NUL);
 * query strings with unknown, repeated and hostile parameters; bodies whose
 * fields are valid, huge, negative, fractional, unicode, of the wrong type or
 * unknown; wrong content types, broken JSON, oversized bodies; odd
 * Authorization, Accept and Idempotency-Key headers.
 *
 * After each request:
 *  - no 5xx (504 COMMAND_TIMEOUT only when the request set a timeout: the
 *    documented answer for a command that outlived it);
 *  - every 4xx is `{error: {code, message, field?}}` and nothing else;
 *  - a request with another tenant's id, or without a valid token, never
 *    succeeds;
 *  - a refused request changed nothing: catalog rows, the sandboxes' files,
 *    the mounts under the state directory, the set of sandboxes;
 *  - /healthz still answers.
 *
 * LOCKSTEP_FUZZ_RUNS sets the number of requests (default 300, about a
 * minute here); LOCKSTEP_FUZZ_SEED replays a run (the seed is printed).
 */
import test from 'ava';
import fc from 'fast-check';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import type Database from 'better-sqlite3';
import type { Lockstep } from '../../src/index.js';
import { integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { resolveStoreConfig } from '../../src/config.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

const RUNS = Number(process.env.LOCKSTEP_FUZZ_RUNS ?? 300);
const SEED =
  process.env.LOCKSTEP_FUZZ_SEED !== undefined ? Number(process.env.LOCKSTEP_FUZZ_SEED) : randomBytes(4).readInt32LE(0);

/** Small limits, so that oversized bodies are cheap to send. */
const BODY_LIMIT = 64 * 1024;
const FILE_BODY_LIMIT = 256 * 1024;

// ---------------------------------------------------------------- the world

interface Fixture {
  token: string;
  sandbox: string;
  checkpoint: string;
  effect: string;
  snapshot: string;
  /** An exposed port of the sandbox (busybox httpd on 127.0.0.1:8080, started before the checkpoint) and its token. */
  exposure: string;
  portToken: string;
}

interface World {
  a: Fixture;
  b: Fixture;
}

/** A value that may name another tenant's object. */
interface Part {
  text: string;
  cross: boolean;
}

/** One request, as built by a generator. */
interface FuzzRequest {
  /** "METHOD url" of the route it was built for. */
  route?: string;
  method: string;
  /** Raw request target, sent as is (no URL normalisation). */
  target: string;
  headers: Record<string, string>;
  body?: Buffer;
  /** The request names an object of the tenant it does not authenticate as. */
  cross: boolean;
  /** Authenticated as a real tenant (A or B). */
  authenticated: boolean;
  /** The request set a command or wait timeout. */
  timed: boolean;
  /** A proxy request carrying a credential that may open the exposure it names (its token, or its tenant's bearer). */
  portCredential?: boolean;
}

interface Response {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

function send(port: number, r: FuzzRequest): Promise<Response> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = { ...r.headers };
    if (r.body !== undefined) headers['content-length'] = r.body.length;
    const req = http.request(
      { host: '127.0.0.1', port, method: r.method, path: r.target, headers, agent: false, timeout: 60_000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
        );
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer to ${r.method} ${r.target} within 60 s`)));
    req.on('error', reject);
    req.end(r.body);
  });
}

// ---------------------------------------------------------------- building blocks

const part = (text: string, cross = false): Part => ({ text, cross });

/** Hostile text for a path segment, already in request-target form. */
const hostileSegment: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    '..',
    '.',
    '%2e%2e',
    '%2E%2E%2F',
    '..%2F..%2F',
    '%2F',
    'a%2Fb',
    '%00',
    'sbx_%00',
    'sbx_abc%00.json',
    '%E2%80%AE',
    '%C0%AF',
    '%ZZ',
    '%',
    '-1',
    '0',
    '99999999999999999999999',
    'sbx_',
    `sbx_${'a'.repeat(120)}`,
    'x'.repeat(3000),
    'SBX_ABC',
    'sbx_ABC',
    'ckpt_',
    'eff_XYZ',
    '%20',
    '~',
    '*',
  ),
  fc.string({ unit: 'grapheme', maxLength: 40 }).map((s) => encodeURIComponent(s)),
  fc.stringMatching(/^(sbx|ckpt|eff)_[a-z0-9]{1,80}$/),
);

/** An id segment: the caller's own object (mostly), the other tenant's, a missing one, or garbage. */
function idSegment(own: string, other: string, prefix: string): fc.Arbitrary<Part> {
  return fc.oneof(
    { weight: 6, arbitrary: fc.constant(part(own)) },
    { weight: 2, arbitrary: fc.constant(part(other, true)) },
    { weight: 1, arbitrary: fc.constant(part(`${prefix}${'0'.repeat(12)}`)) },
    { weight: 2, arbitrary: hostileSegment.map((s) => part(s)) },
  );
}

/** Numbers around and far past every limit. */
const hostileNumber: fc.Arbitrary<number> = fc.oneof(
  fc.constantFrom(
    0,
    -1,
    -0,
    1,
    0.5,
    -(2 ** 31),
    2 ** 31,
    2 ** 32 + 1,
    2 ** 53,
    2 ** 53 + 2,
    -(2 ** 53),
    1e308,
    -1e308,
    5e-324,
    0o7777,
    0o17777,
  ),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
);

/** Any JSON value, including deep, unicode and prototype-shaped ones. */
const hostileJson: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
  { weight: 2, arbitrary: hostileNumber },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 64 }) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      null,
      true,
      false,
      '',
      ' ',
      '\u0000',
      '\u202e',
      '../../etc/passwd',
      'x'.repeat(5000),
      [],
      {},
      { constructor: { prototype: { polluted: 1 } } },
    ),
  },
);

/** Paths inside a sandbox: ordinary, escaping, special, huge, odd. */
const filePath: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.stringMatching(/^[a-z0-9]{1,12}(\.txt)?$/).map((s) => `fuzz/${s}`) },
  { weight: 2, arbitrary: fc.stringMatching(/^[a-z0-9]{1,12}$/).map((s) => `/workspace/fuzz-${s}`) },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      '../../../../etc/passwd',
      '/workspace/../../../etc/shadow',
      '/..',
      '..',
      '.',
      '/',
      '//',
      '',
      ' ',
      'fuzz/',
      'fuzz/./x',
      'fuzz//x',
      '/proc/self/environ',
      '/proc/1/root/etc/passwd',
      '/dev/null',
      '/dev/zero',
      '/sys/kernel',
      '/.lockstep',
      '/run/lockstep/exit/1',
      'a\u0000b',
      '\u0000',
      'fuzz/\u202eexe.txt',
      'fuzz/😀',
      'fuzz/%2F..%2F..',
      '\\..\\..\\etc',
      'x'.repeat(5000),
      `${'d/'.repeat(2100)}x`,
    ),
  },
  { weight: 1, arbitrary: fc.string({ unit: 'grapheme', maxLength: 30 }) },
);

/** A query string: wanted keys with valid or hostile values, repeated keys, unknown keys, raw junk. */
function queryString(fields: Record<string, fc.Arbitrary<string>>): fc.Arbitrary<string> {
  const pair = (k: string, v: fc.Arbitrary<string>) =>
    v.map((x) => `${encodeURIComponent(k)}=${encodeURIComponent(x)}`);
  const wanted = Object.entries(fields).map(([k, v]) =>
    fc.oneof(
      { weight: 12, arbitrary: pair(k, v).map((p) => [p]) },
      { weight: 1, arbitrary: fc.constant([] as string[]) },
      { weight: 1, arbitrary: fc.tuple(pair(k, v), pair(k, v)).map(([x, y]) => [x, y]) },
      {
        weight: 1,
        arbitrary: fc.string({ maxLength: 20 }).map((x) => [`${encodeURIComponent(k)}=${encodeURIComponent(x)}`]),
      },
      { weight: 1, arbitrary: fc.constant([`${encodeURIComponent(k)}`, `${encodeURIComponent(k)}[]=x`]) },
    ),
  );
  const extra = fc.oneof(
    { weight: 12, arbitrary: fc.constant([] as string[]) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.stringMatching(/^[a-z]{1,8}$/), fc.string({ maxLength: 10 }))
        .map(([k, v]) => [`${k}=${encodeURIComponent(v)}`]),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        ['__proto__[x]=1'],
        ['constructor[prototype][x]=1'],
        ['%00=%00'],
        ['&&&'],
        ['a=%ZZ'],
        ['=x'],
      ),
    },
  );
  return fc.tuple(fc.tuple(...wanted), extra).map(([ws, ex]) => {
    const all = [...ws.flat(), ...ex];
    return all.length ? `?${all.join('&')}` : '';
  });
}

/** A JSON object built from a route's fields: each left out, valid or hostile; sometimes unknown fields. */
function jsonFields(
  fields: Record<string, fc.Arbitrary<unknown>>,
  required: string[] = [],
): fc.Arbitrary<Record<string, unknown>> {
  const entries = Object.entries(fields).map(([k, valid]) =>
    fc.oneof(
      { weight: required.includes(k) ? 8 : 4, arbitrary: valid.map((v) => [k, v] as const) },
      { weight: required.includes(k) ? 1 : 4, arbitrary: fc.constant(undefined) },
      { weight: 2, arbitrary: hostileJson.map((v) => [k, v] as const) },
    ),
  );
  const extra = fc.oneof(
    { weight: 8, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: fc.tuple(fc.string({ maxLength: 12 }), hostileJson).map(([k, v]) => [k, v] as const) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        ['__proto__', { polluted: 1 }] as const,
        ['constructor', { prototype: { polluted: 1 } }] as const,
      ),
    },
  );
  const build = (es: readonly (readonly [string, unknown] | undefined)[]) => {
    const o: Record<string, unknown> = {};
    for (const e of es)
      if (e) Object.defineProperty(o, e[0], { value: e[1], enumerable: true, configurable: true, writable: true });
    return o;
  };
  // A third of the bodies are valid throughout, so that requests get past validation into the handlers.
  const valid = fc.tuple(
    ...Object.entries(fields).map(([k, v]) =>
      required.includes(k)
        ? v.map((x) => [k, x] as const)
        : fc.option(
            v.map((x) => [k, x] as const),
            { nil: undefined },
          ),
    ),
  );
  return fc.oneof(
    { weight: 1, arbitrary: valid.map(build) },
    { weight: 2, arbitrary: fc.tuple(fc.tuple(...entries), extra).map(([es, ex]) => build([...es, ex])) },
  );
}

interface Body {
  contentType?: string;
  bytes?: Buffer;
}

/** How a JSON value travels: as JSON (mostly), under a wrong type, broken, oversized, or not at all. */
function envelope(value: fc.Arbitrary<unknown>): fc.Arbitrary<Body> {
  const json = (v: unknown) => Buffer.from(JSON.stringify(v) ?? 'null');
  return fc.oneof(
    { weight: 24, arbitrary: value.map((v) => ({ contentType: 'application/json', bytes: json(v) })) },
    { weight: 1, arbitrary: fc.constant({}) },
    { weight: 1, arbitrary: fc.constant({ contentType: 'application/json', bytes: Buffer.alloc(0) }) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(
          value,
          fc.constantFrom(
            'text/plain',
            'application/x-www-form-urlencoded',
            'multipart/form-data; boundary=x',
            'application/xml',
            'application/json; charset=utf-16',
            'application/jsonx',
            'APPLICATION/JSON',
            ' application/json ',
            'application/json, text/plain',
            '*/*',
            'application/octet-stream',
          ),
        )
        .map(([v, ct]) => ({ contentType: ct, bytes: json(v) })),
    },
    {
      weight: 1,
      arbitrary: fc
        .constantFrom(
          '{',
          '{"a":',
          '[1,]',
          '{"a":1}{"b":2}',
          'null',
          'nul',
          '\u0000',
          '{"__proto__":{"x":1}}',
          '{"a":"\\ud800"}',
          '"str"',
          '1e999',
          '\ufeff{}',
        )
        .map((t) => ({ contentType: 'application/json', bytes: Buffer.from(t) })),
    },
    {
      weight: 1,
      arbitrary: fc.constant({
        contentType: 'application/json',
        bytes: Buffer.from(JSON.stringify({ content: 'x'.repeat(FILE_BODY_LIMIT + 10) })),
      }),
    },
    {
      weight: 1,
      arbitrary: fc
        .uint8Array({ maxLength: 64 })
        .map((b) => ({ contentType: 'application/json', bytes: Buffer.from(b) })),
    },
  );
}

/** Headers besides the body's: Accept, Idempotency-Key, X-Request-Id, junk. */
const extraHeaders: fc.Arbitrary<Record<string, string>> = fc.record(
  {
    accept: fc.constantFrom(
      'application/json',
      'application/x-ndjson',
      'text/event-stream',
      'application/octet-stream',
      '*/*',
      'text/html',
      'x/y;q=0',
    ),
    'idempotency-key': fc.oneof(
      { weight: 4, arbitrary: fc.stringMatching(/^[a-z0-9-]{1,20}$/) },
      { weight: 1, arbitrary: fc.constantFrom('', ' ', 'k'.repeat(300), 'fuzz-fixed-key') },
    ),
    'x-request-id': fc.oneof(
      fc.stringMatching(/^[A-Za-z0-9._:-]{1,20}$/),
      fc.constantFrom('a b', '../x', 'x'.repeat(500)),
    ),
    'x-forwarded-for': fc.constantFrom('127.0.0.1', '10.0.0.1, ::1'),
  },
  { requiredKeys: [] },
);

type Auth = 'a' | 'b' | 'none' | 'bogus' | 'malformed';
const authArb: fc.Arbitrary<Auth> = fc.oneof(
  { weight: 16, arbitrary: fc.constant<Auth>('a') },
  { weight: 2, arbitrary: fc.constant<Auth>('b') },
  { weight: 1, arbitrary: fc.constant<Auth>('none') },
  { weight: 1, arbitrary: fc.constant<Auth>('bogus') },
  { weight: 1, arbitrary: fc.constant<Auth>('malformed') },
);

function authHeader(w: World, auth: Auth): Record<string, string> {
  switch (auth) {
    case 'a':
      return { authorization: `Bearer ${w.a.token}` };
    case 'b':
      return { authorization: `Bearer ${w.b.token}` };
    case 'none':
      return {};
    case 'bogus':
      return { authorization: `Bearer ${w.a.token.slice(0, -2)}zz` };
    case 'malformed':
      return { authorization: `Basic ${Buffer.from(`a:${w.a.token}`).toString('base64')}` };
  }
}

// ---------------------------------------------------------------- per-route generators

/** The pieces of a request a route's generator chooses. */
interface Shape {
  /** Path with :params replaced (request-target form). */
  path: string;
  query?: string;
  body?: Body;
  /** True when a path parameter names the other tenant's object. */
  cross?: boolean;
  timed?: boolean;
  headers?: Record<string, string>;
  portCredential?: boolean;
  /** The credential is the exposure's own token (not the bearer). */
  portToken?: boolean;
}

type Generator = (w: World, own: Fixture, other: Fixture) => fc.Arbitrary<Shape>;

const safeArgv: fc.Arbitrary<readonly string[]> = fc.oneof(
  fc.array(fc.string({ unit: 'grapheme', maxLength: 20 }), { maxLength: 4 }).map((args) => ['echo', ...args]),
  fc.constantFrom(
    ['true'],
    ['false'],
    ['printf', '%s', 'x'],
    ['cat', '/etc/hostname'],
    ['/nonexistent'],
    ['sh', '-c', 'exit 3'],
    ['ls', '/workspace'],
  ),
);
const safeCmd: fc.Arbitrary<unknown> = fc.oneof(
  safeArgv,
  fc.string({ unit: 'grapheme', maxLength: 30 }).map((s) => `echo '${s.replace(/'/g, '')}'`),
  fc.constantFrom('true', 'echo hi >&2', 'exit 7', 'cat /workspace/fuzz/missing'),
);
const label = fc.oneof(
  fc.string({ unit: 'grapheme', maxLength: 40 }),
  fc.constantFrom('a\nb', '\u0000', 'x'.repeat(201)),
);
const envs = fc.dictionary(
  fc.oneof(
    fc.stringMatching(/^[A-Z_][A-Z0-9_]{0,8}$/),
    fc.constantFrom('1BAD', 'A-B', '', 'PATH', 'LD_PRELOAD', '__proto__'),
  ),
  fc.string({ maxLength: 20 }),
  { maxKeys: 3 },
);
const checkpointRef = (own: Fixture, other: Fixture) =>
  fc.oneof(
    { weight: 4, arbitrary: fc.constant(part(own.checkpoint)) },
    { weight: 2, arbitrary: fc.constant(part(other.checkpoint, true)) },
    { weight: 1, arbitrary: fc.stringMatching(/^ckpt_[a-z0-9]{1,70}$/).map((s) => part(s)) },
  );
const effectRef = (own: Fixture, other: Fixture) => idSegment(own.effect, other.effect, 'eff_');
/** A snapshot by id or by name (the fixtures' are both called "fixture": a name is the tenant's own). */
const snapshotRef = (own: Fixture, other: Fixture) =>
  fc.oneof(
    { weight: 4, arbitrary: idSegment(own.snapshot, other.snapshot, 'snap_') },
    { weight: 1, arbitrary: fc.constantFrom('fixture', 'nosuch', 'Fixture').map((s) => part(s)) },
  );
/** A route under /v1/snapshots/:snap. */
const underSnapshot =
  (suffix: string, more: () => fc.Arbitrary<Omit<Shape, 'path' | 'cross'>> = () => fc.constant({})): Generator =>
  (_w, own, other) =>
    fc
      .tuple(snapshotRef(own, other), more())
      .map(([ref, m]) => ({ ...m, path: `/v1/snapshots/${ref.text}${suffix}`, cross: ref.cross }));
const contextValue = fc.oneof(
  fc.constant({ format: 'openai-chat', messages: [{ role: 'user', content: 'hi' }] }),
  fc.constant([{ role: 'user', content: 'hi' }]),
  fc.record(
    {
      format: fc.constantFrom('bytes', 'anthropic', 'openai-responses', 'langgraph', 'nope'),
      data: fc.string({ maxLength: 20 }),
      messages: hostileJson,
    },
    { requiredKeys: ['format'] },
  ),
  hostileJson,
);

/** `{path, cross}` for a route under /v1/sandboxes/:id with more segments after it. */
function sandboxPath(own: Fixture, other: Fixture, rest: (s: Part) => fc.Arbitrary<{ path: string; cross: boolean }>) {
  return idSegment(own.sandbox, other.sandbox, 'sbx_').chain(rest);
}

/** A generator for a route under a sandbox with only :id in its path. */
function underSandbox(
  suffix: string,
  more: (own: Fixture, other: Fixture) => fc.Arbitrary<Omit<Shape, 'path' | 'cross'>>,
): Generator {
  return (_w, own, other) =>
    fc
      .tuple(idSegment(own.sandbox, other.sandbox, 'sbx_'), more(own, other))
      .map(([id, m]) => ({ ...m, path: `/v1/sandboxes/${id.text}${suffix}`, cross: id.cross }));
}

const noBody = () => fc.constant({});
/** A route with no parameters: only its query string is fuzzed. */
const storeKeyText = fc.constantFrom('fuzz-key', 'fixture', 'missing', 'tn_x', 'a%2Fb', '.hidden', 'x'.repeat(129));
const fixed = (p: string) => queryString({ url: fc.string(), q: fc.string() }).map((query) => ({ path: p, query }));
const fileQuery = (extra: Record<string, fc.Arbitrary<string>> = {}) =>
  queryString({ path: filePath, toolCallId: fc.string({ minLength: 1, maxLength: 10 }), ...extra });

/**
 * The proxy of exposed ports: an exposure of the caller's or of the other
 * tenant, missing or garbage; its token, the other's, garbage or none (then
 * the bearer token of the request decides); a tail and a query. Another
 * tenant's exposure, or the wrong token, must never reach a sandbox.
 */
function proxyGenerator(withTail: boolean): Generator {
  return (_w, own, other) =>
    fc
      .tuple(
        fc.oneof(
          { weight: 6, arbitrary: fc.constant(part(own.exposure)) },
          { weight: 2, arbitrary: fc.constant(part(other.exposure, true)) },
          { weight: 1, arbitrary: fc.constant(part('exp_0000000000000000')) },
          { weight: 1, arbitrary: hostileSegment.map((s) => part(s)) },
        ),
        fc.constantFrom('own', 'other', 'garbage', 'none', 'query'),
        withTail
          ? fc.oneof(
              fc.constantFrom('', 'seed.txt', 'nosuch', '../../etc/passwd', '%2e%2e/%2e%2e/etc/passwd', 'a/b/c'),
              hostileSegment,
            )
          : fc.constant(undefined),
        queryString({ q: fc.string({ maxLength: 10 }) }),
      )
      .map(([exp, cred, tail, query]) => {
        const headers: Record<string, string> = {};
        if (cred === 'own') headers['x-lockstep-token'] = own.portToken;
        if (cred === 'other') headers['x-lockstep-token'] = other.portToken;
        if (cred === 'garbage') headers['x-lockstep-token'] = `${own.portToken.slice(0, -2)}zz`;
        const q = cred === 'query' ? `${query ? `${query}&` : '?'}lockstep_token=${own.portToken}` : query;
        // A token opens its own exposure, whoever sends it (it is a capability): the other's token
        // with the other's exposure is allowed; the tenant's bearer (no token) opens only the tenant's own.
        const ownExposure = exp.text === own.exposure;
        const tokenOpens =
          (ownExposure && (cred === 'own' || cred === 'query')) || (exp.text === other.exposure && cred === 'other');
        const mayOpen = tokenOpens || (ownExposure && cred === 'none');
        return {
          path: `/ports/${exp.text}${tail === undefined ? '' : `/${tail}`}`,
          query: q,
          headers,
          cross: !mayOpen,
          portCredential: mayOpen,
          portToken: tokenOpens,
        };
      });
}

/**
 * One generator per route, keyed "METHOD url" as fastify registered it.
 * HEAD routes share their GET route's generator.
 */
const GENERATORS: Record<string, Generator> = {
  'GET /healthz': () => fixed('/healthz'),
  'GET /openapi.json': () => fixed('/openapi.json'),
  'GET /metrics': () => fixed('/metrics'),
  'GET /docs': () => fixed('/docs'),
  'GET /docs/': () => fixed('/docs/'),
  'GET /docs/json': () => fixed('/docs/json'),
  'GET /docs/yaml': () => fixed('/docs/yaml'),
  'GET /docs/static/index.html': () => fixed('/docs/static/index.html'),
  'GET /docs/static/swagger-initializer.js': () => fixed('/docs/static/swagger-initializer.js'),
  // The static files of Swagger UI: a path-traversal target.
  'GET /docs/static/*': () =>
    fc
      .oneof(
        fc.constantFrom(
          'index.html',
          'swagger-ui.css',
          '../../../../../etc/passwd',
          '..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd',
          '%2e%2e/%2e%2e/%2e%2e/package.json',
          '..%5c..%5cpackage.json',
          '....//....//etc/passwd',
          '%00',
          'index.html%00.js',
          '/etc/passwd',
          '%2Fetc%2Fpasswd',
          '.',
          '..',
          'x'.repeat(3000),
        ),
        fc.string({ unit: 'grapheme', maxLength: 30 }).map((s) => encodeURIComponent(s)),
      )
      .map((p) => ({ path: `/docs/static/${p}` })),

  'POST /v1/sandboxes': () =>
    envelope(
      jsonFields({
        image: fc.constantFrom('base', 'nosuch', '../etc', 'BASE', 'base\u0000'),
        memoryMb: fc.constantFrom(64, 128),
        pids: fc.constantFrom(64, 1024),
        cpuWeight: fc.constantFrom(100),
        cpus: fc.constantFrom(0.5, 1, 0.333),
        diskMb: fc.constantFrom(64),
        ioWeight: fc.constantFrom(100),
        envs,
        timeoutMs: fc.constantFrom(60_000, 999),
        metadata: fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 3 }),
      }),
    ).map((body) => ({ path: '/v1/sandboxes', body })),
  'GET /v1/sandboxes': () => queryString({ limit: fc.string() }).map((query) => ({ path: '/v1/sandboxes', query })),
  'GET /v1/tenant': () => fixed('/v1/tenant'),
  'GET /v1/sandboxes/:id': underSandbox('', noBody),
  // Only the other tenant's sandbox, missing ones and garbage: removing the
  // caller's own fixture would leave nothing to fuzz.
  'DELETE /v1/sandboxes/:id': (_w, _own, other) =>
    fc
      .oneof(
        fc.constant(part(other.sandbox, true)),
        fc.constant(part(`sbx_${'0'.repeat(12)}`)),
        hostileSegment.map((s) => part(s)),
      )
      .map((id) => ({ path: `/v1/sandboxes/${id.text}`, cross: id.cross })),

  'POST /v1/sandboxes/:id/commands': underSandbox('/commands', () =>
    fc
      .tuple(
        envelope(
          jsonFields(
            {
              cmd: safeCmd,
              cwd: fc.constantFrom('/workspace', '/', '/tmp', 'relative', '/nonexistent', '/proc/self'),
              envs,
              timeoutMs: fc.constantFrom(30_000, 60_000),
              toolCallId: fc.string({ minLength: 1, maxLength: 12 }),
              background: fc.constant(false),
            },
            ['cmd'],
          ),
        ),
      )
      .map(([body]) => ({ body, timed: true })),
  ),
  'POST /v1/sandboxes/:id/commands/:pid/wait': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .tuple(
          fc.oneof(fc.integer({ min: 2, max: 99999 }).map(String), hostileSegment),
          envelope(jsonFields({ timeoutMs: fc.constantFrom(1, 100) })),
        )
        .map(([pid, body]) => ({ path: `/v1/sandboxes/${id.text}/commands/${pid}/wait`, cross: id.cross, body })),
    ).map((s) => ({ ...(s as Shape), timed: true })),
  // pid 1 is the sandbox's init; pids the fuzzer cannot know are almost always unused.
  'POST /v1/sandboxes/:id/commands/:pid/kill': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .tuple(
          fc.oneof(fc.integer({ min: 100_000, max: 999_999_999 }).map(String), hostileSegment),
          envelope(jsonFields({ signal: fc.constantFrom('SIGTERM', 'SIGUSR1', 'SIGSTOP', 'KILL', 'sigterm', '9') })),
        )
        .map(([pid, body]) => ({ path: `/v1/sandboxes/${id.text}/commands/${pid}/kill`, cross: id.cross, body })),
    ),

  'GET /v1/sandboxes/:id/files': underSandbox('/files', () =>
    fileQuery({ encoding: fc.constantFrom('utf8', 'base64', 'hex', 'UTF8') }).map((query) => ({ query })),
  ),
  'PUT /v1/sandboxes/:id/files': underSandbox('/files', () =>
    fc
      .tuple(
        fileQuery(),
        fc.oneof(
          {
            weight: 4,
            arbitrary: envelope(
              jsonFields(
                {
                  content: fc.string({ unit: 'grapheme', maxLength: 50 }),
                  encoding: fc.constantFrom('utf8', 'base64'),
                  mode: fc.constantFrom(0o644, 0o755, 0o4755, 0o7777),
                  toolCallId: fc.string({ minLength: 1, maxLength: 10 }),
                },
                ['content'],
              ),
            ),
          },
          {
            weight: 2,
            arbitrary: fc
              .uint8Array({ maxLength: 200 })
              .map((b) => ({ contentType: 'application/octet-stream', bytes: Buffer.from(b) })),
          },
          {
            weight: 1,
            arbitrary: fc.constant({
              contentType: 'application/octet-stream',
              bytes: Buffer.alloc(FILE_BODY_LIMIT + 1, 0x61),
            }),
          },
        ),
      )
      .map(([query, body]) => ({ query, body })),
  ),
  'DELETE /v1/sandboxes/:id/files': underSandbox('/files', () => fileQuery().map((query) => ({ query }))),
  'GET /v1/sandboxes/:id/files/list': underSandbox('/files/list', () => fileQuery().map((query) => ({ query }))),
  'GET /v1/sandboxes/:id/files/exists': underSandbox('/files/exists', () => fileQuery().map((query) => ({ query }))),

  'POST /v1/sandboxes/:id/checkpoints': underSandbox('/checkpoints', () =>
    envelope(
      jsonFields({
        label,
        context: contextValue,
        contextFormat: fc.constantFrom('openai-chat', 'anthropic', 'bytes', 'yaml'),
      }),
    ).map((body) => ({ body })),
  ),
  'GET /v1/sandboxes/:id/checkpoints': underSandbox('/checkpoints', noBody),
  'GET /v1/images': () => fixed('/v1/images'),

  'POST /v1/snapshots': (_w, own, other) =>
    checkpointRef(own, other).chain((ck) =>
      envelope(
        jsonFields(
          {
            checkpointId: fc.constant(ck.text),
            name: fc.constantFrom('fixture', 'fuzzed', 'Bad Name', '../x', 'a'.repeat(65)),
            metadata: fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 3 }),
          },
          ['checkpointId'],
        ),
      ).map((body) => ({ path: '/v1/snapshots', body, cross: ck.cross })),
    ),
  'GET /v1/snapshots': () => fixed('/v1/snapshots'),
  'GET /v1/snapshots/:snap': underSnapshot(''),
  // Only another tenant's snapshot, missing ones and garbage: the fixture's must stay.
  'DELETE /v1/snapshots/:snap': (_w, _own, other) =>
    fc
      .oneof(
        fc.constant(part(other.snapshot, true)),
        fc.constant(part(`snap_${'0'.repeat(12)}`)),
        hostileSegment.map((s) => part(s)),
      )
      .map((ref) => ({ path: `/v1/snapshots/${ref.text}`, cross: ref.cross })),
  'GET /v1/snapshots/:snap/context': underSnapshot('/context'),
  'GET /v1/snapshots/:snap/bundle': underSnapshot('/bundle'),
  'POST /v1/snapshots/:snap/sandboxes': underSnapshot('/sandboxes', () =>
    envelope(jsonFields({ count: fc.constantFrom(1, 2, 64, 65) })).map((body) => ({ body })),
  ),
  'POST /v1/snapshots/import': () =>
    fc
      .tuple(
        queryString({ name: fc.constantFrom('imported', 'Bad Name', '') }),
        fc.oneof(
          fc
            .uint8Array({ maxLength: 300 })
            .map((b) => ({ contentType: 'application/octet-stream', bytes: Buffer.from(b) })),
          fc.constant({
            contentType: 'application/octet-stream',
            bytes: Buffer.from('LSBUNDL1H\u0000\u0000\u0000\u0002{}'),
          }),
          envelope(hostileJson),
        ),
      )
      .map(([query, body]) => ({ path: '/v1/snapshots/import', query, body })),
  'POST /v1/snapshots/pull': (_w, own, other) =>
    envelope(
      jsonFields(
        {
          from: fc.constantFrom('http://127.0.0.1:9', 'http://169.254.169.254', 'file:///etc/passwd', 'not a url'),
          snapshot: fc.constantFrom(own.snapshot, other.snapshot, 'fixture', '../x'),
          token: fc.constantFrom(own.token, 'x', ''),
          name: fc.constantFrom('pulled', 'Bad Name'),
        },
        ['from', 'snapshot', 'token'],
      ),
    ).map((body) => ({ path: '/v1/snapshots/pull', body })),
  // The snapshot store (a folder store the test configures): keys of one segment, only the tenant's own part.
  'POST /v1/snapshots/:snap/push': underSnapshot('/push', () =>
    envelope(jsonFields({ key: storeKeyText })).map((body) => ({ body })),
  ),
  'GET /v1/store/bundles': () => fixed('/v1/store/bundles'),
  'POST /v1/store/bundles/:key/pull': () =>
    fc
      .tuple(
        fc.oneof(storeKeyText, hostileSegment),
        envelope(jsonFields({ name: fc.constantFrom('pulled', 'fixture', 'Bad Name', '../x') })),
      )
      .map(([key, body]) => ({ path: `/v1/store/bundles/${key}/pull`, body })),
  'DELETE /v1/store/bundles/:key': () =>
    fc.oneof(storeKeyText, hostileSegment).map((key) => ({ path: `/v1/store/bundles/${key}` })),
  'POST /v1/sandboxes/:id/ports': underSandbox('/ports', () =>
    // Never 8080: re-exposing the fixture's port would change its token.
    envelope(jsonFields({ port: fc.constantFrom(0, 1, 8081, 65535, 65536, -1, 1.5, '8080') }, ['port'])).map(
      (body) => ({ body }),
    ),
  ),
  'GET /v1/sandboxes/:id/ports': underSandbox('/ports', noBody),
  // Never the caller's own 8080 (the fixture's exposure must stay).
  'DELETE /v1/sandboxes/:id/ports/:port': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .oneof(
          fc.constantFrom('1', '8081', '0', '65536', '-1', '1.5', '0x1f90'),
          id.cross ? fc.constant('8080') : fc.constant('8081'),
          hostileSegment,
        )
        .map((port) => ({ path: `/v1/sandboxes/${id.text}/ports/${port}`, cross: id.cross })),
    ),
  ...Object.fromEntries(
    ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'].flatMap((method) =>
      ['/ports/:exposure', '/ports/:exposure/*'].map((url) => [`${method} ${url}`, proxyGenerator(url.endsWith('*'))]),
    ),
  ),
  'GET /v1/sandboxes/:id/commands': underSandbox('/commands', noBody),
  'GET /v1/sandboxes/:id/commands/:pid/output': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .tuple(
          fc.oneof(
            fc.integer({ min: -5, max: 5_000_000 }).map(String),
            fc.constantFrom('abc', '1e9', '0x10', '1.5', '%2e%2e'),
          ),
          queryString({
            stdoutOffset: fc.oneof(fc.string(), fc.constantFrom('-1', '1e30', '9007199254740993')),
            stderrOffset: fc.string(),
          }),
        )
        .map(([pid, query]) => ({ path: `/v1/sandboxes/${id.text}/commands/${pid}/output`, query, cross: id.cross })),
    ),
  // Stdin and PTYs: pids the fuzzer cannot know are almost always unused; a PTY it creates runs `true` or bad input.
  'POST /v1/sandboxes/:id/commands/:pid/stdin': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .tuple(
          fc.oneof(fc.integer({ min: 100_000, max: 999_999_999 }).map(String), hostileSegment),
          fc
            .uint8Array({ maxLength: 200 })
            .map((b) => ({ contentType: 'application/octet-stream', bytes: Buffer.from(b) })),
        )
        .map(([pid, body]) => ({ path: `/v1/sandboxes/${id.text}/commands/${pid}/stdin`, cross: id.cross, body })),
    ),
  'POST /v1/sandboxes/:id/commands/:pid/stdin/close': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .oneof(fc.integer({ min: 100_000, max: 999_999_999 }).map(String), hostileSegment)
        .map((pid) => ({ path: `/v1/sandboxes/${id.text}/commands/${pid}/stdin/close`, cross: id.cross })),
    ),
  'POST /v1/sandboxes/:id/pty': underSandbox('/pty', () =>
    envelope(
      jsonFields(
        {
          cols: fc.constantFrom(0, 1, 80, 65535, 65536, -1, 1.5),
          rows: fc.constantFrom(0, 24, 70000),
          cmd: fc.constantFrom('true', ['true'], [], '', ['/nonexistent']),
          cwd: fc.constantFrom('/workspace', 'relative', '/nonexistent'),
          envs,
        },
        ['cols', 'rows'],
      ),
    ).map((body) => ({ body, timed: true })),
  ),
  'GET /v1/sandboxes/:id/pty': underSandbox('/pty', noBody),
  ...Object.fromEntries(
    (['output', 'stream'] as const).map((verb) => [
      `GET /v1/sandboxes/:id/pty/:pid/${verb}`,
      ((_w, own, other) =>
        sandboxPath(own, other, (id) =>
          fc
            .tuple(
              fc.oneof(fc.integer({ min: 100_000, max: 999_999_999 }).map(String), hostileSegment),
              queryString({ offset: fc.oneof(fc.string(), fc.constantFrom('-1', '1e30', '0', '12')) }),
            )
            .map(([pid, query]) => ({ path: `/v1/sandboxes/${id.text}/pty/${pid}/${verb}`, query, cross: id.cross })),
        )) satisfies Generator,
    ]),
  ),
  ...Object.fromEntries(
    (['input', 'resize', 'wait', 'kill'] as const).map((verb) => [
      `POST /v1/sandboxes/:id/pty/:pid/${verb}`,
      ((_w, own, other) =>
        sandboxPath(own, other, (id) =>
          fc
            .tuple(
              fc.oneof(fc.integer({ min: 100_000, max: 999_999_999 }).map(String), hostileSegment),
              verb === 'input'
                ? fc
                    .uint8Array({ maxLength: 100 })
                    .map((b) => ({ contentType: 'application/octet-stream', bytes: Buffer.from(b) }))
                : envelope(
                    jsonFields({
                      cols: fc.constantFrom(0, 80),
                      rows: fc.constantFrom(24, 1e9),
                      timeoutMs: fc.constantFrom(1, 100),
                    }),
                  ),
            )
            .map(([pid, body]) => ({ path: `/v1/sandboxes/${id.text}/pty/${pid}/${verb}`, cross: id.cross, body })),
        )) satisfies Generator,
    ]),
  ),
  // MCP over streamable HTTP: JSON-RPC of every shape, with no session (a
  // tool call is refused) or opening one (initialize answers, and changes no row).
  'POST /mcp': () =>
    envelope(
      jsonFields(
        {
          jsonrpc: fc.constantFrom('2.0', '1.0', 2),
          id: fc.oneof(fc.integer(), fc.string({ maxLength: 8 }), fc.constant(null)),
          method: fc.constantFrom('initialize', 'tools/list', 'tools/call', 'resources/list', 'nope', ''),
          params: fc.oneof(
            hostileJson,
            fc.constant({ name: 'kill_sandbox', arguments: { sandboxId: 'sbx_000000000000' } }),
          ),
        },
        ['jsonrpc', 'method'],
      ),
    ).map((body) => ({ path: '/mcp', body })),
  'GET /mcp': () => fixed('/mcp'),
  'DELETE /mcp': () => fixed('/mcp'),
  'GET /v1/sandboxes/:id/checkpoints/:ckpt/context': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      idSegment(own.checkpoint, other.checkpoint, 'ckpt_').map((c) => ({
        path: `/v1/sandboxes/${id.text}/checkpoints/${c.text}/context`,
        cross: id.cross || c.cross,
      })),
    ),
  // Never the caller's own fixture checkpoint (rollbacks use it).
  'DELETE /v1/sandboxes/:id/checkpoints/:ckpt': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc
        .oneof(
          fc.constant(part(other.checkpoint, true)),
          fc.constant(part(`ckpt_${'0'.repeat(12)}`)),
          hostileSegment.map((s) => part(s)),
        )
        .map((c) => ({ path: `/v1/sandboxes/${id.text}/checkpoints/${c.text}`, cross: id.cross || c.cross })),
    ),
  'POST /v1/sandboxes/:id/rollback': (_w, own, other) =>
    fc.tuple(idSegment(own.sandbox, other.sandbox, 'sbx_'), checkpointRef(own, other)).chain(([id, ck]) =>
      envelope(
        jsonFields(
          {
            checkpointId: fc.constant(ck.text),
            policy: fc.constantFrom('warn', 'refuse'),
            failure: fc.string({ maxLength: 30 }),
            lessons: fc.array(fc.string({ maxLength: 10 }), { maxLength: 3 }),
            withRecoverySummary: fc.boolean(),
          },
          ['checkpointId'],
        ),
      ).map((body) => ({
        path: `/v1/sandboxes/${id.text}/rollback`,
        body,
        cross: id.cross || ck.cross,
      })),
    ),
  'POST /v1/sandboxes/:id/fork': (_w, own, other) =>
    fc
      .tuple(idSegment(own.sandbox, other.sandbox, 'sbx_'), checkpointRef(own, other))
      .chain(([id, ck]) =>
        envelope(
          jsonFields({ checkpointId: fc.constant(ck.text), count: fc.constantFrom(1, 2, 64, 65) }, ['checkpointId']),
        ).map((body) => ({ path: `/v1/sandboxes/${id.text}/fork`, body, cross: id.cross || ck.cross })),
      ),

  'POST /v1/sandboxes/:id/effects': underSandbox('/effects', () =>
    envelope(
      jsonFields(
        {
          kind: fc.string({ minLength: 1, maxLength: 20 }),
          input: hostileJson,
          reversibility: fc.constantFrom('sandbox-local', 'compensable', 'irreversible'),
          scope: fc.constantFrom('lineage', 'branch'),
          key: fc.string({ minLength: 1, maxLength: 10 }),
          toolCallId: fc.string({ minLength: 1, maxLength: 10 }),
          compensation: fc.record({ kind: fc.string({ minLength: 1, maxLength: 5 }), input: hostileJson }),
        },
        ['kind', 'input', 'reversibility'],
      ),
    ).map((body) => ({ body })),
  ),
  'GET /v1/sandboxes/:id/effects': underSandbox('/effects', noBody),
  'GET /v1/sandboxes/:id/effects/:effectId': (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      effectRef(own, other).map((e) => ({
        path: `/v1/sandboxes/${id.text}/effects/${e.text}`,
        cross: id.cross || e.cross,
      })),
    ),
  'POST /v1/sandboxes/:id/effects/:effectId/commit': effectVerb('commit', () => jsonFields({ output: hostileJson })),
  'POST /v1/sandboxes/:id/effects/:effectId/fail': effectVerb('fail', () =>
    jsonFields(
      {
        error: fc.oneof(
          fc.string({ maxLength: 20 }),
          fc.record(
            { message: fc.string(), name: fc.string({ minLength: 1 }), code: fc.string({ minLength: 1 }) },
            { requiredKeys: ['message'] },
          ),
        ),
        definite: fc.boolean(),
      },
      ['error', 'definite'],
    ),
  ),
  'POST /v1/sandboxes/:id/effects/:effectId/resolve': effectVerb('resolve', () =>
    jsonFields({ outcome: fc.constantFrom('committed', 'failed'), output: hostileJson }, ['outcome']),
  ),
  'GET /v1/sandboxes/:id/observations': underSandbox('/observations', () =>
    queryString({ includeStale: fc.constantFrom('true', 'false', 'yes', '1') }).map((query) => ({ query })),
  ),
  'POST /v1/sandboxes/:id/verdicts': underSandbox('/verdicts', () =>
    envelope(
      jsonFields(
        {
          path: filePath,
          verdict: fc.string({ maxLength: 20 }),
          toolCallId: fc.string({ minLength: 1, maxLength: 10 }),
        },
        ['path', 'verdict'],
      ),
    ).map((body) => ({ body })),
  ),
  'GET /v1/sandboxes/:id/verdicts': underSandbox('/verdicts', () =>
    queryString({ stale: fc.constantFrom('true', 'false', 'TRUE', '') }).map((query) => ({ query })),
  ),
};

function effectVerb(verb: string, body: () => fc.Arbitrary<Record<string, unknown>>): Generator {
  return (_w, own, other) =>
    sandboxPath(own, other, (id) =>
      fc.tuple(effectRef(own, other), envelope(body())).map(([e, b]) => ({
        path: `/v1/sandboxes/${id.text}/effects/${e.text}/${verb}`,
        cross: id.cross || e.cross,
        body: b,
      })),
    ) as fc.Arbitrary<Shape>;
}

/** The generator of a route: its own, its GET route's for HEAD, or undefined. */
function generatorFor(method: string, url: string): Generator | undefined {
  return GENERATORS[`${method} ${url}`] ?? (method === 'HEAD' ? GENERATORS[`GET ${url}`] : undefined);
}

// ---------------------------------------------------------------- state: what a refused request must not change

function catalogDigest(db: Database.Database): Record<string, string> {
  const tables = (
    db
      .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
      .all() as { name: string }[]
  ).map((r) => r.name);
  return Object.fromEntries(
    tables.map((t) => {
      const rows = db.prepare(`SELECT * FROM "${t}"`).raw().all();
      const h = createHash('sha256');
      for (const r of rows)
        h.update(
          JSON.stringify(r, (_k, v: unknown) =>
            Buffer.isBuffer(v) ? v.toString('base64') : typeof v === 'bigint' ? v.toString() : v,
          ),
        ).update('\n');
      return [t, `${rows.length}:${h.digest('hex').slice(0, 16)}`];
    }),
  );
}

/** Every entry of a sandbox's writable layer: type, mode, size and content hash. */
function treeDigest(dir: string): string {
  const h = createHash('sha256');
  const walk = (d: string) => {
    let names: string[];
    try {
      names = fs.readdirSync(d).sort();
    } catch {
      return;
    }
    for (const n of names) {
      const p = path.join(d, n);
      const st = fs.lstatSync(p);
      h.update(`${path.relative(dir, p)}\0${st.mode}\0${st.size}\0`);
      if (st.isDirectory()) walk(p);
      else if (st.isFile()) h.update(fs.readFileSync(p));
      else if (st.isSymbolicLink()) h.update(fs.readlinkSync(p));
    }
  };
  walk(dir);
  return h.digest('hex').slice(0, 16);
}

/** The state after queued background work (warm standbys, cleanups) has settled. */
async function stateDigest(ls: Lockstep, w: World): Promise<Record<string, unknown>> {
  await ls.engine.drainLocks();
  const home = ls.engine.paths.home;
  return {
    catalog: catalogDigest(ls.engine.catalog.db),
    sandboxes: ls
      .list()
      .map((s) => `${s.id}:${s.state}:${s.headCheckpointId}`)
      .sort(),
    // The writable layer of each fixture's live instance (a rollback may switch instances).
    files: Object.fromEntries(
      [w.a.sandbox, w.b.sandbox].map((id) => [
        id,
        treeDigest(ls.engine.layers.upperDir(ls.engine.catalog.sandbox(id)?.instance ?? id).upper),
      ]),
    ),
    mounts: fs
      .readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4])
      .filter((m): m is string => m !== undefined && m.startsWith(home))
      .sort(),
  };
}

// ---------------------------------------------------------------- the run

/** The error shape, exactly. */
function errorShapeProblem(res: Response): string | undefined {
  const ct = String(res.headers['content-type'] ?? '');
  if (!ct.startsWith('application/json')) return `content-type ${JSON.stringify(ct)}`;
  let b: unknown;
  try {
    b = JSON.parse(res.body.toString('utf8'));
  } catch {
    return 'a body that is not JSON';
  }
  const keys = (o: unknown) => (o && typeof o === 'object' && !Array.isArray(o) ? Object.keys(o).sort().join(',') : '');
  if (keys(b) !== 'error') return `top-level keys ${keys(b)}`;
  const e = (b as { error: Record<string, unknown> }).error;
  if (!['code,message', 'code,field,message'].includes(keys(e))) return `error keys ${keys(e)}`;
  if (typeof e.code !== 'string' || !/^[A-Z][A-Z0-9_]*$/.test(e.code)) return `code ${JSON.stringify(e.code)}`;
  if (typeof e.message !== 'string' || e.message === '') return 'an empty message';
  if (e.field !== undefined && typeof e.field !== 'string') return `field ${JSON.stringify(e.field)}`;
  return undefined;
}

function describe(r: FuzzRequest): string {
  const body =
    r.body === undefined
      ? ''
      : ` body(${r.body.length} B, ${r.headers['content-type'] ?? 'no type'}): ${JSON.stringify(r.body.subarray(0, 300).toString('utf8'))}`;
  const { authorization: _a, ...h } = r.headers;
  return `${r.method} ${r.target.slice(0, 300)} headers ${JSON.stringify(h)}${body}`;
}

integration(test, () => {
  test.serial(
    'every route, fuzzed: no 5xx, typed 4xx, nothing changed by a refusal, the server keeps answering',
    async (t) => {
      t.timeout(10 * 60_000);
      const store = path.join(TEST_ROOT, `fuzz-store-${process.pid}-${Date.now()}`);
      t.teardown(async () => fs.rmSync(store, { recursive: true, force: true }));
      const ls = await openTestLockstep(t, { open: { config: { snapshotStore: resolveStoreConfig({ url: store }) } } });
      const { app, client } = await startServer(t, ls, { bodyLimit: BODY_LIMIT, fileBodyLimit: FILE_BODY_LIMIT });
      const port = Number(new URL(client.base).port);

      // Two tenants, each one sandbox with a checkpoint and an effect; the
      // quota leaves room for one more sandbox (a fuzzed create or fork),
      // removed again after it succeeds.
      const fixture = async (name: string): Promise<Fixture> => {
        const token = tenantToken(ls, name, { maxSandboxes: 2 });
        const api = client.as(token);
        const sandbox = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id as string;
        await api.put(`/v1/sandboxes/${sandbox}/files?path=fuzz/seed.txt`, { content: `seed of ${name}` });
        // A port to expose, listening before the checkpoint (a fuzzed rollback restores it).
        await api.post(`/v1/sandboxes/${sandbox}/commands`, {
          cmd: ['httpd', '-f', '-p', '127.0.0.1:8080', '-h', '/workspace/fuzz'],
          background: true,
        });
        let exposed = await api.post(`/v1/sandboxes/${sandbox}/ports`, { port: 8080 });
        for (let i = 0; exposed.status !== 201 && i < 50; i++) {
          await new Promise((r) => setTimeout(r, 100));
          exposed = await api.post(`/v1/sandboxes/${sandbox}/ports`, { port: 8080 });
        }
        const checkpoint = (await api.post(`/v1/sandboxes/${sandbox}/checkpoints`, { label: 'fixture' })).body
          .id as string;
        const effect = (
          await api.post(`/v1/sandboxes/${sandbox}/effects`, {
            kind: 'email',
            input: { to: name },
            reversibility: 'irreversible',
          })
        ).body.effectId as string;
        const snapshot = (await api.post('/v1/snapshots', { checkpointId: checkpoint, name: 'fixture' })).body
          .id as string;
        t.truthy(sandbox && checkpoint && effect && snapshot && exposed.status === 201, `fixture of ${name}`);
        return {
          token,
          sandbox,
          checkpoint,
          effect,
          snapshot,
          exposure: exposed.body.id,
          portToken: exposed.body.token,
        };
      };
      const w: World = { a: await fixture('acme'), b: await fixture('globex') };
      const fixtures = new Set([w.a.sandbox, w.b.sandbox]);

      // Every route the server has needs a generator.
      await app.ready();
      const routes = app.routes.map((r) => ({ ...r, gen: generatorFor(r.method, r.url) }));
      const missing = routes.filter((r) => !r.gen).map((r) => `${r.method} ${r.url}`);
      t.deepEqual(missing, [], 'routes without a generator in test/integration/http-fuzz.test.ts');
      if (missing.length) return;
      t.log(
        `fuzzing ${routes.length} routes with ${RUNS} requests; seed ${SEED} (LOCKSTEP_FUZZ_SEED=${SEED} replays it)`,
      );
      console.log(`[http-fuzz] seed ${SEED}, ${RUNS} runs, ${routes.length} routes`);

      const request: fc.Arbitrary<FuzzRequest> = fc
        // The API's own routes (not HEAD twins, not the docs) get most of the requests.
        .tuple(
          fc.oneof(
            ...routes.map((r) => ({
              weight: r.url.startsWith('/v1') && r.method !== 'HEAD' ? 6 : 1,
              arbitrary: fc.constant(r),
            })),
          ),
          authArb,
          extraHeaders,
        )
        .chain(([route, auth, headers]) => {
          const key = `${route.method} ${route.url}`;
          // Who is "own" follows the token: B's requests use B's ids as their own.
          const own = auth === 'b' ? w.b : w.a;
          const other = auth === 'b' ? w.a : w.b;
          return route.gen!(w, own, other).map((shape): FuzzRequest => {
            const h: Record<string, string> = { ...headers, ...authHeader(w, auth), ...shape.headers };
            if (shape.body?.contentType !== undefined) h['content-type'] = shape.body.contentType;
            return {
              route: key,
              method: route.method,
              target: shape.path + (shape.query ?? ''),
              headers: h,
              ...(shape.body?.bytes !== undefined && route.method !== 'GET' && route.method !== 'HEAD'
                ? { body: shape.body.bytes }
                : {}),
              cross: shape.cross ?? false,
              authenticated: auth === 'a' || auth === 'b',
              timed: shape.timed ?? false,
              // No token: only the caller's own bearer opens its own exposure.
              portCredential:
                shape.portCredential === true && (shape.portToken === true || auth === 'a' || auth === 'b'),
            };
          });
        });

      const counts = { requests: 0, ok: 0, refused: 0, byStatus: {} as Record<number, number> };
      const byRoute = new Map<string, Record<number, number>>();
      await fc.assert(
        fc.asyncProperty(request, async (r) => {
          const before = await stateDigest(ls, w);
          const res = await send(port, r);
          counts.requests++;
          counts.byStatus[res.status] = (counts.byStatus[res.status] ?? 0) + 1;
          const tally = byRoute.get(r.route ?? '') ?? {};
          tally[res.status] = (tally[res.status] ?? 0) + 1;
          byRoute.set(r.route ?? '', tally);
          const what = `${describe(r)} -> ${res.status} ${res.body.subarray(0, 400).toString('utf8')}`;

          // An answer the proxy relayed from a sandbox (Via: … lockstep) is that sandbox's, not the API's:
          // it must come from a request that could open the exposure, and is exempt from the API's error shape.
          const proxied = /(^|, )1\.1 lockstep$/.test(String(res.headers.via ?? ''));
          if (proxied && (r.cross || !r.portCredential))
            throw new Error(`proxied without a credential for it: ${what}`);
          if (proxied) {
            counts.ok++;
            return;
          }
          const timedOut = res.status === 504 && r.timed && res.body.includes('COMMAND_TIMEOUT');
          if (res.status >= 500 && !timedOut) throw new Error(`5xx: ${what}`);
          if (res.status >= 400 && r.method !== 'HEAD') {
            const problem = errorShapeProblem(res);
            if (problem) throw new Error(`untyped error (${problem}): ${what}`);
          }
          if (res.status < 400 && r.target.startsWith('/v1') && !r.authenticated)
            throw new Error(`succeeded without a valid token: ${what}`);
          if (res.status < 400 && r.cross) throw new Error(`succeeded on another tenant's object: ${what}`);
          if (
            res.status === 200 &&
            r.target.startsWith('/docs/static/') &&
            /root:x:0:0|"name": "lockstep"/.test(res.body.toString('latin1'))
          )
            throw new Error(`served a file outside Swagger UI: ${what}`);

          if (res.status >= 400) {
            counts.refused++;
            const after = await stateDigest(ls, w);
            const changed = Object.keys(before).filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]));
            if (changed.length) {
              const diff = changed
                .map((k) => `${k}: ${JSON.stringify(before[k])} -> ${JSON.stringify(after[k])}`)
                .join('\n');
              throw new Error(`a refused request changed state: ${what}\n${diff}`);
            }
          } else {
            counts.ok++;
            // Sandboxes a create or fork made: removed, so the quota has room again; snapshots too.
            for (const s of ls.list()) if (!fixtures.has(s.id)) await ls.remove(s.id);
            for (const s of ls.snapshots.list())
              if (s.id !== w.a.snapshot && s.id !== w.b.snapshot) await ls.snapshots.delete(s.id);
          }
          const health = await send(port, {
            method: 'GET',
            target: '/healthz',
            headers: {},
            cross: false,
            authenticated: false,
            timed: false,
          });
          if (health.status !== 200 || JSON.parse(health.body.toString()).ok !== true)
            throw new Error(`/healthz answered ${health.status} after ${what}`);
        }),
        { numRuns: RUNS, seed: SEED, endOnFailure: true, includeErrorInReport: true },
      );
      t.log(`answers: ${JSON.stringify(counts)}`);
      if (process.env.LOCKSTEP_FUZZ_VERBOSE)
        for (const [k, v] of [...byRoute].sort()) t.log(`${k}: ${JSON.stringify(v)}`);

      // The fixtures are whole and their own tenants still reach them.
      for (const [name, f] of [
        ['acme', w.a],
        ['globex', w.b],
      ] as const) {
        const api = client.as(f.token);
        const run = await api.post(`/v1/sandboxes/${f.sandbox}/commands`, { cmd: ['cat', '/workspace/fuzz/seed.txt'] });
        t.is(run.status, 200, `${name} can still run commands`);
        t.true(typeof run.body.stdout === 'string', `${name}: ${run.text}`);
        const ctx = await api.get(`/v1/sandboxes/${f.sandbox}/checkpoints/${f.checkpoint}/context`);
        t.is(ctx.status, 200, `${name}'s fixture checkpoint is still there`);
        t.is((await api.get(`/v1/sandboxes/${f.sandbox}/effects/${f.effect}`)).body.id, f.effect);
      }
      t.true(
        counts.ok > 0 && counts.refused > 0,
        `both accepted and refused requests were made: ${JSON.stringify(counts)}`,
      );
    },
  );
});
