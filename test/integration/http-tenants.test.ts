/**
 * Tenants over HTTP: isolation (another tenant's things answer exactly like
 * missing ones and are left untouched), quotas, and Idempotency-Key.
 */
import test from 'ava';
import type Database from 'better-sqlite3';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { ndjson, startServer, tenantId, tenantToken, type ApiResponse } from '../fixtures/http-client.js';
import { removeTenant } from '../../src/tenants/tenants.js';

/** Row counts of every table: "no new rows" means these do not change. */
function rowCounts(db: Database.Database): Record<string, number> {
  const tables = (db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name").all() as { name: string }[]).map((r) => r.name);
  return Object.fromEntries(tables.map((t) => [t, (db.prepare(`SELECT COUNT(*) AS n FROM "${t}"`).get() as { n: number }).n]));
}

/** A response with the ids replaced, so that a foreign id and a missing one can be compared. */
function shape(r: ApiResponse, ids: string[]): unknown {
  let text = r.text;
  for (const id of ids) text = text.split(id).join('<ID>');
  return { status: r.status, contentType: r.headers.get('content-type'), body: text };
}

integration(test, () => {
  test.serial("tenant B cannot see or touch tenant A's sandboxes, checkpoints, contexts, effects or observations: each attempt is a plain 404 and leaves no trace", async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const a = client.as(tenantToken(ls, 'tenant-a'));
    const b = client.as(tenantToken(ls, 'tenant-b'));

    // A's world.
    const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    await a.put(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`, { content: 'A only' });
    await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'echo hello > /workspace/hello.txt' });
    const ckA: string = (await a.post(`/v1/sandboxes/${sa}/checkpoints`, { label: 'a1', context: { format: 'anthropic', messages: [{ role: 'user', content: 'secret plan' }] } })).body.id;
    const effA: string = (await a.post(`/v1/sandboxes/${sa}/effects`, { kind: 'email.send', input: { to: 'a@example.com' }, reversibility: 'irreversible' })).body.effectId;
    await a.post(`/v1/sandboxes/${sa}/effects/${effA}/commit`, { output: { id: 1 } });
    await a.post(`/v1/sandboxes/${sa}/verdicts`, { path: 'secret.txt', verdict: 'reviewed' });
    // B's own sandbox, through which it tries A's checkpoint and effect ids.
    const sb: string = (await b.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const ckB: string = (await b.post(`/v1/sandboxes/${sb}/checkpoints`, {})).body.id;

    const db = ls.engine.catalog.db;
    const before = rowCounts(db);
    const aBefore = {
      info: (await a.get(`/v1/sandboxes/${sa}`)).body,
      checkpoints: (await a.get(`/v1/sandboxes/${sa}/checkpoints`)).body,
      effects: (await a.get(`/v1/sandboxes/${sa}/effects`)).body,
      observations: (await a.get(`/v1/sandboxes/${sa}/observations?includeStale=true`)).body,
    };
    const countsBefore = rowCounts(db);
    t.deepEqual(countsBefore, before, 'reading through the API records nothing but observations of reads (none here)');

    const missingSbx = 'sbx_nosuchsandbox';
    const missingCkpt = 'ckpt_nosuchckpt00';
    const missingEff = 'eff_00000000000000000000';
    // [what, method, path with A's id, path with a missing id, body]
    type Attempt = [string, string, (s: string, c: string, e: string) => string, unknown?];
    const onA: Attempt[] = [
      ['get', 'GET', (s) => `/v1/sandboxes/${s}`],
      ['delete', 'DELETE', (s) => `/v1/sandboxes/${s}`],
      ['exec', 'POST', (s) => `/v1/sandboxes/${s}/commands`, { cmd: 'cat /workspace/secret.txt' }],
      ['exec in background', 'POST', (s) => `/v1/sandboxes/${s}/commands`, { cmd: 'rm -rf /workspace', background: true }],
      ['read file', 'GET', (s) => `/v1/sandboxes/${s}/files?path=/workspace/secret.txt`],
      ['write file', 'PUT', (s) => `/v1/sandboxes/${s}/files?path=/workspace/secret.txt`, { content: 'pwned' }],
      ['remove file', 'DELETE', (s) => `/v1/sandboxes/${s}/files?path=/workspace/secret.txt`],
      ['list files', 'GET', (s) => `/v1/sandboxes/${s}/files/list?path=/workspace`],
      ['file exists', 'GET', (s) => `/v1/sandboxes/${s}/files/exists?path=/workspace/secret.txt`],
      ['checkpoint', 'POST', (s) => `/v1/sandboxes/${s}/checkpoints`, { label: 'b was here' }],
      ['list checkpoints', 'GET', (s) => `/v1/sandboxes/${s}/checkpoints`],
      ['read context', 'GET', (s, c) => `/v1/sandboxes/${s}/checkpoints/${c}/context`],
      ['delete checkpoint', 'DELETE', (s, c) => `/v1/sandboxes/${s}/checkpoints/${c}`],
      ['rollback', 'POST', (s) => `/v1/sandboxes/${s}/rollback`, { checkpointId: ckA }],
      ['fork', 'POST', (s) => `/v1/sandboxes/${s}/fork`, { checkpointId: ckA, count: 1 }],
      ['list effects', 'GET', (s) => `/v1/sandboxes/${s}/effects`],
      ['get effect', 'GET', (s, _c, e) => `/v1/sandboxes/${s}/effects/${e}`],
      ['begin effect', 'POST', (s) => `/v1/sandboxes/${s}/effects`, { kind: 'x', input: 1, reversibility: 'irreversible' }],
      ['commit effect', 'POST', (s, _c, e) => `/v1/sandboxes/${s}/effects/${e}/commit`, {}],
      ['fail effect', 'POST', (s, _c, e) => `/v1/sandboxes/${s}/effects/${e}/fail`, { error: 'x', definite: true }],
      ['observations', 'GET', (s) => `/v1/sandboxes/${s}/observations?includeStale=true`],
      ['record verdict', 'POST', (s) => `/v1/sandboxes/${s}/verdicts`, { path: 'secret.txt', verdict: 'fake' }],
      ['list verdicts', 'GET', (s) => `/v1/sandboxes/${s}/verdicts`],
    ];
    for (const [what, method, path, body] of onA) {
      const foreign = await b.req(method, path(sa, ckA, effA), { body });
      const missing = await b.req(method, path(missingSbx, missingCkpt, missingEff), { body });
      t.is(foreign.status, 404, `${what}: ${foreign.text}`);
      t.is(foreign.body.error.code, 'SANDBOX_NOT_FOUND', what);
      t.deepEqual(shape(foreign, [sa, ckA, effA]), shape(missing, [missingSbx, missingCkpt, missingEff]), `${what}: same answer as for a missing id`);
    }

    // A's checkpoint and effect ids tried through B's own sandbox.
    const viaB: [string, string, string, unknown, string][] = [
      ['read context', 'GET', `/v1/sandboxes/${sb}/checkpoints/{c}/context`, undefined, 'CHECKPOINT_NOT_FOUND'],
      ['delete checkpoint', 'DELETE', `/v1/sandboxes/${sb}/checkpoints/{c}`, undefined, 'CHECKPOINT_NOT_FOUND'],
      ['rollback', 'POST', `/v1/sandboxes/${sb}/rollback`, { checkpointId: '{c}' }, 'CHECKPOINT_NOT_FOUND'],
      ['fork', 'POST', `/v1/sandboxes/${sb}/fork`, { checkpointId: '{c}' }, 'CHECKPOINT_NOT_FOUND'],
      ['get effect', 'GET', `/v1/sandboxes/${sb}/effects/{e}`, undefined, 'EFFECT_NOT_FOUND'],
      ['commit effect', 'POST', `/v1/sandboxes/${sb}/effects/{e}/commit`, { output: 'stolen' }, 'EFFECT_NOT_FOUND'],
      ['fail effect', 'POST', `/v1/sandboxes/${sb}/effects/{e}/fail`, { error: 'x', definite: true }, 'EFFECT_NOT_FOUND'],
      ['resolve effect', 'POST', `/v1/sandboxes/${sb}/effects/{e}/resolve`, { outcome: 'failed' }, 'EFFECT_NOT_FOUND'],
    ];
    const fill = (x: unknown, c: string, e: string): unknown => (x === undefined ? undefined : JSON.parse(JSON.stringify(x).replace('{c}', c).replace('{e}', e)));
    for (const [what, method, path, body, code] of viaB) {
      const foreign = await b.req(method, path.replace('{c}', ckA).replace('{e}', effA), { body: fill(body, ckA, effA) });
      const missing = await b.req(method, path.replace('{c}', missingCkpt).replace('{e}', missingEff), { body: fill(body, missingCkpt, missingEff) });
      t.is(foreign.status, 404, `${what} via B's sandbox: ${foreign.text}`);
      t.is(foreign.body.error.code, code, what);
      t.deepEqual(shape(foreign, [ckA, effA]), shape(missing, [missingCkpt, missingEff]), `${what} via B's sandbox: same answer as for a missing id`);
    }

    // B's list shows only B's sandbox.
    t.deepEqual((await b.get('/v1/sandboxes')).body.map((s: { id: string }) => s.id), [sb]);
    t.deepEqual(ls.list(tenantId(ls, 'tenant-b')).map((s) => s.id), [sb]);

    // No trace: not one row more or less anywhere, and A sees what it saw.
    t.deepEqual(rowCounts(db), before);
    t.deepEqual((await a.get(`/v1/sandboxes/${sa}`)).body, aBefore.info);
    t.deepEqual((await a.get(`/v1/sandboxes/${sa}/checkpoints`)).body, aBefore.checkpoints);
    t.deepEqual((await a.get(`/v1/sandboxes/${sa}/effects`)).body, aBefore.effects);
    t.deepEqual((await a.get(`/v1/sandboxes/${sa}/observations?includeStale=true`)).body, aBefore.observations);
    t.is((await a.get(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`)).body.content, 'A only');
    t.is((await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'cat /workspace/hello.txt; ls /workspace' })).body.stdout, 'hello\nhello.txt\nsecret.txt\n');
    t.deepEqual((await a.get(`/v1/sandboxes/${sa}/checkpoints/${ckA}/context`)).body.context, { format: 'anthropic', messages: [{ role: 'user', content: 'secret plan' }] });
    // And A cannot reach B's checkpoint either.
    t.is((await a.get(`/v1/sandboxes/${sa}/checkpoints/${ckB}/context`)).status, 404);
  });

  test.serial('requests without a valid bearer token get 401 and do nothing', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const token = tenantToken(ls, 'acme');
    const before = rowCounts(ls.engine.catalog.db);
    for (const c of [client, client.as('lst_' + 'x'.repeat(43)), client.as(token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A')), client.as('not-a-token')]) {
      const r = await c.post('/v1/sandboxes', {});
      t.is(r.status, 401);
      t.is(r.body.error.code, 'UNAUTHENTICATED');
      t.is(r.headers.get('www-authenticate'), 'Bearer realm="lockstep"');
    }
    const basic = await client.get('/v1/sandboxes', { headers: { authorization: `Basic ${Buffer.from('acme:' + token).toString('base64')}` } });
    t.is(basic.status, 401);
    t.deepEqual(rowCounts(ls.engine.catalog.db), before);
    // A removed tenant's token stops working at once.
    const gone = tenantToken(ls, 'leaving');
    t.is((await client.as(gone).get('/v1/sandboxes')).status, 200);
    removeTenant(ls.engine.catalog.db, 'leaving');
    t.is((await client.as(gone).get('/v1/sandboxes')).status, 401);
  });

  test.serial('quotas: number of sandboxes and total memory, for creates and forks (429 QUOTA_EXCEEDED, nothing created)', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const small = client.as(tenantToken(ls, 'small', { maxSandboxes: 2, maxMemoryMb: 192 }));

    const first = await small.post('/v1/sandboxes', { memoryMb: 128 });
    t.is(first.status, 201);
    const tooBig = await small.post('/v1/sandboxes', { memoryMb: 128 });
    t.is(tooBig.status, 429);
    t.like(tooBig.body.error, { code: 'QUOTA_EXCEEDED' });
    t.regex(tooBig.body.error.message, /at most 192 MiB of memory; it has 128 and asked for 128 more/);
    const second = await small.post('/v1/sandboxes', { memoryMb: 64 });
    t.is(second.status, 201);
    const third = await small.post('/v1/sandboxes', { memoryMb: 16 });
    t.is(third.status, 429);
    t.regex(third.body.error.message, /at most 2 sandboxes/);
    t.is(ls.list(tenantId(ls, 'small')).length, 2);
    t.like((await small.get('/v1/tenant')).body, { name: 'small', maxSandboxes: 2, maxMemoryMb: 192, usage: { sandboxes: 2, memoryMb: 192 } });

    // A fork counts like a create.
    const ck = await small.post(`/v1/sandboxes/${second.body.id}/checkpoints`, {});
    const fork = await small.post(`/v1/sandboxes/${second.body.id}/fork`, { checkpointId: ck.body.id });
    t.is(fork.status, 429);
    t.is(ls.list(tenantId(ls, 'small')).length, 2);

    // Freeing room lets the next one through.
    await small.del(`/v1/sandboxes/${first.body.id}`);
    const fork2 = await small.post(`/v1/sandboxes/${second.body.id}/fork`, { checkpointId: ck.body.id, count: 1 });
    t.is(fork2.status, 200, fork2.text);
    t.is(fork2.body.ids.length, 1);
    t.is(ls.list(tenantId(ls, 'small')).length, 2);

    // Concurrent creates cannot both squeeze through the last slot.
    const roomy = client.as(tenantToken(ls, 'racy', { maxSandboxes: 1 }));
    const results = await Promise.all([roomy.post('/v1/sandboxes', { memoryMb: 16 }), roomy.post('/v1/sandboxes', { memoryMb: 16 })]);
    t.deepEqual(results.map((r) => r.status).sort(), [201, 429]);
    t.is(ls.list(tenantId(ls, 'racy')).length, 1);
  });

  test.serial('Idempotency-Key: a retried POST is replayed, not repeated; another body with the same key is refused; keys are per tenant and expire after 24 h', async (t) => {
    const ls = await openTestLockstep(t);
    let now = Date.now();
    const { client } = await startServer(t, ls, { clock: () => now });
    const a = client.as(tenantToken(ls, 'acme'));
    const key = { 'idempotency-key': 'create-1' };

    const r1 = await a.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
    const r2 = await a.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
    t.is(r1.status, 201);
    t.is(r2.status, 201);
    t.is(r2.text, r1.text);
    t.is(r2.headers.get('idempotent-replayed'), 'true');
    t.is(r1.headers.get('idempotent-replayed'), null);
    t.is(ls.list(tenantId(ls, 'acme')).length, 1, 'one sandbox');
    const id: string = r1.body.id;

    const reused = await a.post('/v1/sandboxes', { memoryMb: 128 }, { headers: key });
    t.is(reused.status, 409);
    t.deepEqual(reused.body.error, { code: 'IDEMPOTENCY_KEY_REUSED', message: 'Idempotency-Key "create-1" was already used for a different request', field: 'Idempotency-Key' });
    t.is(ls.list(tenantId(ls, 'acme')).length, 1);

    // Another tenant's same key is another key.
    const b = client.as(tenantToken(ls, 'other'));
    const rb = await b.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
    t.is(rb.status, 201);
    t.not(rb.body.id, id);

    // A command with a key runs once; the replay (JSON or streamed) gives the first output.
    const cmd = { cmd: 'echo ran >> /workspace/count; wc -l < /workspace/count' };
    const c1 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-1' } });
    const c2 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-1' } });
    t.is(c1.body.stdout, '1\n');
    t.deepEqual(c2.body, c1.body);
    const streamed = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-1', accept: 'application/x-ndjson' } });
    t.is(streamed.headers.get('idempotent-replayed'), 'true');
    t.deepEqual(ndjson(streamed.text), [
      { type: 'stdout', data: '1\n' },
      { type: 'result', exitCode: 0, truncated: false, durationMs: c1.body.durationMs, observationId: c1.body.observationId },
    ]);
    // A first streamed request is stored too.
    const s1 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-2', accept: 'application/x-ndjson' } });
    const s2 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-2' } });
    t.is(ndjson(s1.text)[0]!.data, '2\n');
    t.is(s2.body.stdout, '2\n');
    t.is((await a.get(`/v1/sandboxes/${id}/files?path=count`)).body.content, 'ran\nran\n');

    // One checkpoint for two identical checkpoint requests.
    const k1 = await a.post(`/v1/sandboxes/${id}/checkpoints`, { label: 'once' }, { headers: { 'idempotency-key': 'ck-1' } });
    const k2 = await a.post(`/v1/sandboxes/${id}/checkpoints`, { label: 'once' }, { headers: { 'idempotency-key': 'ck-1' } });
    t.is(k2.body.id, k1.body.id);
    t.is((await a.get(`/v1/sandboxes/${id}/checkpoints`)).body.length, 1);

    // Errors are not stored: after fixing the cause, the same key runs.
    const e1 = await a.post(`/v1/sandboxes/${id}/rollback`, { checkpointId: 'ckpt_notyet' }, { headers: { 'idempotency-key': 'rb-1' } });
    t.is(e1.status, 404);
    const e2 = await a.post(`/v1/sandboxes/${id}/rollback`, { checkpointId: 'ckpt_notyet' }, { headers: { 'idempotency-key': 'rb-1' } });
    t.is(e2.status, 404);
    t.is(e2.headers.get('idempotent-replayed'), null);

    // Bad keys are bad input.
    const long = await a.post('/v1/sandboxes', {}, { headers: { 'idempotency-key': 'k'.repeat(256) } });
    t.is(long.status, 400);
    t.is(long.body.error.field, 'Idempotency-Key');

    // 24 hours later the key is free again.
    now += 24 * 3600 * 1000 + 1000;
    const later = await a.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
    t.is(later.status, 201);
    t.not(later.body.id, id);
    t.is(later.headers.get('idempotent-replayed'), null);
    t.is(ls.list(tenantId(ls, 'acme')).length, 2);
  });

  test.serial('a request still running holds its key: a concurrent retry gets 409 IDEMPOTENCY_KEY_IN_PROGRESS', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const a = client.as(tenantToken(ls, 'acme'));
    const id = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const headers = { 'idempotency-key': 'slow-1' };
    const cmd = { cmd: 'touch /workspace/started; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo done' };
    const slow = a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers });
    // Once the command runs, its request holds the key.
    await eventually(async () => (await a.get(`/v1/sandboxes/${id}/files/exists?path=started`)).body.exists === true);
    const retry = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers });
    t.is(retry.status, 409);
    t.is(retry.body.error.code, 'IDEMPOTENCY_KEY_IN_PROGRESS');
    await a.put(`/v1/sandboxes/${id}/files?path=go`, { content: '' });
    t.is((await slow).body.stdout, 'done\n');
    const after = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers });
    t.is(after.headers.get('idempotent-replayed'), 'true');
  });
});

