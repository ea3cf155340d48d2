/**
 * MCP over streamable HTTP at /mcp, driven by the MCP SDK's own client
 * against a real server on loopback: one session manages several sandboxes
 * of its tenant, every tool carries its annotations, and tenants stay apart.
 */
import test from 'ava';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import fs from 'node:fs';
import path from 'node:path';
import { eventually, integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';
import { resolveStoreConfig } from '../../src/config.js';
import { MAX_SESSIONS } from '../../src/http/routes/mcp.js';

async function connect(
  t: { teardown: (fn: () => Promise<void>) => void },
  base: string,
  token: string,
): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: 'lockstep-test', version: '0.0.0' });
  await client.connect(transport);
  t.teardown(() => client.close());
  return { client, transport };
}

/** Calls a tool and parses its JSON text; fails on a tool error unless `error` is set. */
async function call(
  client: Client,
  name: string,
  args: Record<string, unknown> = {},
  opts: { error?: boolean } = {},
): Promise<any> {
  const r = (await client.callTool({ name, arguments: args })) as {
    isError?: boolean;
    content: { type: string; text: string }[];
  };
  const text = r.content[0]!.text;
  if (Boolean(r.isError) !== Boolean(opts.error))
    throw new Error(`${name}: ${r.isError ? 'tool error' : 'expected a tool error'}: ${text}`);
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

integration(test, () => {
  test.serial(
    'one MCP session over HTTP creates two sandboxes, works in both, checkpoints, rolls back, replays an effect, forks and kills them',
    async (t) => {
      const store = path.join(TEST_ROOT, `mcp-http-store-${process.pid}-${Date.now()}`);
      t.teardown(async () => fs.rmSync(store, { recursive: true, force: true }));
      const ls = await openTestLockstep(t, { open: { config: { snapshotStore: resolveStoreConfig({ url: store }) } } });
      const { client: http } = await startServer(t, ls);
      const { client } = await connect(t, http.base, tenantToken(ls, 'acme'));

      const { tools } = await client.listTools();
      const names = tools.map((x) => x.name).sort();
      t.deepEqual(names, [
        'checkpoint',
        'close_port',
        'create_sandbox',
        'create_snapshot',
        'delete_snapshot',
        'expose_port',
        'fork',
        'kill_process',
        'kill_sandbox',
        'list_checkpoints',
        'list_files',
        'list_ports',
        'list_processes',
        'list_sandboxes',
        'list_snapshots',
        'list_stored_snapshots',
        'pull_snapshot',
        'push_snapshot',
        'read_file',
        'read_output',
        'record_effect',
        'rollback',
        'run_command',
        'send_input',
        'start_from_snapshot',
        'start_process',
        'wait_process',
        'write_file',
      ]);
      for (const tool of tools) {
        for (const hint of ['readOnlyHint', 'destructiveHint', 'idempotentHint', 'openWorldHint'] as const)
          t.is(typeof tool.annotations?.[hint], 'boolean', `${tool.name}.${hint}`);
      }
      const byName = Object.fromEntries(tools.map((x) => [x.name, x]));
      t.like(byName.read_file!.annotations, { readOnlyHint: true, destructiveHint: false });
      t.like(byName.kill_sandbox!.annotations, { readOnlyHint: false, destructiveHint: true, idempotentHint: true });
      t.like(byName.rollback!.annotations, { destructiveHint: true });
      t.deepEqual(byName.run_command!.inputSchema.required?.slice().sort(), ['cmd', 'sandboxId']);

      const a = await call(client, 'create_sandbox', { memoryMb: 64, metadata: { task: 'a' } });
      const b = await call(client, 'create_sandbox', { memoryMb: 64 });
      t.regex(a.id, /^sbx_/);
      t.is(a.tenant, 'acme');
      t.deepEqual(a.metadata, { task: 'a', createdBy: 'mcp' });
      const listed = await call(client, 'list_sandboxes');
      t.deepEqual(listed.map((s: { id: string }) => s.id).sort(), [a.id, b.id].sort());
      // The init's host pid is the operator's (the library still has it), never the tenant's.
      t.true(Number.isInteger(ls.get(a.id).info().pid));
      t.false('pid' in a, 'create_sandbox shows no host pid');
      t.deepEqual(
        listed.filter((s: object) => 'pid' in s),
        [],
        'list_sandboxes shows no host pid',
      );

      await call(client, 'write_file', { sandboxId: a.id, path: 'notes.txt', content: 'in a\n' });
      await call(client, 'write_file', { sandboxId: b.id, path: 'notes.txt', content: 'in b\n' });
      t.is((await call(client, 'run_command', { sandboxId: a.id, cmd: 'cat notes.txt' })).stdout, 'in a\n');
      t.is((await call(client, 'read_file', { sandboxId: b.id, path: 'notes.txt' })).content, 'in b\n');

      // Exposed ports: refused while nothing listens, then a URL and a token; listed without it; closed.
      t.is(
        (await call(client, 'expose_port', { sandboxId: b.id, port: 8080 }, { error: true })).error.code,
        'PORT_NOT_LISTENING',
      );
      await call(client, 'start_process', { sandboxId: b.id, cmd: 'httpd -f -p 127.0.0.1:8080 -h /workspace' });
      const exposed = await eventually(
        async () => call(client, 'expose_port', { sandboxId: b.id, port: 8080 }).catch(() => undefined),
        10_000,
        100,
      );
      t.regex(exposed.token, /^lsp_/);
      t.deepEqual(
        (await call(client, 'list_ports', { sandboxId: b.id })).map((e: { id: string; token?: string }) => [
          e.id,
          e.token,
        ]),
        [[exposed.id, undefined]],
      );
      t.deepEqual(await call(client, 'close_port', { sandboxId: b.id, port: 8080 }), { port: 8080, closed: true });

      const context = { format: 'openai-chat', messages: [{ role: 'user', content: 'Fix the notes.' }] };
      const ck = await call(client, 'checkpoint', { sandboxId: a.id, label: 'before', context });
      const snap = await call(client, 'create_snapshot', { sandboxId: a.id, checkpointId: ck.id, name: 'mcp-snap' });
      t.regex(snap.id, /^snap_/);
      t.deepEqual(
        (await call(client, 'list_snapshots')).map((s: { id: string }) => s.id),
        [snap.id],
      );
      const fromSnap = await call(client, 'start_from_snapshot', { snapshot: 'mcp-snap' });
      t.is(fromSnap.ids.length, 1, JSON.stringify(fromSnap));
      t.is((await call(client, 'read_file', { sandboxId: fromSnap.ids[0], path: 'notes.txt' })).content, 'in a\n');
      await call(client, 'kill_sandbox', { sandboxId: fromSnap.ids[0] });
      // Into the tenant's part of the snapshot store and back, as a new snapshot.
      const pushed = await call(client, 'push_snapshot', { snapshot: 'mcp-snap', key: 'mcp-key' });
      t.like(pushed, { key: 'mcp-key', snapshotId: snap.id });
      t.true(fs.existsSync(path.join(store, 'tenants', tenantId(ls, 'acme'), 'manifests', 'mcp-key.json')));
      t.deepEqual(
        (await call(client, 'list_stored_snapshots')).map((x: { name: string }) => x.name),
        ['mcp-key'],
      );
      const pulled = await call(client, 'pull_snapshot', { key: 'mcp-key', name: 'mcp-pulled' });
      t.like(pulled.snapshot, { name: 'mcp-pulled', lineageId: snap.lineageId, tenant: tenantId(ls, 'acme') });
      t.deepEqual(await call(client, 'delete_snapshot', { snapshot: pulled.snapshot.id }), {
        id: pulled.snapshot.id,
        deleted: true,
      });
      t.deepEqual(await call(client, 'delete_snapshot', { snapshot: snap.id }), { id: snap.id, deleted: true });
      await call(client, 'write_file', { sandboxId: a.id, path: 'notes.txt', content: 'broken\n' });
      const eff = await call(client, 'record_effect', {
        sandboxId: a.id,
        kind: 'email.send',
        input: { to: 'ops' },
        key: 'mail-1',
        output: { messageId: 'm-1' },
      });
      t.like(eff, { replayed: false, status: 'committed' });
      const report = await call(client, 'rollback', {
        sandboxId: a.id,
        checkpointId: ck.id,
        failure: 'broke the notes',
      });
      t.deepEqual(report.context, context);
      t.deepEqual(
        report.effectsAfter.map((e: { id: string }) => e.id),
        [eff.effectId],
      );
      t.is((await call(client, 'read_file', { sandboxId: a.id, path: 'notes.txt' })).content, 'in a\n');
      const again = await call(client, 'record_effect', {
        sandboxId: a.id,
        kind: 'email.send',
        input: { to: 'ops' },
        key: 'mail-1',
        output: { messageId: 'm-2' },
      });
      t.deepEqual(again, { replayed: true, effectId: eff.effectId, output: { messageId: 'm-1' } });
      t.is(
        ls
          .get(a.id)
          .effects.list()
          .filter((e) => e.status === 'committed').length,
        1,
      );

      const forked = await call(client, 'fork', { sandboxId: a.id, checkpointId: ck.id });
      t.is(forked.ids.length, 1);
      t.is((await call(client, 'read_file', { sandboxId: forked.ids[0], path: 'notes.txt' })).content, 'in a\n');
      t.is(ls.get(forked.ids[0]).info().tenant, ls.get(a.id).info().tenant);

      for (const id of [forked.ids[0], a.id, b.id])
        t.deepEqual(await call(client, 'kill_sandbox', { sandboxId: id }), { id, removed: true });
      t.deepEqual(await call(client, 'list_sandboxes'), []);
      t.deepEqual(ls.list(), []);
    },
  );

  test.serial(
    "tenants stay apart: another tenant's sandbox is not found, its session id is unknown, and no token is refused",
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client: http } = await startServer(t, ls);
      const { client: acme, transport } = await connect(t, http.base, tenantToken(ls, 'acme'));
      const { client: rival } = await connect(t, http.base, tenantToken(ls, 'rival', { maxSandboxes: 1 }));

      const mine = await call(acme, 'create_sandbox', { memoryMb: 64 });
      const refused = await call(rival, 'run_command', { sandboxId: mine.id, cmd: 'id' }, { error: true });
      t.is(refused.error.code, 'SANDBOX_NOT_FOUND');
      t.is(
        (await call(rival, 'kill_sandbox', { sandboxId: mine.id }, { error: true })).error.code,
        'SANDBOX_NOT_FOUND',
      );
      t.deepEqual(await call(rival, 'list_sandboxes'), []);
      t.is(ls.list().length, 1);

      // The rival's quota holds through MCP as through REST.
      await call(rival, 'create_sandbox', { memoryMb: 64 });
      t.is((await call(rival, 'create_sandbox', { memoryMb: 64 }, { error: true })).error.code, 'QUOTA_EXCEEDED');

      // acme's session id presented with the rival's token: as unknown as a made-up one.
      const sid = transport.sessionId!;
      const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} });
      const headers = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-session-id': sid,
        'mcp-protocol-version': '2025-06-18',
      };
      const rivalToken = tenantToken(ls, 'rival2');
      const stolen = await fetch(`${http.base}/mcp`, {
        method: 'POST',
        headers: { ...headers, authorization: `Bearer ${rivalToken}` },
        body,
      });
      t.is(stolen.status, 404);
      t.is(((await stolen.json()) as { error: { code: string } }).error.code, 'MCP_SESSION_NOT_FOUND');
      const anon = await fetch(`${http.base}/mcp`, { method: 'POST', headers, body });
      t.is(anon.status, 401);
      const { 'mcp-session-id': _sid, ...sessionless } = headers;
      const noSession = await fetch(`${http.base}/mcp`, {
        method: 'POST',
        headers: { ...sessionless, authorization: `Bearer ${rivalToken}` },
        body,
      });
      t.is(noSession.status, 400);
      t.like(await noSession.json(), { error: { code: 'INVALID_ARGUMENT', field: 'Mcp-Session-Id' } });
      await call(acme, 'kill_sandbox', { sandboxId: mine.id });
    },
  );

  test.serial(
    "past the session limit a tenant's least recently used session is closed, and no other tenant's",
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client: http } = await startServer(t, ls);
      const acme = tenantToken(ls, 'acme');
      const other = tenantToken(ls, 'other');
      const headers = (token: string, sid?: string) => ({
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2025-06-18',
        ...(sid ? { 'mcp-session-id': sid } : {}),
      });
      const init = async (token: string) => {
        const body = JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'initialize',
          params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } },
        });
        const res = await fetch(`${http.base}/mcp`, { method: 'POST', headers: headers(token), body });
        await res.text();
        t.is(res.status, 200);
        return res.headers.get('mcp-session-id')!;
      };
      const ping = async (token: string, sid: string) => {
        const res = await fetch(`${http.base}/mcp`, {
          method: 'POST',
          headers: headers(token, sid),
          body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }),
        });
        await res.text();
        return res.status;
      };
      const theirs = await init(other);
      const mine: string[] = [];
      for (let i = 0; i < MAX_SESSIONS; i++) mine.push(await init(acme));
      t.is(await ping(acme, mine[0]!), 200); // the first is now the most recently used
      mine.push(await init(acme)); // one too many: closes mine[1], the least recently used
      t.is(await ping(acme, mine[1]!), 404);
      t.is(await ping(acme, mine[0]!), 200);
      t.is(await ping(acme, mine.at(-1)!), 200);
      t.is(await ping(other, theirs), 200);
    },
  );
});
