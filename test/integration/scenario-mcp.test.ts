/**
 * Issue 12's one scenario through MCP over streamable HTTP, with the MCP
 * SDK's own client and a tenant's token, with the steps and checks of
 * test/helpers/scenario.ts: create, a process, files; checkpoint with a
 * context, an irreversible effect; rollback and its report, the effect
 * retried without a second run; fork; and an interactive process fed
 * through start_process/send_input. The counter that lives across the
 * checkpoint is started by a shell command that leaves it running (setsid,
 * its stdio inside the sandbox).
 */
import { createHash, randomBytes } from 'node:crypto';
import test from 'ava';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

/** Calls a tool and parses its JSON answer; a tool error throws unless `error` is set, then its JSON is returned. */
async function call(client: Client, name: string, args: Record<string, unknown>, opts: { error?: boolean } = {}) {
  const r = (await client.callTool({ name, arguments: args })) as {
    isError?: boolean;
    content: { type: string; text: string }[];
  };
  const text = r.content[0]!.text;
  if (Boolean(r.isError) !== Boolean(opts.error))
    throw new Error(`${name}: ${r.isError ? 'tool error' : 'expected a tool error'}: ${text}`);
  return JSON.parse(text) as any;
}

integration(test, () => {
  test.serial(
    'MCP over HTTP: files, checkpoint with a context, an irreversible effect, rollback with its report, the effect not run twice, fork',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client: http } = await startServer(t, ls);
      const transport = new StreamableHTTPClientTransport(new URL(`${http.base}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${tenantToken(ls, 'scenario')}` } },
      });
      const client = new Client({ name: 'lockstep-scenario', version: '0.0.0' });
      await client.connect(transport);
      t.teardown(() => client.close());

      const sbx = await call(client, 'create_sandbox', { memoryMb: 128 });
      t.regex(sbx.id, /^sbx_/);
      const on = { sandboxId: sbx.id };
      t.teardown(() => ls.remove(sbx.id).catch(() => undefined));
      const read = async (p: string, sandboxId = sbx.id) =>
        (await call(client, 'read_file', { sandboxId, path: p, encoding: 'base64' })) as { content: string };
      const text = async (p: string, sandboxId = sbx.id) =>
        Buffer.from((await read(p, sandboxId)).content, 'base64').toString();
      const counter = async () => Number(await text('/tmp/counter'));

      // A process that lives across the checkpoint: its counter carries on after the rollback.
      const started = await call(client, 'run_command', {
        ...on,
        // Its own session (CRIU dumps only sessions that start inside the sandbox), stdio inside the sandbox.
        cmd: "setsid sh -c 'n=0; while true; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
      });
      t.is(started.exitCode, 0);
      await eventually(async () => (await counter()) > 2, 10_000);

      // An interactive process: bytes to its stdin in two writes, EOF, its answer read back by offsets.
      const data = randomBytes(50_000);
      const sum = await call(client, 'start_process', { ...on, cmd: 'sha256sum', stdin: true });
      t.true(sum.stdin);
      await call(client, 'send_input', {
        ...on,
        pid: sum.pid,
        data: data.subarray(0, 7).toString('base64'),
        encoding: 'base64',
      });
      t.like(
        await call(client, 'send_input', {
          ...on,
          pid: sum.pid,
          data: data.subarray(7).toString('base64'),
          encoding: 'base64',
          close: true,
        }),
        { sent: data.length - 7, closed: true },
      );
      t.like(await call(client, 'wait_process', { ...on, pid: sum.pid }), { exitCode: 0 });
      const out = await call(client, 'read_output', { ...on, pid: sum.pid });
      t.is(out.stdout, `${createHash('sha256').update(data).digest('hex')}  -\n`);
      t.deepEqual(await call(client, 'read_output', { ...on, pid: sum.pid, stdoutOffset: out.offsets.stdout }), {
        pid: sum.pid,
        stdout: '',
        stderr: '',
        offsets: out.offsets,
        rewound: false,
        running: false,
      });
      const late = await call(client, 'send_input', { ...on, pid: sum.pid, data: 'late' }, { error: true });
      t.is(late.error.code, 'STDIN_CLOSED');

      const bin = Buffer.from([0, 1, 2, 200, 255, 10]);
      t.is(
        (
          await call(client, 'write_file', {
            ...on,
            path: '/workspace/data/blob.bin',
            content: bin.toString('base64'),
            encoding: 'base64',
          })
        ).bytes,
        bin.length,
      );
      await call(client, 'write_file', { ...on, path: 'notes.txt', content: 'version 1\n' });
      t.deepEqual(Buffer.from((await read('/workspace/data/blob.bin')).content, 'base64'), bin);

      const context = {
        format: 'openai-chat',
        messages: [
          { role: 'system', content: 'You fix bugs.' },
          { role: 'user', content: 'Fix the notes.' },
        ],
      };
      const ck = await call(client, 'checkpoint', { ...on, label: 'before edit', context });
      t.regex(ck.id, /^ckpt_/);
      t.truthy(ck.contextId);

      // The abandoned attempt: files change and an e-mail goes out (irreversible).
      await call(client, 'write_file', { ...on, path: 'notes.txt', content: 'version 2 (broken)\n' });
      await call(client, 'write_file', { ...on, path: 'new.txt', content: 'new' });
      const effect = {
        kind: 'email.send',
        input: { to: 'ops@example.com' },
        key: 'mail-1',
        reversibility: 'irreversible',
      };
      let sent = 0;
      /** The MCP way: the effect's outcome is recorded under its key; a replay says not to perform it again. */
      const sendMail = async (sandboxId: string, messageId: string) => {
        const r = await call(client, 'record_effect', { sandboxId, ...effect, output: { messageId } });
        if (r.replayed) return r.output as { messageId: string };
        sent++;
        return { messageId };
      };
      t.deepEqual(await sendMail(sbx.id, 'm-1'), { messageId: 'm-1' });
      t.is(sent, 1);

      const report = await call(client, 'rollback', {
        ...on,
        checkpointId: ck.id,
        failure: 'The edit broke the notes',
      });
      t.is(report.checkpointId, ck.id);
      t.deepEqual(report.context, context);
      t.is(report.effectsAfter.length, 1);
      t.true(
        report.warnings.some(
          (w: { effectId: string; reason: string }) =>
            w.effectId === report.effectsAfter[0].id && w.reason === 'irreversible',
        ),
      );
      t.is(await text('notes.txt'), 'version 1\n');
      const gone = await call(client, 'read_file', { ...on, path: 'new.txt' }, { error: true });
      t.is(gone.error.code, 'FILE_NOT_FOUND');

      // Retrying the effect after the rollback returns what it returned, without running it.
      t.deepEqual(await sendMail(sbx.id, 'm-2'), { messageId: 'm-1' });
      t.is(sent, 1);

      // The restored process runs on.
      const after = await counter();
      await eventually(async () => (await counter()) > after, 10_000);

      // A fork starts from the checkpoint's files, and knows the effect too.
      const forked = await call(client, 'fork', { ...on, checkpointId: ck.id });
      t.is(forked.ids.length, 1);
      const child = forked.ids[0] as string;
      t.teardown(() => ls.remove(child).catch(() => undefined));
      t.is(await text('notes.txt', child), 'version 1\n');
      t.deepEqual(Buffer.from((await read('/workspace/data/blob.bin', child)).content, 'base64'), bin);
      t.deepEqual(await sendMail(child, 'm-3'), { messageId: 'm-1' });
      t.is(sent, 1);

      for (const id of [child, sbx.id])
        t.deepEqual(await call(client, 'kill_sandbox', { sandboxId: id }), { id, removed: true });
      t.deepEqual(await call(client, 'list_sandboxes', {}), []);
    },
  );
});
