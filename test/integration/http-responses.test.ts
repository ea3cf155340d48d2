/**
 * The OpenAPI document describes what the server answers (issue 26, "one
 * description of the API"): each success response lists its fields, and the
 * descriptions are true. One sandbox is taken through the API's operations
 * on a real server, and every answer is validated (ajv, `nullable` as OpenAPI
 * 3.0.3 has it) against the schema its operation and status have in the
 * server's own /openapi.json. The objects there are closed where the answer
 * is (additionalProperties: false), so a field the handler sends and the
 * document does not name fails here, as does one the document requires and
 * the handler leaves out, or a null where the document allows none.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Ajv, type ValidateFunction } from 'ajv';
import type { Lockstep } from '../../src/index.js';
import { resolveStoreConfig } from '../../src/config.js';
import { eventually, integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { startServer, tenantToken, type ApiClient, type ApiResponse } from '../fixtures/http-client.js';

/**
 * Success responses this file does not call, with the reason (none: the
 * server has a folder snapshot store, and a second server pulls from it).
 */
const NOT_CALLED: Record<string, string> = {};

/** Success responses that are not JSON objects, so have no fields to list, with the reason. */
const NO_FIELDS: Record<string, string> = {
  'GET /v1/sandboxes/{id}/pty/{pid}/stream 200': 'an NDJSON stream of the terminal (events documented in prose)',
  'GET /v1/snapshots/{snap}/bundle 200': 'the raw bytes of the bundle',
  'GET /v1/snapshots/{snap}/bundle 206': 'a byte range of the bundle',
};

const METHODS = ['get', 'put', 'post', 'delete'];

interface SuccessResponse {
  key: string;
  /** The JSON schema, when the response is application/json. */
  schema?: Record<string, unknown>;
}

function successResponses(doc: any): SuccessResponse[] {
  const out: SuccessResponse[] = [];
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      for (const [status, res] of Object.entries<any>(op.responses ?? {})) {
        if (!/^2\d\d$/.test(status)) continue;
        out.push({
          key: `${method.toUpperCase()} ${path} ${status}`,
          schema: res.content?.['application/json']?.schema,
        });
      }
    }
  }
  return out;
}

/** Whether a schema lists fields: an object's properties, an array's items', or every branch of a oneOf. */
function listsFields(s: any): boolean {
  if (!s || typeof s !== 'object') return false;
  if (Array.isArray(s.oneOf)) return s.oneOf.length > 0 && s.oneOf.every(listsFields);
  if (s.type === 'array') return listsFields(s.items);
  return s.type === 'object' && Object.keys(s.properties ?? {}).length > 0;
}

/** Every object schema, at any depth, that names no properties and is not an open map on purpose. */
function fieldlessObjects(s: any, at: string, out: string[]): string[] {
  if (!s || typeof s !== 'object') return out;
  if (s.type === 'object' && Object.keys(s.properties ?? {}).length === 0 && !s.additionalProperties) out.push(at);
  for (const [k, v] of Object.entries<any>(s.properties ?? {})) fieldlessObjects(v, `${at}.${k}`, out);
  if (s.items) fieldlessObjects(s.items, `${at}[]`, out);
  (s.oneOf ?? []).forEach((b: unknown, i: number) => fieldlessObjects(b, `${at}|${i}`, out));
  return out;
}

integration(test, () => {
  const cleanups: (() => Promise<void>)[] = [];
  const owner = { teardown: (fn: () => Promise<void>) => void cleanups.push(fn) };
  let doc: any;
  let api: ApiClient;
  let ls: Lockstep;
  const validators = new Map<string, ValidateFunction>();

  test.before('start a server, fetch /openapi.json, compile its success schemas', async () => {
    const storeDir = path.join(TEST_ROOT, `responses-store-${process.pid}-${randomBytes(4).toString('hex')}`);
    owner.teardown(async () => fs.rmSync(storeDir, { recursive: true, force: true }));
    ls = await openTestLockstep(owner, {
      images: ['base'],
      open: { config: { snapshotStore: resolveStoreConfig({ url: storeDir, chunkMib: 1 }) } },
    });
    const { client } = await startServer(owner, ls);
    api = client.as(tenantToken(ls, 'responses'));
    const res = await client.get('/openapi.json');
    if (res.status !== 200) throw new Error(`GET /openapi.json answered ${res.status}: ${res.text}`);
    doc = res.body;
    // strict: an unknown keyword in the document fails the compile rather
    // than being ignored; `nullable` is OpenAPI's, which ajv implements.
    const ajv = new Ajv({ strict: true, allErrors: true });
    ajv.addFormat('date-time', {
      type: 'string',
      validate: (s: string) =>
        /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/.test(s) && !Number.isNaN(Date.parse(s)),
    });
    for (const r of successResponses(doc)) if (r.schema) validators.set(r.key, ajv.compile(r.schema));
  });
  test.after.always('stop the server, remove the state directory', async () => {
    for (const fn of cleanups.reverse()) await fn();
  });

  test('every success response of /openapi.json lists its fields, or is listed with the reason it has none', (t) => {
    const responses = successResponses(doc);
    t.true(responses.length >= 55, `the document lists the API's success responses (${responses.length})`);
    t.deepEqual(
      responses.filter((r) => !(r.key in NO_FIELDS) && !listsFields(r.schema)).map((r) => r.key),
      [],
      'success responses whose schema lists no fields',
    );
    t.deepEqual(
      responses.flatMap((r) => (r.key in NO_FIELDS ? [] : fieldlessObjects(r.schema, r.key, []))),
      [],
      'objects inside answers that name no fields and are not open maps',
    );
    const keys = new Set(responses.map((r) => r.key));
    t.deepEqual(
      Object.keys({ ...NO_FIELDS, ...NOT_CALLED }).filter((k) => !keys.has(k)),
      [],
      'NO_FIELDS and NOT_CALLED name responses the document has',
    );
  });

  test('every JSON answer of a real sandbox fits its operation’s response schema in /openapi.json', async (t) => {
    const called = new Set<string>();
    /** Calls METHOD template (with its params filled), expects `status`, validates the body against the document. */
    async function call(
      method: 'GET' | 'PUT' | 'POST' | 'DELETE',
      template: string,
      params: Record<string, string | number>,
      status: number,
      opts: { body?: unknown; raw?: boolean; headers?: Record<string, string> } = {},
    ): Promise<ApiResponse> {
      const path = template.replace(/\{(\w+)\}/g, (_, k: string) => encodeURIComponent(String(params[k])));
      const query = params.query === undefined ? '' : `?${params.query}`;
      const res = await api.req(method, path + query, opts);
      const key = `${method} ${template} ${status}`;
      t.is(res.status, status, `${key}: ${res.text}`);
      const validate = validators.get(key);
      if (!validate) {
        t.fail(`${key}: the document has no JSON schema for this answer`);
        return res;
      }
      t.true(
        validate(res.body),
        `${key} answered what its schema does not describe: ${JSON.stringify(validate.errors)}\n${res.text}`,
      );
      called.add(key);
      return res;
    }

    const tenant = await call('GET', '/v1/tenant', {}, 200);
    t.is(tenant.body.name, 'responses');
    await call('GET', '/v1/images', {}, 200);
    const created = await call('POST', '/v1/sandboxes', {}, 201, {
      body: { image: 'base', memoryMb: 128, metadata: { suite: 'responses' } },
    });
    const id: string = created.body.id;
    const sb = { id };
    await call('GET', '/v1/sandboxes', {}, 200);
    await call('GET', '/v1/sandboxes/{id}', sb, 200);

    // Commands: one run to its end, one in the background with stdin.
    const ran = await call('POST', '/v1/sandboxes/{id}/commands', sb, 200, { body: { cmd: 'echo hi; echo oops >&2' } });
    t.is(ran.body.stdout, 'hi\n');
    const bg = await call('POST', '/v1/sandboxes/{id}/commands', sb, 200, {
      body: { cmd: 'cat > /workspace/in.txt', background: true, stdin: true },
    });
    const cmd = { id, pid: bg.body.pid as number };
    await call('GET', '/v1/sandboxes/{id}/commands', sb, 200);
    await call('POST', '/v1/sandboxes/{id}/commands/{pid}/stdin', cmd, 200, {
      body: Buffer.from('typed\n'),
      raw: true,
      headers: { 'content-type': 'application/octet-stream' },
    });
    await call('POST', '/v1/sandboxes/{id}/commands/{pid}/stdin/close', cmd, 200);
    const waited = await call('POST', '/v1/sandboxes/{id}/commands/{pid}/wait', cmd, 200, { body: {} });
    t.is(waited.body.exitCode, 0);
    await call('GET', '/v1/sandboxes/{id}/commands/{pid}/output', cmd, 200);
    const sleeper = await call('POST', '/v1/sandboxes/{id}/commands', sb, 200, {
      body: { cmd: ['sleep', '600'], background: true },
    });
    await call('POST', '/v1/sandboxes/{id}/commands/{pid}/kill', { id, pid: sleeper.body.pid }, 200, { body: {} });

    // A terminal.
    const pty = await call('POST', '/v1/sandboxes/{id}/pty', sb, 200, { body: { cols: 80, rows: 24, cmd: 'cat' } });
    const term = { id, pid: pty.body.pid as number };
    await call('GET', '/v1/sandboxes/{id}/pty', sb, 200);
    await call('POST', '/v1/sandboxes/{id}/pty/{pid}/input', term, 200, {
      body: Buffer.from('hello\n'),
      raw: true,
      headers: { 'content-type': 'application/octet-stream' },
    });
    await call('POST', '/v1/sandboxes/{id}/pty/{pid}/resize', term, 200, { body: { cols: 100, rows: 30 } });
    await call('GET', '/v1/sandboxes/{id}/pty/{pid}/output', term, 200);
    const ptyKilled = await call('POST', '/v1/sandboxes/{id}/pty/{pid}/kill', term, 200);
    t.true(ptyKilled.body.killed);
    await call('POST', '/v1/sandboxes/{id}/pty/{pid}/wait', term, 200, { body: {} });

    // Files.
    const file = { id, query: 'path=/workspace/a.txt' };
    await call('PUT', '/v1/sandboxes/{id}/files', file, 200, { body: { content: 'alpha\n' } });
    const read = await call('GET', '/v1/sandboxes/{id}/files', file, 200);
    t.is(read.body.content, 'alpha\n');
    await call('GET', '/v1/sandboxes/{id}/files/list', { id, query: 'path=/workspace' }, 200);
    await call('GET', '/v1/sandboxes/{id}/files/exists', file, 200);

    // Provenance: a verdict on the file, the observations so far.
    await call('POST', '/v1/sandboxes/{id}/verdicts', sb, 201, { body: { path: '/workspace/a.txt', verdict: 'ok' } });

    // Effects: one begun, committed and replayed; one failed without certainty, then resolved.
    const begun = await call('POST', '/v1/sandboxes/{id}/effects', sb, 201, {
      body: { kind: 'email', input: { to: 'a@example.com' }, reversibility: 'irreversible', key: 'mail-1' },
    });
    const eff = { id, effectId: begun.body.effectId as string };
    await call('POST', '/v1/sandboxes/{id}/effects/{effectId}/commit', eff, 200, { body: { output: { sent: 1 } } });
    const replayed = await call('POST', '/v1/sandboxes/{id}/effects', sb, 200, {
      body: { kind: 'email', input: { to: 'a@example.com' }, reversibility: 'irreversible', key: 'mail-1' },
    });
    t.true(replayed.body.replayed);
    await call('GET', '/v1/sandboxes/{id}/effects/{effectId}', eff, 200);
    const second = await call('POST', '/v1/sandboxes/{id}/effects', sb, 201, {
      body: { kind: 'charge', input: 5, reversibility: 'irreversible' },
    });
    const eff2 = { id, effectId: second.body.effectId as string };
    const failed = await call('POST', '/v1/sandboxes/{id}/effects/{effectId}/fail', eff2, 200, {
      body: { error: { message: 'timed out', code: 'ETIMEDOUT' }, definite: false },
    });
    t.is(failed.body.status, 'unknown');
    await call('POST', '/v1/sandboxes/{id}/effects/{effectId}/resolve', eff2, 200, {
      body: { outcome: 'committed', output: null },
    });

    // Checkpoints: one with a context, then work after it that a rollback makes stale.
    const ckpt = await call('POST', '/v1/sandboxes/{id}/checkpoints', sb, 201, {
      body: { label: 'first', context: [{ role: 'user', content: 'hi' }], contextFormat: 'openai-chat' },
    });
    const cp = { id, ckpt: ckpt.body.id as string };
    await call('GET', '/v1/sandboxes/{id}/checkpoints', sb, 200);
    await call('GET', '/v1/sandboxes/{id}/checkpoints/{ckpt}/context', cp, 200);
    await call('PUT', '/v1/sandboxes/{id}/files', file, 200, { body: { content: 'beta\n' } });
    await call('GET', '/v1/sandboxes/{id}/verdicts', { id, query: 'stale=true' }, 200);
    await call('POST', '/v1/sandboxes/{id}/effects', sb, 201, {
      body: { kind: 'post', input: 'x', reversibility: 'irreversible' },
    });
    await call('POST', '/v1/sandboxes/{id}/commands', sb, 200, { body: { cmd: 'cat /workspace/a.txt' } });
    const rolled = await call('POST', '/v1/sandboxes/{id}/rollback', sb, 200, {
      body: { checkpointId: cp.ckpt, failure: 'wrong file', lessons: ['read first'] },
    });
    t.true(rolled.body.staleObservations.length > 0, 'the report lists the stale observations');
    t.true(rolled.body.warnings.length > 0, 'and warns of the irreversible effect');
    const bare = await call('POST', '/v1/sandboxes/{id}/rollback', sb, 200, {
      body: { checkpointId: cp.ckpt, withRecoverySummary: false },
    });
    t.false('recoverySummary' in bare.body, 'withRecoverySummary: false leaves the summary out, as the schema allows');
    await call('GET', '/v1/sandboxes/{id}/observations', { id, query: 'includeStale=true' }, 200);
    await call('GET', '/v1/sandboxes/{id}/verdicts', sb, 200);
    await call('GET', '/v1/sandboxes/{id}/effects', sb, 200);

    const forked = await call('POST', '/v1/sandboxes/{id}/fork', sb, 200, { body: { checkpointId: cp.ckpt } });
    t.is(forked.body.ids.length, 1);

    // Snapshots: one taken from the checkpoint, its bundle imported back, one sandbox started from it.
    const snap = await call('POST', '/v1/snapshots', {}, 201, { body: { checkpointId: cp.ckpt, name: 'resp-snap' } });
    const sn = { snap: snap.body.id as string };
    await call('GET', '/v1/snapshots', {}, 200);
    await call('GET', '/v1/snapshots/{snap}', sn, 200);
    await call('GET', '/v1/snapshots/{snap}/context', sn, 200);
    const bundle = await fetch(`${api.base}/v1/snapshots/${sn.snap}/bundle`, {
      headers: { authorization: `Bearer ${api.token}` },
    });
    t.is(bundle.status, 200);
    const bytes = Buffer.from(await bundle.arrayBuffer());
    const imported = await call('POST', '/v1/snapshots/import', { query: 'name=resp-copy' }, 201, {
      body: bytes,
      raw: true,
      headers: { 'content-type': 'application/octet-stream' },
    });
    await call('DELETE', '/v1/snapshots/{snap}', { snap: imported.body.id }, 200);
    // Through the snapshot store: pushed, listed, pulled back as a copy, deleted.
    await call('POST', '/v1/snapshots/{snap}/push', sn, 201, { body: { key: 'resp-key' } });
    await call('GET', '/v1/store/bundles', {}, 200);
    const fromStore = await call('POST', '/v1/store/bundles/{key}/pull', { key: 'resp-key' }, 201, {
      body: { name: 'resp-stored' },
    });
    await call('DELETE', '/v1/snapshots/{snap}', { snap: fromStore.body.snapshot.id }, 200);
    await call('DELETE', '/v1/store/bundles/{key}', { key: 'resp-key' }, 200);
    // Pulled by a second server that lists this one as a source and trusts its signing key.
    const other = await openTestLockstep(owner, {
      images: ['base'],
      open: { config: { pullSources: [api.base], trustedBundleKeys: [ls.snapshots.signingKey()] } },
    });
    const otherServer = await startServer(owner, other);
    const pulled = await otherServer.client
      .as(tenantToken(other, 'responses'))
      .post('/v1/snapshots/pull', { from: api.base, snapshot: sn.snap, token: api.token, name: 'resp-pulled' });
    t.is(pulled.status, 201, pulled.text);
    t.true(validators.get('POST /v1/snapshots/pull 201')!(pulled.body), JSON.stringify(pulled.body));
    called.add('POST /v1/snapshots/pull 201');

    const started = await call('POST', '/v1/snapshots/{snap}/sandboxes', sn, 200, { body: { count: 1 } });
    t.is(started.body.ids.length, 1);
    for (const child of [...(forked.body.ids as string[]), ...(started.body.ids as string[])])
      await call('DELETE', '/v1/sandboxes/{id}', { id: child }, 200);
    await call('DELETE', '/v1/snapshots/{snap}', sn, 200);

    // An exposed port: busybox nc listens once, which is all the expose's own connect needs.
    await call('POST', '/v1/sandboxes/{id}/commands', sb, 200, {
      body: { cmd: ['nc', '-l', '-p', '8000'], background: true },
    });
    const exposedPort = await eventually(async () => {
      const r = await api.post(`/v1/sandboxes/${id}/ports`, { port: 8000 });
      if (r.status !== 201) throw new Error(`${r.status}: ${r.text}`);
      return r;
    }, 15_000);
    t.true(validators.get('POST /v1/sandboxes/{id}/ports 201')!(exposedPort.body), JSON.stringify(exposedPort.body));
    called.add('POST /v1/sandboxes/{id}/ports 201');
    await call('GET', '/v1/sandboxes/{id}/ports', sb, 200);
    await call('DELETE', '/v1/sandboxes/{id}/ports/{port}', { id, port: 8000 }, 200);

    await call('DELETE', '/v1/sandboxes/{id}/checkpoints/{ckpt}', cp, 200);
    await call('DELETE', '/v1/sandboxes/{id}/files', file, 200);
    await call('DELETE', '/v1/sandboxes/{id}', sb, 200);

    const json = successResponses(doc).filter((r) => !(r.key in NO_FIELDS));
    t.deepEqual(
      json.filter((r) => !called.has(r.key) && !(r.key in NOT_CALLED)).map((r) => r.key),
      [],
      'JSON success responses this test neither calls nor lists in NOT_CALLED',
    );
    t.deepEqual(
      Object.keys(NOT_CALLED).filter((k) => called.has(k)),
      [],
      'NOT_CALLED lists a response the test calls',
    );
  });
});
