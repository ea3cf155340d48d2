/**
 * Bad input on every route: 400 with the offending field named in
 * `{ error: { code, message, field } }`, 413 for bodies over the limit, 415
 * for unknown content types, and nothing created or changed by any of it.
 * Paths that leave the sandbox, by ".." or by a symlink planted inside it,
 * are refused the same way.
 */
import test from 'ava';
import fs from 'node:fs';
import { createHash } from 'node:crypto';
import type Database from 'better-sqlite3';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';
import { COMMAND_TIMEOUT_MAX_MS, IMAGE_NAME_MAX } from '../../src/limits.js';

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

const fileHash = (p: string) => createHash('sha256').update(fs.readFileSync(p)).digest('hex');

integration(test, () => {
  test.serial('bad input on every route answers 400 naming the field, and creates nothing', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const ck: string = (await api.post(`/v1/sandboxes/${id}/checkpoints`, {})).body.id;
    const eff: string = (
      await api.post(`/v1/sandboxes/${id}/effects`, { kind: 'k', input: 1, reversibility: 'irreversible' })
    ).body.effectId;
    const S = `/v1/sandboxes/${id}`;
    // The checkpoint's durability and warm standby (an instance and its holds) run in the
    // background: wait for them, so that the count below changes only if a refusal changed it.
    await ls.get(id).durable(ck);
    await ls.get(id).settled();
    const before = rowCounts(ls.engine.catalog.db);

    // [method, path, body, field, code?]
    const cases: [string, string, unknown, string, string?][] = [
      // create
      ['POST', '/v1/sandboxes', { memoryMb: '128' }, 'memoryMb'],
      ['POST', '/v1/sandboxes', { memoryMb: 8 }, 'memoryMb'],
      ['POST', '/v1/sandboxes', { memoryMb: 64.5 }, 'memoryMb'],
      ['POST', '/v1/sandboxes', { pids: 1 }, 'pids'],
      ['POST', '/v1/sandboxes', { image: '../etc' }, 'image'],
      ['POST', '/v1/sandboxes', { image: 'x'.repeat(IMAGE_NAME_MAX + 1) }, 'image'],
      ['POST', '/v1/sandboxes', { image: 'nosuchimage' }, 'image', 'IMAGE_NOT_FOUND'],
      ['POST', '/v1/sandboxes', { envs: { '1BAD': 'x' } }, 'envs.1BAD'],
      ['POST', '/v1/sandboxes', { envs: { GOOD: 1 } }, 'envs.GOOD'],
      ['POST', '/v1/sandboxes', { envs: ['A=1'] }, 'envs'],
      ['POST', '/v1/sandboxes', { timeoutMs: 10 }, 'timeoutMs'],
      ['POST', '/v1/sandboxes', { metadata: { owner: 7 } }, 'metadata.owner'],
      ['POST', '/v1/sandboxes', { tenant: 'someone-else' }, 'tenant'],
      ['POST', '/v1/sandboxes', [], 'body'],
      ['POST', '/v1/sandboxes', 'null', 'body'],
      // commands
      ['POST', `${S}/commands`, {}, 'cmd'],
      ['POST', `${S}/commands`, { cmd: 5 }, 'cmd'],
      ['POST', `${S}/commands`, { cmd: [] }, 'cmd'],
      ['POST', `${S}/commands`, { cmd: ['ls', 5] }, 'cmd'],
      ['POST', `${S}/commands`, { cmd: '   ' }, 'cmd'],
      ['POST', `${S}/commands`, { cmd: ['', 'x'] }, 'cmd[0]'],
      ['POST', `${S}/commands`, { cmd: 'ls', cwd: 'relative/dir' }, 'cwd'],
      ['POST', `${S}/commands`, { cmd: 'ls', envs: { 'A-B': 'x' } }, 'envs.A-B'],
      ['POST', `${S}/commands`, { cmd: 'ls', timeoutMs: 0 }, 'timeoutMs'],
      ['POST', `${S}/commands`, { cmd: 'ls', timeoutMs: 1.5 }, 'timeoutMs'],
      ['POST', `${S}/commands`, { cmd: 'ls', timeoutMs: COMMAND_TIMEOUT_MAX_MS + 1 }, 'timeoutMs'],
      ['POST', `${S}/commands`, { cmd: 'ls', background: 'yes' }, 'background'],
      ['POST', `${S}/commands`, { cmd: 'ls', shell: true }, 'shell'],
      ['POST', `${S}/commands`, { cmd: 'ls', toolCallId: '' }, 'toolCallId'],
      ['POST', `${S}/commands/0/wait`, {}, 'pid'],
      ['POST', `${S}/commands/12/kill`, { signal: 'SIGSTOPPP' }, 'signal'],
      // files
      ['GET', `${S}/files`, undefined, 'path'],
      ['GET', `${S}/files?path=`, undefined, 'path'],
      ['GET', `${S}/files?path=a&encoding=hex`, undefined, 'encoding'],
      ['GET', `${S}/files?path=a&extra=1`, undefined, 'extra'],
      ['GET', `${S}/files?path=../../../../etc/passwd`, undefined, 'path', 'PATH_ESCAPES_SANDBOX'],
      ['GET', `${S}/files?path=/workspace/../../../etc/shadow`, undefined, 'path', 'PATH_ESCAPES_SANDBOX'],
      ['PUT', `${S}/files?path=../../../tmp/evil`, { content: 'x' }, 'path', 'PATH_ESCAPES_SANDBOX'],
      ['PUT', `${S}/files?path=a.txt`, { content: 5 }, 'content'],
      ['PUT', `${S}/files?path=a.txt`, {}, 'content'],
      ['PUT', `${S}/files?path=a.txt`, { content: 'x', encoding: 'hex' }, 'encoding'],
      ['PUT', `${S}/files?path=a.txt`, { content: '***', encoding: 'base64' }, 'content'],
      ['PUT', `${S}/files?path=a.txt`, { content: 'x', mode: 0o17777 }, 'mode'],
      ['PUT', `${S}/files?path=a.txt`, { content: 'x', owner: 'root' }, 'owner'],
      ['PUT', `${S}/files?path=/`, { content: 'x' }, 'path'],
      ['DELETE', `${S}/files?path=../../etc/hosts`, undefined, 'path', 'PATH_ESCAPES_SANDBOX'],
      ['GET', `${S}/files/list?path=../..`, undefined, 'path', 'PATH_ESCAPES_SANDBOX'],
      ['GET', `${S}/files/list`, undefined, 'path'],
      // checkpoints
      ['POST', `${S}/checkpoints`, { label: 5 }, 'label'],
      ['POST', `${S}/checkpoints`, { label: 'two\nlines' }, 'label'],
      ['POST', `${S}/checkpoints`, { context: 'just text' }, 'context'],
      ['POST', `${S}/checkpoints`, { context: { format: 'nope', messages: [] } }, 'context.format'],
      ['POST', `${S}/checkpoints`, { context: [{ role: 'user', content: 'hi' }] }, 'contextFormat'],
      [
        'POST',
        `${S}/checkpoints`,
        { context: { format: 'openai-chat', messages: [{ role: 'robot', content: 'x' }] } },
        'context.messages[0].role',
      ],
      [
        'POST',
        `${S}/checkpoints`,
        { context: { format: 'anthropic', messages: [] }, contextFormat: 'openai-chat' },
        'contextFormat',
      ],
      ['POST', `${S}/checkpoints`, { contextFormat: 'yaml' }, 'contextFormat'],
      ['POST', `${S}/checkpoints`, { label: 'x', snapshot: true }, 'snapshot'],
      ['GET', `${S}/checkpoints/not-a-checkpoint/context`, undefined, 'ckpt'],
      ['DELETE', `${S}/checkpoints/ckpt_BAD`, undefined, 'ckpt'],
      // rollback and fork
      ['POST', `${S}/rollback`, {}, 'checkpointId'],
      ['POST', `${S}/rollback`, { checkpointId: ck, policy: 'maybe' }, 'policy'],
      ['POST', `${S}/rollback`, { checkpointId: ck, lessons: ['ok', 3] }, 'lessons[1]'],
      ['POST', `${S}/rollback`, { checkpointId: ck, lessons: 'be careful' }, 'lessons'],
      ['POST', `${S}/rollback`, { checkpointId: ck, withRecoverySummary: 'yes' }, 'withRecoverySummary'],
      ['POST', `${S}/rollback`, { checkpointId: ck, failure: 'f'.repeat(4001) }, 'failure'],
      ['POST', `${S}/fork`, { checkpointId: ck, count: 0 }, 'count'],
      ['POST', `${S}/fork`, { checkpointId: ck, count: 65 }, 'count'],
      ['POST', `${S}/fork`, { checkpointId: ck, count: '2' }, 'count'],
      ['POST', `${S}/fork`, { count: 1 }, 'checkpointId'],
      // effects
      ['POST', `${S}/effects`, {}, 'kind'],
      ['POST', `${S}/effects`, { kind: 'k', input: 1 }, 'reversibility'],
      ['POST', `${S}/effects`, { kind: 'k', input: 1, reversibility: 'maybe' }, 'reversibility'],
      [
        'POST',
        `${S}/effects`,
        { kind: 'k', input: 1, reversibility: 'compensable', compensation: { kind: 'undo' } },
        'compensation.input',
      ],
      ['POST', `${S}/effects`, { kind: 'k', input: 1, reversibility: 'irreversible', scope: 'world' }, 'scope'],
      ['POST', `${S}/effects/${eff}/commit`, { output: 1, note: 'x' }, 'note'],
      ['POST', `${S}/effects/${eff}/fail`, { error: 'x' }, 'definite'],
      ['POST', `${S}/effects/${eff}/fail`, { error: 5, definite: true }, 'error'],
      ['POST', `${S}/effects/${eff}/resolve`, { outcome: 'perhaps' }, 'outcome'],
      ['GET', `${S}/effects/eff_XYZ`, undefined, 'effectId'],
      // observations and verdicts
      ['GET', `${S}/observations?includeStale=yes`, undefined, 'includeStale'],
      ['POST', `${S}/verdicts`, { path: 'a' }, 'verdict'],
      ['POST', `${S}/verdicts`, { path: 'missing.txt', verdict: 'ok' }, 'path'],
      ['GET', `${S}/verdicts?stale=1`, undefined, 'stale'],
      // ids
      ['GET', '/v1/sandboxes/NOT_AN_ID', undefined, 'id'],
      ['POST', '/v1/sandboxes/sbx_../commands', { cmd: 'ls' }, 'id'],
    ];
    for (const [method, path, body, field, code] of cases) {
      const r = await api.req(
        method,
        path,
        body === 'null' ? { body: 'null', raw: true, headers: { 'content-type': 'application/json' } } : { body },
      );
      const label = `${method} ${path} ${JSON.stringify(body) ?? ''}`;
      const expected = code === 'IMAGE_NOT_FOUND' ? 404 : 400;
      t.is(r.status, expected, `${label} → ${r.text}`);
      t.is(r.body?.error?.field, field, `${label} names ${field}: ${r.text}`);
      t.is(r.body?.error?.code, code ?? 'INVALID_ARGUMENT', label);
      t.is(typeof r.body?.error?.message, 'string');
      t.deepEqual(Object.keys(r.body).sort(), ['error'], `${label}: one body shape`);
    }

    // Malformed JSON, wrong content types, bodies over the limits.
    const malformed = await api.req('POST', '/v1/sandboxes', {
      body: '{"memoryMb": 64',
      raw: true,
      headers: { 'content-type': 'application/json' },
    });
    t.is(malformed.status, 400);
    t.deepEqual(malformed.body.error, { code: 'INVALID_JSON', message: 'The body is not valid JSON', field: 'body' });
    const xml = await api.req('POST', '/v1/sandboxes', {
      body: '<sandbox/>',
      raw: true,
      headers: { 'content-type': 'application/xml' },
    });
    t.is(xml.status, 415);
    t.is(xml.body.error.code, 'UNSUPPORTED_MEDIA_TYPE');
    const octetCreate = await api.req('POST', '/v1/sandboxes', {
      body: Buffer.from('{}'),
      raw: true,
      headers: { 'content-type': 'application/octet-stream' },
    });
    t.is(octetCreate.status, 415, 'raw bytes are taken only by file writes');
    const textFile = await api.req('PUT', `${S}/files?path=t.txt`, {
      body: 'plain text',
      raw: true,
      headers: { 'content-type': 'text/plain' },
    });
    t.is(textFile.status, 415);
    const hugeJson = await api.post('/v1/sandboxes', { metadata: { pad: 'x'.repeat(1024 * 1024) } });
    t.is(hugeJson.status, 413);
    t.deepEqual(hugeJson.body.error, {
      code: 'PAYLOAD_TOO_LARGE',
      message: 'The request body is larger than this route accepts',
      field: 'body',
    });
    const hugeFile = await api.req('PUT', `${S}/files?path=big.bin`, {
      body: Buffer.alloc(16 * 1024 * 1024 + 1),
      raw: true,
      headers: { 'content-type': 'application/octet-stream' },
    });
    t.is(hugeFile.status, 413);
    const hugeCheckpoint = await api.post(`${S}/checkpoints`, {
      context: { format: 'openai-chat', messages: [{ role: 'user', content: 'x'.repeat(16 * 1024 * 1024) }] },
    });
    t.is(hugeCheckpoint.status, 413);

    t.deepEqual(rowCounts(ls.engine.catalog.db), before, 'no rows added or removed by any of it');
    t.deepEqual(
      ls.list(tenantId(ls, 'acme')).map((s) => s.id),
      [id],
    );
    t.deepEqual((await api.get(`${S}/files/list?path=/workspace`)).body.entries, [], 'no file written');
    t.is((await api.get(`${S}/checkpoints`)).body.length, 1);
  });

  test.serial(
    'a symlink inside the sandbox that points outside is refused for read, write, list and remove; the host is untouched',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'acme'));
      const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const S = `/v1/sandboxes/${id}`;
      const plant = await api.post(`${S}/commands`, {
        cmd: 'ln -s /etc/passwd /workspace/passwd && ln -s ../../../../../../etc /workspace/etc-up && ln -s /tmp /workspace/tmp-abs && ls -l /workspace | wc -l',
      });
      t.is(plant.body.exitCode, 0, plant.text);
      const hostPasswd = fileHash('/etc/passwd');
      const marker = `/tmp/lockstep-escape-${process.pid}`;

      const attempts: [string, string, unknown?][] = [
        ['GET', `${S}/files?path=/workspace/passwd`],
        ['GET', `${S}/files?path=passwd`],
        ['PUT', `${S}/files?path=/workspace/passwd`, { content: 'root::0:0::/:/bin/sh\n' }],
        ['PUT', `${S}/files?path=/workspace/etc-up/lockstep-pwned`, { content: 'x' }],
        ['PUT', `${S}/files?path=/workspace/tmp-abs/lockstep-escape-${process.pid}`, { content: 'x' }],
        ['GET', `${S}/files/list?path=/workspace/etc-up`],
        ['GET', `${S}/files/list?path=/workspace/tmp-abs`],
        ['GET', `${S}/files?path=/workspace/etc-up/hostname`],
        ['DELETE', `${S}/files?path=/workspace/etc-up/hostname`],
        ['POST', `${S}/verdicts`, { path: '/workspace/passwd', verdict: 'looks fine' }],
      ];
      for (const [method, path, body] of attempts) {
        const r = await api.req(method, path, { body });
        t.is(r.status, 400, `${method} ${path}: ${r.text}`);
        t.like(r.body.error, { code: 'PATH_ESCAPES_SANDBOX', field: 'path' }, `${method} ${path}`);
      }
      t.is(fileHash('/etc/passwd'), hostPasswd);
      t.false(fs.existsSync('/etc/lockstep-pwned'));
      t.false(fs.existsSync(marker));
      t.true(fs.existsSync('/etc/hostname'));
      // The symlinks themselves are still there, and inside the sandbox they
      // resolve inside it (its own /etc/passwd).
      const inside = await api.post(`${S}/commands`, { cmd: 'head -c 5 /workspace/passwd' });
      t.is(inside.body.stdout, 'root:');
    },
  );
});
