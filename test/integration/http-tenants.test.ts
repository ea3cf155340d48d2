/**
 * Tenants over HTTP: isolation (another tenant's things answer exactly like
 * missing ones and are left untouched), quotas, and Idempotency-Key.
 */
import test from 'ava';
import type Database from 'better-sqlite3';
import path from 'node:path';
import { eventually, integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { resolveStoreConfig } from '../../src/config.js';
import { ApiClient, ndjson, startServer, tenantId, tenantToken, type ApiResponse } from '../fixtures/http-client.js';
import fs from 'node:fs';
import { addTenant, removeTenant } from '../../src/tenants/tenants.js';
import { purgeTenant } from '../../src/api/tenants-entry.js';
import { isAlive, mountsUnder } from '../../src/host/proc.js';

/** Row counts of every table: "no new rows" means these do not change. */
function rowCounts(db: Database.Database): Record<string, number> {
  const tables = (
    db
      .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
      .all() as { name: string }[]
  ).map((r) => r.name);
  return Object.fromEntries(
    tables.map((t) => [t, (db.prepare(`SELECT COUNT(*) AS n FROM "${t}"`).get() as { n: number }).n]),
  );
}

/** A response with the ids replaced, so that a foreign id and a missing one can be compared. */
function shape(r: ApiResponse, ids: string[]): unknown {
  let text = r.text;
  for (const id of ids) text = text.split(id).join('<ID>');
  return { status: r.status, contentType: r.headers.get('content-type'), body: text };
}

integration(test, () => {
  test.serial(
    "tenant B cannot see or touch tenant A's sandboxes, checkpoints, contexts, effects or observations: each attempt is a plain 404 and leaves no trace",
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const a = client.as(tenantToken(ls, 'tenant-a'));
      const b = client.as(tenantToken(ls, 'tenant-b'));

      // A's world.
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      await a.put(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`, { content: 'A only' });
      await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'echo hello > /workspace/hello.txt' });
      const ckA: string = (
        await a.post(`/v1/sandboxes/${sa}/checkpoints`, {
          label: 'a1',
          context: { format: 'anthropic', messages: [{ role: 'user', content: 'secret plan' }] },
        })
      ).body.id;
      const effA: string = (
        await a.post(`/v1/sandboxes/${sa}/effects`, {
          kind: 'email.send',
          input: { to: 'a@example.com' },
          reversibility: 'irreversible',
        })
      ).body.effectId;
      await a.post(`/v1/sandboxes/${sa}/effects/${effA}/commit`, { output: { id: 1 } });
      await a.post(`/v1/sandboxes/${sa}/verdicts`, { path: 'secret.txt', verdict: 'reviewed' });
      // B's own sandbox, through which it tries A's checkpoint and effect ids.
      const sb: string = (await b.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const ckB: string = (await b.post(`/v1/sandboxes/${sb}/checkpoints`, {})).body.id;

      // Both checkpoints become durable in the background (their rows gain durableAt), then
      // each gets a warm standby (an instance and its holds): wait for both, so that the
      // comparison below sees only what B's attempts could change.
      await ls.get(sa).durable(ckA);
      await ls.get(sb).durable(ckB);
      await ls.get(sa).settled();
      await ls.get(sb).settled();
      const db = ls.engine.catalog.db;
      const before = rowCounts(db);
      const aBefore = {
        info: (await a.get(`/v1/sandboxes/${sa}`)).body,
        checkpoints: (await a.get(`/v1/sandboxes/${sa}/checkpoints`)).body,
        effects: (await a.get(`/v1/sandboxes/${sa}/effects`)).body,
        observations: (await a.get(`/v1/sandboxes/${sa}/observations?includeStale=true`)).body,
      };
      const countsBefore = rowCounts(db);
      t.deepEqual(
        countsBefore,
        before,
        'reading through the API records nothing but observations of reads (none here)',
      );

      const missingSbx = 'sbx_nosuchsandbox';
      const missingCkpt = 'ckpt_nosuchckpt00';
      const missingEff = 'eff_00000000000000000000';
      // [what, method, path with A's id, path with a missing id, body]
      type Attempt = [string, string, (s: string, c: string, e: string) => string, unknown?];
      const onA: Attempt[] = [
        ['get', 'GET', (s) => `/v1/sandboxes/${s}`],
        ['delete', 'DELETE', (s) => `/v1/sandboxes/${s}`],
        ['exec', 'POST', (s) => `/v1/sandboxes/${s}/commands`, { cmd: 'cat /workspace/secret.txt' }],
        [
          'exec in background',
          'POST',
          (s) => `/v1/sandboxes/${s}/commands`,
          { cmd: 'rm -rf /workspace', background: true },
        ],
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
        [
          'begin effect',
          'POST',
          (s) => `/v1/sandboxes/${s}/effects`,
          { kind: 'x', input: 1, reversibility: 'irreversible' },
        ],
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
        t.deepEqual(
          shape(foreign, [sa, ckA, effA]),
          shape(missing, [missingSbx, missingCkpt, missingEff]),
          `${what}: same answer as for a missing id`,
        );
      }

      // A's checkpoint and effect ids tried through B's own sandbox.
      const viaB: [string, string, string, unknown, string][] = [
        ['read context', 'GET', `/v1/sandboxes/${sb}/checkpoints/{c}/context`, undefined, 'CHECKPOINT_NOT_FOUND'],
        ['delete checkpoint', 'DELETE', `/v1/sandboxes/${sb}/checkpoints/{c}`, undefined, 'CHECKPOINT_NOT_FOUND'],
        ['rollback', 'POST', `/v1/sandboxes/${sb}/rollback`, { checkpointId: '{c}' }, 'CHECKPOINT_NOT_FOUND'],
        ['fork', 'POST', `/v1/sandboxes/${sb}/fork`, { checkpointId: '{c}' }, 'CHECKPOINT_NOT_FOUND'],
        ['get effect', 'GET', `/v1/sandboxes/${sb}/effects/{e}`, undefined, 'EFFECT_NOT_FOUND'],
        ['commit effect', 'POST', `/v1/sandboxes/${sb}/effects/{e}/commit`, { output: 'stolen' }, 'EFFECT_NOT_FOUND'],
        [
          'fail effect',
          'POST',
          `/v1/sandboxes/${sb}/effects/{e}/fail`,
          { error: 'x', definite: true },
          'EFFECT_NOT_FOUND',
        ],
        [
          'resolve effect',
          'POST',
          `/v1/sandboxes/${sb}/effects/{e}/resolve`,
          { outcome: 'failed' },
          'EFFECT_NOT_FOUND',
        ],
      ];
      const fill = (x: unknown, c: string, e: string): unknown =>
        x === undefined ? undefined : JSON.parse(JSON.stringify(x).replace('{c}', c).replace('{e}', e));
      for (const [what, method, path, body, code] of viaB) {
        const foreign = await b.req(method, path.replace('{c}', ckA).replace('{e}', effA), {
          body: fill(body, ckA, effA),
        });
        const missing = await b.req(method, path.replace('{c}', missingCkpt).replace('{e}', missingEff), {
          body: fill(body, missingCkpt, missingEff),
        });
        t.is(foreign.status, 404, `${what} via B's sandbox: ${foreign.text}`);
        t.is(foreign.body.error.code, code, what);
        t.deepEqual(
          shape(foreign, [ckA, effA]),
          shape(missing, [missingCkpt, missingEff]),
          `${what} via B's sandbox: same answer as for a missing id`,
        );
      }

      // B's list shows only B's sandbox.
      t.deepEqual(
        (await b.get('/v1/sandboxes')).body.map((s: { id: string }) => s.id),
        [sb],
      );
      t.deepEqual(
        ls.list(tenantId(ls, 'tenant-b')).map((s) => s.id),
        [sb],
      );

      // No trace: not one row more or less anywhere, and A sees what it saw.
      t.deepEqual(rowCounts(db), before);
      t.deepEqual((await a.get(`/v1/sandboxes/${sa}`)).body, aBefore.info);
      t.deepEqual((await a.get(`/v1/sandboxes/${sa}/checkpoints`)).body, aBefore.checkpoints);
      t.deepEqual((await a.get(`/v1/sandboxes/${sa}/effects`)).body, aBefore.effects);
      t.deepEqual((await a.get(`/v1/sandboxes/${sa}/observations?includeStale=true`)).body, aBefore.observations);
      t.is((await a.get(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`)).body.content, 'A only');
      t.is(
        (await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'cat /workspace/hello.txt; ls /workspace' })).body.stdout,
        'hello\nhello.txt\nsecret.txt\n',
      );
      t.deepEqual((await a.get(`/v1/sandboxes/${sa}/checkpoints/${ckA}/context`)).body.context, {
        format: 'anthropic',
        messages: [{ role: 'user', content: 'secret plan' }],
      });
      // And A cannot reach B's checkpoint either.
      t.is((await a.get(`/v1/sandboxes/${sa}/checkpoints/${ckB}/context`)).status, 404);
    },
  );

  test.serial(
    "every /v1 route that names a snapshot or a stored bundle answers another tenant's exactly like missing ones (route table checked against the server's own route list)",
    async (t) => {
      const store = path.join(TEST_ROOT, `tenants-store-${process.pid}-${Date.now()}`);
      t.teardown(async () => fs.rmSync(store, { recursive: true, force: true }));
      const ls = await openTestLockstep(t, { open: { config: { snapshotStore: resolveStoreConfig({ url: store }) } } });
      const { client } = await startServer(t, ls);
      const a = client.as(tenantToken(ls, 'snap-a'));
      const b = client.as(tenantToken(ls, 'snap-b'));
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const ckA: string = (await a.post(`/v1/sandboxes/${sa}/checkpoints`, {})).body.id;
      const snapA: string = (await a.post('/v1/snapshots', { checkpointId: ckA, name: 'secret-snap' })).body.id;
      const pushed = await a.post(`/v1/snapshots/${snapA}/push`, { key: 'secret-key' });
      t.is(pushed.status, 201, pushed.text);

      const doc = (await client.get('/openapi.json')).body as { paths: Record<string, Record<string, unknown>> };
      const routes = Object.entries(doc.paths)
        .filter(([p]) => p.includes('{snap}') || p.includes('{key}'))
        .flatMap(([p, ops]) =>
          Object.keys(ops)
            .filter((m) => m !== 'parameters')
            .map((m) => `${m.toUpperCase()} ${p}`),
        )
        .sort();
      // Body per route; {snap} and {key} are filled in (by id and by name for snapshots).
      const table: Record<string, unknown> = {
        'GET /v1/snapshots/{snap}': undefined,
        'DELETE /v1/snapshots/{snap}': undefined,
        'GET /v1/snapshots/{snap}/context': undefined,
        'GET /v1/snapshots/{snap}/bundle': undefined,
        'POST /v1/snapshots/{snap}/sandboxes': { count: 1 },
        'POST /v1/snapshots/{snap}/push': { key: 'stolen' },
        'POST /v1/store/bundles/{key}/pull': { name: 'stolen' },
        'DELETE /v1/store/bundles/{key}': undefined,
      };
      t.deepEqual(Object.keys(table).sort(), routes, 'the table covers every route that takes a snapshot or a key');
      const db = ls.engine.catalog.db;
      const before = rowCounts(db);
      for (const [foreign, missing] of [
        [
          { snap: snapA, key: 'secret-key' },
          { snap: 'snap_nosuchsnapshot', key: 'no-such-key' },
        ],
        [
          { snap: 'secret-snap', key: 'secret-key' },
          { snap: 'no-such-snap', key: 'no-such-key' },
        ],
      ] as const) {
        for (const route of routes) {
          const [method, template] = route.split(' ') as [string, string];
          const fill = (ids: { snap: string; key: string }) =>
            template.replace('{snap}', ids.snap).replace('{key}', ids.key);
          const rf = await b.req(method, fill(foreign), { body: table[route] });
          const rm = await b.req(method, fill(missing), { body: table[route] });
          t.is(rf.status, 404, `${route}: ${rf.text}`);
          t.is(rf.body?.error?.code, template.includes('{key}') ? 'BUNDLE_NOT_FOUND' : 'SNAPSHOT_NOT_FOUND', route);
          t.deepEqual(
            shape(rf, Object.values(foreign)),
            shape(rm, Object.values(missing)),
            `${route}: the same answer as for a missing one`,
          );
        }
      }
      // Nothing changed for A: no rows, its snapshot, its bundle; B has nothing in the store.
      t.deepEqual(rowCounts(db), before);
      t.is((await a.get(`/v1/snapshots/${snapA}`)).body.name, 'secret-snap');
      t.deepEqual(
        (await a.get('/v1/store/bundles')).body.map((x: { name: string; digest: string }) => [x.name, x.digest]),
        [['secret-key', pushed.body.digest]],
      );
      t.deepEqual((await b.get('/v1/store/bundles')).body, []);
    },
  );

  test.serial(
    "every /v1 route that names a sandbox answers another tenant's ids exactly like missing ones (route table checked against the server's own route list)",
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const a = client.as(tenantToken(ls, 'tenant-a'));
      const b = client.as(tenantToken(ls, 'tenant-b'));
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      await a.put(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`, { content: 'A only' });
      const bg = await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'sleep 600', background: true });
      const pidA: number = bg.body.pid;
      const ckA: string = (await a.post(`/v1/sandboxes/${sa}/checkpoints`, {})).body.id;
      const effA: string = (
        await a.post(`/v1/sandboxes/${sa}/effects`, { kind: 'k', input: 1, reversibility: 'irreversible' })
      ).body.effectId;
      t.truthy(pidA && ckA && effA);

      // Every route of the API, from the server itself: a route added later
      // without a row here fails this test.
      const doc = (await client.get('/openapi.json')).body as { paths: Record<string, Record<string, unknown>> };
      const routes = Object.entries(doc.paths)
        .filter(([p]) => p.includes('{id}'))
        .flatMap(([p, ops]) =>
          Object.keys(ops)
            .filter((m) => m !== 'parameters')
            .map((m) => `${m.toUpperCase()} ${p}`),
        )
        .sort();
      // [query, body, headers] per route; {id} {ckpt} {effectId} {pid} are filled in.
      const raw = { 'content-type': 'application/octet-stream' };
      const table: Record<string, [string?, unknown?, Record<string, string>?][]> = {
        'GET /v1/sandboxes/{id}': [[]],
        'DELETE /v1/sandboxes/{id}': [[]],
        'POST /v1/sandboxes/{id}/commands': [
          [undefined, { cmd: 'cat /workspace/secret.txt' }],
          [undefined, { cmd: 'rm -rf /workspace', background: true }],
          [undefined, { cmd: 'echo x' }, { accept: 'application/x-ndjson' }],
        ],
        'POST /v1/sandboxes/{id}/commands/{pid}/wait': [[undefined, { timeoutMs: 100 }]],
        'POST /v1/sandboxes/{id}/commands/{pid}/kill': [[undefined, {}]],
        'GET /v1/sandboxes/{id}/commands': [[]],
        'GET /v1/sandboxes/{id}/commands/{pid}/output': [['stdoutOffset=0']],
        'POST /v1/sandboxes/{id}/commands/{pid}/stdin': [[undefined, Buffer.from('typed by b\n'), raw]],
        'POST /v1/sandboxes/{id}/commands/{pid}/stdin/close': [[undefined, {}]],
        'POST /v1/sandboxes/{id}/pty': [[undefined, { cols: 80, rows: 24, cmd: 'cat /workspace/secret.txt' }]],
        'GET /v1/sandboxes/{id}/pty': [[]],
        'GET /v1/sandboxes/{id}/pty/{pid}/output': [['offset=0']],
        'GET /v1/sandboxes/{id}/pty/{pid}/stream': [['offset=0']],
        'POST /v1/sandboxes/{id}/pty/{pid}/input': [[undefined, Buffer.from('rm -rf /workspace\n'), raw]],
        'POST /v1/sandboxes/{id}/pty/{pid}/resize': [[undefined, { cols: 10, rows: 10 }]],
        'POST /v1/sandboxes/{id}/pty/{pid}/wait': [[undefined, { timeoutMs: 100 }]],
        'POST /v1/sandboxes/{id}/pty/{pid}/kill': [[undefined, {}]],
        'GET /v1/sandboxes/{id}/files': [
          ['path=/workspace/secret.txt'],
          ['path=/workspace/secret.txt', undefined, { accept: 'application/octet-stream' }],
        ],
        'PUT /v1/sandboxes/{id}/files': [
          ['path=/workspace/secret.txt', { content: 'pwned' }],
          ['path=/workspace/secret.txt', Buffer.from('pwned'), raw],
        ],
        'DELETE /v1/sandboxes/{id}/files': [['path=/workspace/secret.txt']],
        'GET /v1/sandboxes/{id}/files/list': [['path=/workspace']],
        'GET /v1/sandboxes/{id}/files/exists': [['path=/workspace/secret.txt']],
        'POST /v1/sandboxes/{id}/checkpoints': [[undefined, { label: 'b was here' }]],
        'GET /v1/sandboxes/{id}/checkpoints': [[]],
        'GET /v1/sandboxes/{id}/checkpoints/{ckpt}/context': [[]],
        'DELETE /v1/sandboxes/{id}/checkpoints/{ckpt}': [[]],
        'POST /v1/sandboxes/{id}/rollback': [[undefined, { checkpointId: '{ckpt}' }]],
        'POST /v1/sandboxes/{id}/fork': [[undefined, { checkpointId: '{ckpt}', count: 1 }]],
        'GET /v1/sandboxes/{id}/effects': [[]],
        'POST /v1/sandboxes/{id}/effects': [[undefined, { kind: 'x', input: 1, reversibility: 'irreversible' }]],
        'GET /v1/sandboxes/{id}/effects/{effectId}': [[]],
        'POST /v1/sandboxes/{id}/effects/{effectId}/commit': [[undefined, { output: 'stolen' }]],
        'POST /v1/sandboxes/{id}/effects/{effectId}/fail': [[undefined, { error: 'x', definite: true }]],
        'POST /v1/sandboxes/{id}/effects/{effectId}/resolve': [[undefined, { outcome: 'failed' }]],
        'GET /v1/sandboxes/{id}/observations': [['includeStale=true']],
        'POST /v1/sandboxes/{id}/verdicts': [[undefined, { path: 'secret.txt', verdict: 'fake' }]],
        'GET /v1/sandboxes/{id}/verdicts': [[]],
        'POST /v1/sandboxes/{id}/ports': [[undefined, { port: 8000 }]],
        'GET /v1/sandboxes/{id}/ports': [[]],
        'DELETE /v1/sandboxes/{id}/ports/{port}': [[]],
      };
      t.deepEqual(Object.keys(table).sort(), routes, 'the table covers every route that takes a sandbox id');

      const db = ls.engine.catalog.db;
      const before = rowCounts(db);
      const foreign = { id: sa, ckpt: ckA, effectId: effA, pid: String(pidA), port: '8000' };
      const missing = {
        id: 'sbx_nosuchsandbox',
        ckpt: 'ckpt_nosuchckpt00',
        effectId: 'eff_00000000000000000000',
        pid: '99999',
        port: '8000',
      };
      const fill = (text: string, ids: Record<string, string>) =>
        text.replace(/\{(id|ckpt|effectId|pid|port)\}/g, (_m, k: string) => ids[k]!);
      const fillBody = (body: unknown, ids: Record<string, string>) =>
        body === undefined || Buffer.isBuffer(body) ? body : JSON.parse(fill(JSON.stringify(body), ids));
      for (const route of routes) {
        const [method, template] = route.split(' ') as [string, string];
        for (const [query, body, headers] of table[route]!) {
          const send = (ids: Record<string, string>) =>
            b.req(method, fill(template, ids) + (query ? `?${query}` : ''), {
              body: fillBody(body, ids),
              ...(Buffer.isBuffer(body) ? { raw: true } : {}),
              ...(headers ? { headers } : {}),
            });
          const rf = await send(foreign);
          const rm = await send(missing);
          t.is(rf.status, 404, `${route} ${query ?? ''}: ${rf.text}`);
          t.is(rf.body?.error?.code, 'SANDBOX_NOT_FOUND', route);
          t.deepEqual(
            shape(rf, Object.values(foreign)),
            shape(rm, Object.values(missing)),
            `${route}: the same answer as for a missing id`,
          );
        }
      }
      // Nothing changed for A: no rows, the file, the background process.
      t.deepEqual(rowCounts(db), before);
      t.is((await a.get(`/v1/sandboxes/${sa}/files?path=/workspace/secret.txt`)).body.content, 'A only');
      t.is((await a.get(`/v1/sandboxes/${sa}/checkpoints`)).body.length, 1);
      t.is(
        (await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: `kill -0 ${pidA} && echo alive` })).body.stdout,
        'alive\n',
      );
    },
  );

  test.serial(
    "tenant rm --force removes the tenant's sandboxes (processes, mounts, layers, rows); a new tenant with the same name sees nothing of the old one",
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const oldToken = tenantToken(ls, 'acme');
      const old = client.as(oldToken);
      const key = { 'idempotency-key': 'create-1' };
      const first = await old.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
      t.is(first.status, 201);
      const ids: string[] = [first.body.id, (await old.post('/v1/sandboxes', { memoryMb: 64 })).body.id];
      await old.put(`/v1/sandboxes/${ids[0]}/files?path=secret.txt`, { content: 'old tenant' });
      const ck = await old.post(`/v1/sandboxes/${ids[0]}/checkpoints`, {});
      t.is(ck.status, 201, ck.text);
      const fork = await old.post(`/v1/sandboxes/${ids[0]}/fork`, { checkpointId: ck.body.id, count: 1 });
      ids.push(...(fork.body.ids as string[]));
      t.is(ids.length, 3);
      const cat = ls.engine.catalog;
      const host = ids.map((id) => ({ id, row: cat.sandbox(id)!, checkpoints: cat.checkpointsOf(id) }));
      for (const h of host) t.true(isAlive(h.row.init_pid!), `${h.id} runs`);

      const report = await purgeTenant(ls, 'acme');
      t.deepEqual([...report.sandboxes].sort(), [...ids].sort());
      // Gone on the host: processes, mounts, layers, cgroups; and in the catalog.
      for (const h of host) {
        t.false(isAlive(h.row.init_pid!), `${h.id}: init ${h.row.init_pid} is gone`);
        t.deepEqual(mountsUnder(ls.engine.paths.sandboxRun(h.row.instance)), [], `${h.id}: no mounts`);
        t.false(fs.existsSync(ls.engine.paths.upper(h.row.instance)), `${h.id}: no writable layer`);
        for (const c of h.checkpoints) t.false(fs.existsSync(ls.engine.paths.layer(c.layer_id)), `${c.id}: no layer`);
        t.is(cat.sandbox(h.id), undefined, `${h.id}: no row`);
        t.deepEqual(cat.checkpointsOf(h.id), []);
        t.deepEqual(
          ls.engine.cgroups.pids(ls.engine.runtime.cgroupName(h.row.instance)),
          [],
          `${h.id}: no processes in its cgroup`,
        );
      }
      t.is((await old.get('/v1/sandboxes')).status, 401, 'the old token is revoked');

      // Same name again: a new tenant, with nothing of the old one.
      const fresh = client.as(addTenant(ls.engine.catalog.db, 'acme').token);
      t.deepEqual((await fresh.get('/v1/sandboxes')).body, []);
      for (const id of ids) t.is((await fresh.get(`/v1/sandboxes/${id}`)).status, 404);
      t.like((await fresh.get('/v1/tenant')).body, { name: 'acme', usage: { sandboxes: 0, memoryMb: 0 } });
      const again = await fresh.post('/v1/sandboxes', { memoryMb: 64 }, { headers: key });
      t.is(again.status, 201);
      t.is(again.headers.get('idempotent-replayed'), null, "the old tenant's stored response is not replayed");
      t.false(ids.includes(again.body.id));
      t.is((await fresh.get(`/v1/sandboxes/${again.body.id}/files/exists?path=secret.txt`)).body.exists, false);
    },
  );

  test.serial(
    '/metrics with a token: the right token works; a wrong one of the same or another length, or none, gets 401',
    async (t) => {
      const ls = await openTestLockstep(t);
      const secret = 'scrape-secret-0123456789';
      const { client } = await startServer(t, ls, { metricsToken: secret });
      const ok = await client.as(secret).get('/metrics');
      t.is(ok.status, 200);
      t.regex(ok.text, /lockstep_http_requests_total/);
      const sameLength = secret.slice(0, -1) + (secret.endsWith('9') ? '8' : '9');
      for (const wrong of [sameLength, secret.slice(0, -1), secret + 'x', 'x', undefined]) {
        const r = await (wrong === undefined ? client : client.as(wrong)).get('/metrics');
        t.is(r.status, 401, String(wrong));
        t.is(r.body.error.code, 'UNAUTHENTICATED');
        t.false(r.text.includes('lockstep_http_requests_total'));
      }
      t.is(
        (await new ApiClient(client.base).get('/metrics', { headers: { authorization: `Basic ${secret}` } })).status,
        401,
      );
    },
  );

  test.serial('requests without a valid bearer token get 401 and do nothing', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const token = tenantToken(ls, 'acme');
    const before = rowCounts(ls.engine.catalog.db);
    for (const c of [
      client,
      client.as('lst_' + 'x'.repeat(43)),
      client.as(token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A')),
      client.as('not-a-token'),
    ]) {
      const r = await c.post('/v1/sandboxes', {});
      t.is(r.status, 401);
      t.is(r.body.error.code, 'UNAUTHENTICATED');
      t.is(r.headers.get('www-authenticate'), 'Bearer realm="lockstep"');
    }
    const basic = await client.get('/v1/sandboxes', {
      headers: { authorization: `Basic ${Buffer.from('acme:' + token).toString('base64')}` },
    });
    t.is(basic.status, 401);
    t.deepEqual(rowCounts(ls.engine.catalog.db), before);
    // A removed tenant's token stops working at once.
    const gone = tenantToken(ls, 'leaving');
    t.is((await client.as(gone).get('/v1/sandboxes')).status, 200);
    removeTenant(ls.engine.catalog.db, 'leaving');
    t.is((await client.as(gone).get('/v1/sandboxes')).status, 401);
  });

  test.serial(
    'quotas: number of sandboxes and total memory, for creates and forks (429 QUOTA_EXCEEDED, nothing created)',
    async (t) => {
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
      t.like((await small.get('/v1/tenant')).body, {
        name: 'small',
        maxSandboxes: 2,
        maxMemoryMb: 192,
        usage: { sandboxes: 2, memoryMb: 192 },
      });

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
      const results = await Promise.all([
        roomy.post('/v1/sandboxes', { memoryMb: 16 }),
        roomy.post('/v1/sandboxes', { memoryMb: 16 }),
      ]);
      t.deepEqual(results.map((r) => r.status).sort(), [201, 429]);
      t.is(ls.list(tenantId(ls, 'racy')).length, 1);
    },
  );

  test.serial(
    'Idempotency-Key: a retried POST is replayed, not repeated; another body with the same key is refused; keys are per tenant and expire after 24 h',
    async (t) => {
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
      t.deepEqual(reused.body.error, {
        code: 'IDEMPOTENCY_KEY_REUSED',
        message: 'Idempotency-Key "create-1" was already used for a different request',
        field: 'Idempotency-Key',
      });
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
      const streamed = await a.post(`/v1/sandboxes/${id}/commands`, cmd, {
        headers: { 'idempotency-key': 'cmd-1', accept: 'application/x-ndjson' },
      });
      t.is(streamed.headers.get('idempotent-replayed'), 'true');
      t.deepEqual(ndjson(streamed.text), [
        { type: 'stdout', data: '1\n' },
        {
          type: 'result',
          exitCode: 0,
          truncated: false,
          durationMs: c1.body.durationMs,
          observationId: c1.body.observationId,
        },
      ]);
      // A first streamed request is stored too.
      const s1 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, {
        headers: { 'idempotency-key': 'cmd-2', accept: 'application/x-ndjson' },
      });
      const s2 = await a.post(`/v1/sandboxes/${id}/commands`, cmd, { headers: { 'idempotency-key': 'cmd-2' } });
      t.is(ndjson(s1.text)[0]!.data, '2\n');
      t.is(s2.body.stdout, '2\n');
      t.is((await a.get(`/v1/sandboxes/${id}/files?path=count`)).body.content, 'ran\nran\n');

      // One checkpoint for two identical checkpoint requests.
      const k1 = await a.post(
        `/v1/sandboxes/${id}/checkpoints`,
        { label: 'once' },
        { headers: { 'idempotency-key': 'ck-1' } },
      );
      const k2 = await a.post(
        `/v1/sandboxes/${id}/checkpoints`,
        { label: 'once' },
        { headers: { 'idempotency-key': 'ck-1' } },
      );
      t.is(k2.body.id, k1.body.id);
      t.is((await a.get(`/v1/sandboxes/${id}/checkpoints`)).body.length, 1);

      // Errors are not stored: after fixing the cause, the same key runs.
      const e1 = await a.post(
        `/v1/sandboxes/${id}/rollback`,
        { checkpointId: 'ckpt_notyet' },
        { headers: { 'idempotency-key': 'rb-1' } },
      );
      t.is(e1.status, 404);
      const e2 = await a.post(
        `/v1/sandboxes/${id}/rollback`,
        { checkpointId: 'ckpt_notyet' },
        { headers: { 'idempotency-key': 'rb-1' } },
      );
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
    },
  );

  test.serial(
    'a request still running holds its key: a concurrent retry gets 409 IDEMPOTENCY_KEY_IN_PROGRESS',
    async (t) => {
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
    },
  );
});
