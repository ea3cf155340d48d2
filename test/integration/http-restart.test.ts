/**
 * Shutdown and restart of the HTTP server: `lockstep serve` as a real
 * process. SIGTERM lets in-flight work finish (and aborts what is still
 * running past the deadline); sandboxes outlive the server, and a new one
 * on the same state directory serves them again.
 */
import test from 'ava';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { ApiClient, startServer, tenantToken } from '../fixtures/http-client.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));
const run = promisify(execFile);

interface Served {
  child: ChildProcess;
  url: string;
  exit: Promise<number | null>;
}

/** Starts `lockstep serve --port 0 --json` on a state directory and waits for its address. */
async function serve(t: { teardown: (fn: () => void) => void }, home: string, args: string[] = []): Promise<Served> {
  const child = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--json', ...args], {
    env: { ...process.env, LOCKSTEP_HOME: home, LOCKSTEP_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  let out = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      out += b.toString();
      try {
        resolve((JSON.parse(out) as { url: string }).url);
      } catch {
        /* not all of it yet */
      }
    });
    void exit.then((code) => reject(new Error(`serve exited with ${code} before listening: ${out}`)));
  });
  return { child, url, exit };
}

/** Reads an NDJSON stream, calling onEvent for each event as it arrives. */
async function readEvents(res: Response, onEvent: (e: Record<string, any>) => void): Promise<Record<string, any>[]> {
  const reader = res.body!.getReader();
  const events: Record<string, any>[] = [];
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += Buffer.from(value).toString();
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      const e = JSON.parse(line) as Record<string, any>;
      events.push(e);
      onEvent(e);
    }
  }
  return events;
}

function streamCommand(api: ApiClient, id: string, cmd: string): Promise<Response> {
  return fetch(`${api.base}/v1/sandboxes/${id}/commands`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${api.token}`,
      'content-type': 'application/json',
      accept: 'application/x-ndjson',
    },
    body: JSON.stringify({ cmd }),
  });
}

integration(test, () => {
  test.serial(
    'SIGTERM drains in-flight work and exits 0; a restarted server serves the same, still running sandbox',
    async (t) => {
      const ls = await openTestLockstep(t);
      const env = { ...process.env, LOCKSTEP_HOME: ls.home, LOCKSTEP_LOG_LEVEL: 'warn' };
      const added = await run(process.execPath, [CLI, 'tenant', 'add', 'acme', '--max-sandboxes', '5', '--json'], {
        env,
      });
      const { token, name, maxSandboxes } = JSON.parse(added.stdout) as {
        token: string;
        name: string;
        maxSandboxes: number;
      };
      t.is(name, 'acme');
      t.is(maxSandboxes, 5);
      const listed = JSON.parse((await run(process.execPath, [CLI, 'tenant', 'ls', '--json'], { env })).stdout) as {
        name: string;
      }[];
      t.deepEqual(
        listed.map((x) => x.name),
        ['acme'],
      );

      const s1 = await serve(t, ls.home);
      const api1 = new ApiClient(s1.url, token);
      const created = await api1.post('/v1/sandboxes', { memoryMb: 64 });
      t.is(created.status, 201, created.text);
      const id: string = created.body.id;
      // The init's host pid is the operator's: the library has it, the API does not show it.
      const initPid = ls.get(id).info().pid;
      t.true(Number.isInteger(initPid));
      t.false('pid' in created.body, 'no host pid in the API answer');
      await api1.put(`/v1/sandboxes/${id}/files?path=kept.txt`, { content: 'survives restarts' });
      // A process of the sandbox that counts, to show the sandbox keeps running without a server.
      const bg = await api1.post(`/v1/sandboxes/${id}/commands`, {
        cmd: 'i=0; while true; do i=$((i+1)); echo $i > /workspace/counter; sleep 0.05; done',
        background: true,
      });
      t.is(bg.status, 200, bg.text);

      // A command in flight when SIGTERM arrives runs to its end.
      const res = await streamCommand(
        api1,
        id,
        'echo started; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo finished',
      );
      let signalled = false;
      const events = await readEvents(res, (e) => {
        if (e.type === 'stdout' && e.data === 'started\n' && !signalled) {
          signalled = true;
          s1.child.kill('SIGTERM');
          void (async () => {
            // Once the signal has landed, /healthz stops answering 200...
            await eventually(
              async () =>
                (await fetch(`${s1.url}/healthz`).then(
                  (r) => r.status,
                  () => 0,
                )) !== 200,
              5000,
              10,
            );
            // ...and new work is refused (503 on a kept-alive connection, or the port is closed).
            const refused = await api1
              .post('/v1/sandboxes', { memoryMb: 64 })
              .catch(() => ({ status: 'closed' as const }));
            t.true(
              refused.status === 503 || refused.status === 'closed',
              `new request while draining: ${JSON.stringify(refused.status)}`,
            );
            // Let the in-flight command finish, from outside the server.
            ls.get(id).files.write('/workspace/go', '');
          })();
        }
      });
      t.true(signalled);
      t.is(
        events
          .filter((e) => e.type === 'stdout')
          .map((e) => e.data)
          .join(''),
        'started\nfinished\n',
      );
      t.like(events.at(-1), { type: 'result', exitCode: 0 });
      t.is(await s1.exit, 0);
      t.is(ls.get(id).info().state, 'running', 'the sandbox outlives its server');

      const s2 = await serve(t, ls.home);
      const api2 = new ApiClient(s2.url, token);
      const info = await api2.get(`/v1/sandboxes/${id}`);
      t.is(info.status, 200);
      t.is(info.body.id, id);
      t.is(ls.get(id).info().pid, initPid, 'the same init, not a new sandbox');
      const read = async () =>
        Number((await api2.post(`/v1/sandboxes/${id}/commands`, { cmd: 'cat /workspace/counter' })).body.stdout);
      const c1 = await read();
      await eventually(async () => (await read()) > c1, 5000, 50);
      t.is(
        (await api2.post(`/v1/sandboxes/${id}/commands`, { cmd: 'cat /workspace/kept.txt' })).body.stdout,
        'survives restarts',
      );
      t.deepEqual(
        (await api2.get('/v1/sandboxes')).body.map((s: { id: string }) => s.id),
        [id],
      );
      s2.child.kill('SIGTERM');
      t.is(await s2.exit, 0);

      // The tenant cannot be removed while it has sandboxes, unless forced.
      const refused = await run(process.execPath, [CLI, 'tenant', 'rm', 'acme'], { env }).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e,
      );
      t.truthy(refused);
      t.not(refused!.code, 0);
      t.regex(refused!.stderr, /Tenant acme still has 1 sandbox/);
      t.deepEqual(
        JSON.parse((await run(process.execPath, [CLI, 'tenant', 'rm', 'acme', '--force', '--json'], { env })).stdout),
        { name: 'acme', removed: true },
      );
      t.deepEqual(JSON.parse((await run(process.execPath, [CLI, 'tenant', 'ls', '--json'], { env })).stdout), []);
    },
  );

  test.serial('past the shutdown deadline, operations still running are aborted cleanly', async (t) => {
    const ls = await openTestLockstep(t);
    const token = tenantToken(ls, 'acme');
    const s = await serve(t, ls.home, ['--grace-ms', '300']);
    const api = new ApiClient(s.url, token);
    const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;

    const res = await streamCommand(api, id, 'echo started; exec sleep 120');
    const events = await readEvents(res, (e) => {
      if (e.type === 'stdout') s.child.kill('SIGTERM');
    });
    t.deepEqual(events[0], { type: 'stdout', data: 'started\n' });
    t.like(events.at(-1), { type: 'error', error: { code: 'COMMAND_ABORTED' } });
    t.is(await s.exit, 0);
    // The aborted command is gone from the sandbox; the sandbox is fine.
    const sb = ls.get(id);
    t.is(sb.info().state, 'running');
    const ps = await sb.commands.run('ps -eo args | grep -c "^sleep 120" || true');
    t.is(ps.stdout.trim(), '0');
    const ck = await sb.checkpoint({ label: 'after shutdown' });
    t.is(sb.checkpoints().at(-1)!.id, ck.id);
  });

  test.serial('shutdown() waits for an in-flight checkpoint and rollback, then closes', async (t) => {
    const ls = await openTestLockstep(t);
    const { app, client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const base = (await api.post(`/v1/sandboxes/${id}/checkpoints`, { label: 'base' })).body.id as string;

    // Wait (by time, not by a count of event-loop turns) until one of the two
    // is in flight, then shut down while it still is.
    const ck = api.post(`/v1/sandboxes/${id}/checkpoints`, { label: 'during shutdown' });
    const rb = api.post(`/v1/sandboxes/${id}/rollback`, { checkpointId: base });
    const deadline = Date.now() + 10_000;
    while (app.operations.size === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 1));
    t.true(app.operations.size > 0, 'an operation was in flight');
    const report = await app.shutdown({ graceMs: 30_000 });
    t.deepEqual(report, { aborted: [], abandoned: [] });
    const [ckRes, rbRes] = await Promise.all([ck, rb.catch(() => undefined)]);
    t.is(ckRes.status, 201, ckRes.text);
    t.true(
      ls
        .get(id)
        .checkpoints()
        .some((c) => c.id === ckRes.body.id),
      'the checkpoint committed',
    );
    // The rollback either ran to its end or was refused before it began.
    if (rbRes) t.true(rbRes.status === 200 || rbRes.status === 503, rbRes.text);
    t.is(ls.get(id).info().state, 'running');
  });
});
