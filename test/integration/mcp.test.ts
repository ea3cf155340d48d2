/**
 * `lockstep mcp` driven by the MCP SDK's own client over stdio, as an agent
 * host would: tools listed with input schemas, a command run, a file written
 * and read, a checkpoint, a rollback and its report.
 */
import test from 'ava';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import fs from 'node:fs';
import path from 'node:path';
import { eventually, integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';

// Until `mcp` is merged into src/cli/main.ts this runs the same handler
// through a fixture; then it becomes bin/lockstep.js.
const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));

async function connect(
  t: { teardown: (fn: () => Promise<void>) => void },
  home: string,
  args: string[] = [],
  env: Record<string, string> = {},
): Promise<{ client: Client; transport: StdioClientTransport }> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI, 'mcp', ...args],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LOCKSTEP_HOME: home, LOCKSTEP_LOG_LEVEL: 'warn', ...env },
    stderr: 'inherit',
  });
  const client = new Client({ name: 'lockstep-test', version: '0.0.0' });
  await client.connect(transport);
  t.teardown(() => client.close());
  return { client, transport };
}

/** Calls a tool and parses its JSON text; fails the test on a tool error unless `error` is set. */
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
    'an MCP client runs commands, writes and reads files, checkpoints and rolls back; the sandbox it got is removed when it leaves',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await connect(t, ls.home, ['--image', 'base']);
      t.is(ls.list().length, 1);
      const id = ls.list()[0]!.id;
      t.true(client.getInstructions()?.includes(id));

      const { tools } = await client.listTools();
      const names = tools.map((x) => x.name).sort();
      t.deepEqual(names, [
        'checkpoint',
        'close_port',
        'create_snapshot',
        'delete_snapshot',
        'expose_port',
        'fork',
        'kill_process',
        'list_checkpoints',
        'list_files',
        'list_ports',
        'list_processes',
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
        'start_process',
        'wait_process',
        'write_file',
      ]);
      for (const tool of tools) {
        t.is(tool.inputSchema.type, 'object', tool.name);
        t.truthy(tool.description, tool.name);
      }
      const runSchema = tools.find((x) => x.name === 'run_command')!.inputSchema;
      t.deepEqual(runSchema.required, ['cmd']);
      t.truthy(runSchema.properties?.cwd);

      const ran = await call(client, 'run_command', { cmd: 'echo hello from mcp; echo err >&2; exit 2' });
      t.like(ran, { exitCode: 2, stdout: 'hello from mcp\n', stderr: 'err\n' });
      t.regex(ran.observationId, /^obs_/);
      t.is(
        (await call(client, 'run_command', { cmd: ['sh', '-c', 'echo "$A"'], envs: { A: 'argv' }, cwd: '/tmp' }))
          .stdout,
        'argv\n',
      );

      const written = await call(client, 'write_file', { path: 'plan.md', content: '# plan v1\n' });
      t.like(written, { path: 'plan.md', bytes: 10 });
      const read = await call(client, 'read_file', { path: '/workspace/plan.md' });
      t.like(read, { content: '# plan v1\n', encoding: 'utf8', sha256: written.sha256 });
      t.deepEqual(
        (await call(client, 'list_files', {})).entries.map((e: { name: string }) => e.name),
        ['plan.md'],
      );

      const context = { format: 'openai-chat', messages: [{ role: 'user', content: 'Write the plan.' }] };
      const ck = await call(client, 'checkpoint', { label: 'plan v1', context });
      t.regex(ck.id, /^ckpt_/);
      t.deepEqual(
        (await call(client, 'list_checkpoints')).map((c: { id: string }) => c.id),
        [ck.id],
      );

      // The attempt that goes wrong.
      await call(client, 'write_file', { path: 'plan.md', content: '# plan v2, broken\n' });
      const looked = await call(client, 'run_command', { cmd: 'cat plan.md' });
      const e1 = await call(client, 'record_effect', {
        kind: 'ticket.create',
        input: { title: 'Plan' },
        key: 'ticket-1',
        output: { ticket: 42 },
      });
      t.like(e1, { replayed: false, status: 'committed' });
      const e2 = await call(client, 'record_effect', {
        kind: 'ticket.create',
        input: { title: 'Plan' },
        key: 'ticket-1',
        output: { ticket: 43 },
      });
      t.deepEqual(e2, { replayed: true, effectId: e1.effectId, output: { ticket: 42 } });

      const report = await call(client, 'rollback', {
        checkpointId: ck.id,
        failure: 'v2 broke the plan',
        lessons: ['keep the heading'],
      });
      t.is(report.checkpointId, ck.id);
      t.deepEqual(report.context, context);
      t.true(report.staleObservations.some((o: { id: string }) => o.id === looked.observationId));
      t.deepEqual(
        report.effectsAfter.map((e: { id: string }) => e.id),
        [e1.effectId],
      );
      t.true(report.recoverySummary.text.includes('v2 broke the plan'));
      t.true(JSON.stringify(report.contextWithRecovery.messages.at(-1)).includes('keep the heading'));
      t.is((await call(client, 'read_file', { path: 'plan.md' })).content, '# plan v1\n');
      // After the rollback the effect is still known: a retry is replayed, not repeated.
      t.like(
        await call(client, 'record_effect', { kind: 'ticket.create', input: { title: 'Plan' }, key: 'ticket-1' }),
        { replayed: true, output: { ticket: 42 } },
      );

      const forked = await call(client, 'fork', { checkpointId: ck.id, count: 1 });
      t.is(forked.ids.length, 1);
      t.is(ls.get(forked.ids[0]).info().forkedFrom, ck.id);
      // One result per fork, in order.
      t.deepEqual(forked.results, [{ id: forked.ids[0] }]);

      // Errors come back as tool errors with the API's error body.
      t.like(await call(client, 'read_file', { path: 'nope.txt' }, { error: true }), {
        error: { code: 'FILE_NOT_FOUND', field: 'path' },
      });
      t.like(await call(client, 'read_file', { path: '../../../etc/shadow' }, { error: true }), {
        error: { code: 'PATH_ESCAPES_SANDBOX' },
      });
      t.like(await call(client, 'rollback', { checkpointId: 'ckpt_missing' }, { error: true }), {
        error: { code: 'CHECKPOINT_NOT_FOUND' },
      });
      const badInput = (await client.callTool({ name: 'run_command', arguments: { cmd: 5 } })) as {
        isError?: boolean;
        content: { text: string }[];
      };
      t.true(badInput.isError);
      t.regex(badInput.content[0]!.text, /cmd/);

      await client.close();
      // The server removes what it created: the sandbox and its fork.
      await eventually(() => ls.list().length === 0, 15_000, 50);
      t.deepEqual(ls.list(), []);
    },
  );

  test.serial('a snapshot goes into the snapshot store and comes back as a new one, through MCP tools', async (t) => {
    const ls = await openTestLockstep(t);
    const store = path.join(TEST_ROOT, `mcp-store-${process.pid}-${Date.now()}`);
    t.teardown(async () => fs.rmSync(store, { recursive: true, force: true }));
    const { client } = await connect(t, ls.home, ['--image', 'base'], { LOCKSTEP_SNAPSHOT_STORE: store });
    await call(client, 'write_file', { path: 'kept.txt', content: 'via mcp\n' });
    const ck = await call(client, 'checkpoint', { label: 'to store' });
    const snap = await call(client, 'create_snapshot', { checkpointId: ck.id, name: 'mcp-snap' });
    const pushed = await call(client, 'push_snapshot', { snapshot: 'mcp-snap' });
    t.like(pushed, { key: 'mcp-snap', snapshotId: snap.id, skippedChunks: 0 });
    t.true(pushed.uploadedChunks > 0);
    t.deepEqual(
      (await call(client, 'list_stored_snapshots')).map((b: { name: string; digest: string }) => [b.name, b.digest]),
      [['mcp-snap', pushed.digest]],
    );
    const pulled = await call(client, 'pull_snapshot', { key: 'mcp-snap', name: 'mcp-copy' });
    t.like(pulled.snapshot, { name: 'mcp-copy', lineageId: snap.lineageId });
    t.like(await call(client, 'pull_snapshot', { key: 'missing' }, { error: true }), {
      error: { code: 'BUNDLE_NOT_FOUND' },
    });
    t.like(await call(client, 'pull_snapshot', { key: 'mcp-snap' }, { error: true }), {
      error: { code: 'SNAPSHOT_EXISTS' },
    });
    // The copy starts a sandbox with the file it was pushed with.
    const started = await ls.create({ fromSnapshot: pulled.snapshot.id });
    t.teardown(() => ls.remove(started.id).catch(() => undefined));
    t.is((await started.files.read('/workspace/kept.txt')).content.toString(), 'via mcp\n');
  });

  test.serial('attached to an existing sandbox, the MCP server leaves it running', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create({ memoryMb: 64 });
    await sb.files.write('/workspace/existing.txt', 'was here before');
    const { client, transport } = await connect(t, ls.home, ['--sandbox', sb.id]);
    t.is((await call(client, 'read_file', { path: 'existing.txt' })).content, 'was here before');
    t.is((await call(client, 'run_command', { cmd: 'hostname' })).exitCode, 0);
    const pid = transport.pid;
    await client.close();
    await eventually(
      () => {
        try {
          process.kill(pid!, 0);
          return false;
        } catch {
          return true;
        }
      },
      10_000,
      50,
    );
    t.is(ls.get(sb.id).info().state, 'running');
    t.is((await sb.commands.run('cat /workspace/existing.txt')).stdout, 'was here before');
  });

  test.serial('a sandbox id that does not exist fails at start with SANDBOX_NOT_FOUND', async (t) => {
    const ls = await openTestLockstep(t);
    const { execFile } = await import('node:child_process');
    const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = execFile(
        process.execPath,
        [CLI, 'mcp', '--sandbox', 'sbx_missing'],
        { env: { ...process.env, LOCKSTEP_HOME: ls.home } },
        (err, stdout, stderr) =>
          resolve({ code: child.exitCode ?? (err as { code?: number } | null)?.code ?? 0, stdout, stderr }),
      );
      child.stdin?.end();
    });
    t.is(r.code, 3);
    t.regex(r.stderr, /No sandbox with id "sbx_missing"/);
    t.is(r.stdout, '', 'nothing but protocol on stdout');
  });
});
