/**
 * Issue 23, "stalling the manager": what one tenant's sandbox or requests
 * did to make the manager busy for everyone. Each test performs the attack
 * against a real manager (real sandboxes, the real HTTP server on loopback)
 * and checks that it is refused or bounded while another tenant's request
 * still answers exactly. Latencies and CPU time are logged, never asserted.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { eventually, integration, openTestLockstep, sleep } from '../helpers/harness.js';
import { startServer, tenantToken, type ApiClient } from '../fixtures/http-client.js';
import { COMMAND_ROUTE_LIMITS } from '../../src/http/context.js';
import { MAX_OUTPUT_ENTRIES_LISTED } from '../../src/instances/background-output.js';
import { MAX_PTY_ENTRIES_LISTED } from '../../src/api/sandbox-pty.js';
import { MAX_TCP_TABLE_BYTES, outsideConnections } from '../../src/network/connections.js';
import type { Lockstep } from '../../src/api/lockstep.js';

const RANGE = '10.239.0.0/24';

/** Timed GET; the body text and how long it took. */
async function timedGet(c: ApiClient, path: string): Promise<{ status: number; text: string; ms: number }> {
  const t0 = performance.now();
  const r = await c.get(path);
  return { status: r.status, text: r.text, ms: Math.round(performance.now() - t0) };
}

/** A POST whose client gives up after ms (the abort closes the connection). */
async function abandonedPost(base: string, token: string, path: string, body: unknown, ms: number): Promise<string> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), ms);
  try {
    const r = await fetch(base + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: ac.signal,
    });
    return `answered ${r.status}: ${await r.text()}`;
  } catch (e) {
    return (e as Error).name;
  } finally {
    clearTimeout(timer);
  }
}

/** CPU time (user + system, ms) this process used over ms. */
async function cpuOver(ms: number): Promise<number> {
  const before = process.cpuUsage();
  await sleep(ms);
  const d = process.cpuUsage(before);
  return Math.round((d.user + d.system) / 1000);
}

let ls: Lockstep;
const teardowns: (() => Promise<void>)[] = [];

integration(test, () => {
  test.before(async () => {
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { images: ['base', 'dev'], open: { config: { networkRange: RANGE } } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  test.serial(
    'finding 1: abandoned waits stop at once (no watch left, manager idle), waits past the per-tenant cap get 429 RATE_LIMITED with Retry-After, and another tenant lists exactly',
    async (t) => {
      const { client } = await startServer(t, ls);
      const tokenA = tenantToken(ls, 'stall-waits-a');
      const a = client.as(tokenA);
      const b = client.as(tenantToken(ls, 'stall-waits-b'));
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const sb: string = (await b.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const bList = await timedGet(b, '/v1/sandboxes');
      t.is(bList.status, 200);
      t.true(bList.text.includes(sb));

      // A wait that ends normally still reports the command's exit code.
      const quick = await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'sleep 0.3; exit 3', background: true });
      t.is(quick.status, 200, quick.text);
      const done = await a.post(`/v1/sandboxes/${sa}/commands/${quick.body.pid}/wait`, { timeoutMs: 30_000 });
      t.deepEqual(done.body, { pid: quick.body.pid, exitCode: 3 });

      const long = await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'sleep 600', background: true });
      t.is(long.status, 200, long.text);
      const idle = await cpuOver(2000);

      // The attack: 40 waits (on the command and on pid 1) dropped by the client after 1 s.
      const N = 40;
      const dropped = await Promise.all(
        Array.from({ length: N }, (_, i) =>
          abandonedPost(
            client.base,
            tokenA,
            `/v1/sandboxes/${sa}/commands/${i % 2 ? 1 : long.body.pid}/wait`,
            {},
            1000,
          ),
        ),
      );
      t.deepEqual(new Set(dropped), new Set(['AbortError']), 'every wait was still waiting when its client left');
      await eventually(() => ls.engine.exits.size === 0, 10_000).catch(() => undefined);
      t.is(ls.engine.exits.size, 0, 'every abandoned wait gave its pidfd watch back');
      const after = await cpuOver(2000);
      t.log(`manager CPU over 2 s: ${idle} ms idle before, ${after} ms after ${N} abandoned waits`);
      const bDuring = await timedGet(b, '/v1/sandboxes');
      t.is(bDuring.status, 200);
      t.is(bDuring.text, bList.text, "tenant B's listing is byte for byte the same");
      t.log(`tenant B GET /v1/sandboxes: ${bList.ms} ms before, ${bDuring.ms} ms after`);

      // The per-tenant cap: that many waits in flight, the next one refused at once.
      const cap = COMMAND_ROUTE_LIMITS.waits.perTenant;
      const holders = Array.from({ length: cap }, () => new AbortController());
      const held = holders.map((ac) =>
        fetch(`${client.base}/v1/sandboxes/${sa}/commands/${long.body.pid}/wait`, {
          method: 'POST',
          headers: { authorization: `Bearer ${tokenA}`, 'content-type': 'application/json' },
          body: JSON.stringify({ timeoutMs: 60_000 }),
          signal: ac.signal,
        }).catch((e: Error) => e.name),
      );
      await eventually(() => ls.engine.exits.size === cap, 20_000).catch(() => undefined);
      t.is(ls.engine.exits.size, cap, `${cap} waits are in flight`);
      const refused = await a.post(`/v1/sandboxes/${sa}/commands/${long.body.pid}/wait`, { timeoutMs: 1000 });
      t.is(refused.status, 429, refused.text);
      t.is(refused.body.error.code, 'RATE_LIMITED');
      t.truthy(refused.headers.get('retry-after'), 'a refusal says when to retry');
      // Another tenant is not refused: its wait is admitted (and times out, its command running on).
      const bCmd = await b.post(`/v1/sandboxes/${sb}/commands`, { cmd: 'sleep 600', background: true });
      const bWait = await b.post(`/v1/sandboxes/${sb}/commands/${bCmd.body.pid}/wait`, { timeoutMs: 200 });
      t.is(bWait.status, 504, bWait.text);
      t.is(bWait.body.error.code, 'COMMAND_TIMEOUT');
      t.is((await timedGet(b, '/v1/sandboxes')).text, bList.text);

      for (const ac of holders) ac.abort();
      t.deepEqual(new Set(await Promise.all(held)), new Set(['AbortError']));
      await eventually(() => ls.engine.exits.size === 0, 10_000).catch(() => undefined);
      t.is(ls.engine.exits.size, 0, 'the held waits gave their watches back');
      // Their places are free again: a new wait is admitted.
      const again = await a.post(`/v1/sandboxes/${sa}/commands/${long.body.pid}/wait`, { timeoutMs: 200 });
      t.is(again.status, 504, again.text);
    },
  );

  test.serial(
    'foreground commands in flight are capped per tenant: the next one is refused with RATE_LIMITED, another tenant runs exactly, and an ended command frees its place',
    async (t) => {
      const { client } = await startServer(t, ls);
      const tokenA = tenantToken(ls, 'stall-cmd-a');
      const a = client.as(tokenA);
      const b = client.as(tenantToken(ls, 'stall-cmd-b'));
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 256, pids: 1024 })).body.id;
      const sb: string = (await b.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const cap = COMMAND_ROUTE_LIMITS.commands.perTenant;
      const holders = Array.from({ length: cap }, () => new AbortController());
      const held = holders.map((ac) =>
        fetch(`${client.base}/v1/sandboxes/${sa}/commands`, {
          method: 'POST',
          headers: { authorization: `Bearer ${tokenA}`, 'content-type': 'application/json' },
          body: JSON.stringify({ cmd: 'sleep 120', timeoutMs: 120_000 }),
          signal: ac.signal,
        }).catch((e: Error) => e.name),
      );
      // Every holder is admitted once its sleep runs in the sandbox.
      // How many sleeps run in the sandbox (busybox has no pgrep -c: count /proc's comm files).
      const sleeping = async () =>
        Number(
          (
            await ls.get(sa).commands.run('cat /proc/[0-9]*/comm 2>/dev/null | grep -c "^sleep$" || true')
          ).stdout.trim(),
        );
      await eventually(async () => (await sleeping()) === cap, 60_000, 200).catch(() => undefined);
      t.is(await sleeping(), cap, `${cap} commands run`);
      const refused = await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'echo never' });
      t.is(refused.status, 429, refused.text);
      t.is(refused.body.error.code, 'RATE_LIMITED');
      t.truthy(refused.headers.get('retry-after'), 'a refusal says when to retry');
      const t0 = performance.now();
      const other = await b.post(`/v1/sandboxes/${sb}/commands`, { cmd: 'printf "%s" exact-bytes' });
      t.log(`tenant B's command while A holds ${cap}: ${Math.round(performance.now() - t0)} ms`);
      t.is(other.status, 200, other.text);
      t.is(other.body.stdout, 'exact-bytes');

      // A client that goes away stops its command and gives its place back.
      holders[0]!.abort();
      await eventually(async () => (await sleeping()) === cap - 1, 20_000, 100).catch(() => undefined);
      t.is(await sleeping(), cap - 1, 'the abandoned command was stopped');
      const admitted = await a.post(`/v1/sandboxes/${sa}/commands`, { cmd: 'echo admitted' });
      t.is(admitted.status, 200, admitted.text);
      t.is(admitted.body.stdout, 'admitted\n');
      for (const ac of holders) ac.abort();
      t.deepEqual(new Set(await Promise.all(held)), new Set(['AbortError']));
    },
  );

  test.serial(
    'PTY output streams are capped per tenant: the next one is refused with RATE_LIMITED, another tenant streams, and a closed stream frees its place',
    async (t) => {
      const { client } = await startServer(t, ls);
      const tokenA = tenantToken(ls, 'stall-pty-a');
      const tokenB = tenantToken(ls, 'stall-pty-b');
      const a = client.as(tokenA);
      const b = client.as(tokenB);
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 128 })).body.id;
      const sb: string = (await b.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      // Each prints first: a stream's answer starts with the transcript's first bytes.
      const ptyA = await a.post(`/v1/sandboxes/${sa}/pty`, {
        cols: 80,
        rows: 24,
        cmd: ['sh', '-c', 'echo a; sleep 600'],
      });
      t.is(ptyA.status, 200, ptyA.text);
      const ptyB = await b.post(`/v1/sandboxes/${sb}/pty`, {
        cols: 80,
        rows: 24,
        cmd: ['sh', '-c', 'echo ready; sleep 600'],
      });
      t.is(ptyB.status, 200, ptyB.text);
      const open = (token: string, id: string, pid: number, signal: AbortSignal) =>
        fetch(`${client.base}/v1/sandboxes/${id}/pty/${pid}/stream`, {
          headers: { authorization: `Bearer ${token}` },
          signal,
        });
      const cap = COMMAND_ROUTE_LIMITS.streams.perTenant;
      const holders = Array.from({ length: cap }, () => new AbortController());
      const streams = await Promise.all(
        holders.map((ac) => open(tokenA, sa, ptyA.body.pid, AbortSignal.any([ac.signal, AbortSignal.timeout(30_000)]))),
      );
      t.deepEqual(new Set(streams.map((r) => r.status)), new Set([200]), `${cap} streams open`);
      const refused = await open(tokenA, sa, ptyA.body.pid, AbortSignal.timeout(10_000));
      t.is(refused.status, 429, await refused.text());
      t.truthy(refused.headers.get('retry-after'), 'a refusal says when to retry');

      // Another tenant streams its PTY's output, exactly.
      const acB = new AbortController();
      const other = await open(tokenB, sb, ptyB.body.pid, AbortSignal.any([acB.signal, AbortSignal.timeout(20_000)]));
      t.is(other.status, 200);
      const reader = other.body!.getReader();
      let text = '';
      // Bounded by the request's 20 s timeout signal: a read past it rejects.
      while (!text.includes('"type":"data"')) {
        const { value, done } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString();
      }
      const first = JSON.parse(text.split('\n')[0]!) as { type: string; data: string };
      t.is(first.type, 'data');
      t.regex(Buffer.from(first.data, 'base64').toString(), /ready/);
      acB.abort();

      // A client that closes its stream gives its place back.
      holders[0]!.abort();
      let again: Response | undefined;
      await eventually(
        async () => {
          again = await open(
            tokenA,
            sa,
            ptyA.body.pid,
            holders[0]!.signal.aborted ? new AbortController().signal : holders[0]!.signal,
          );
          if (again.status !== 200) await again.text();
          return again.status === 200;
        },
        10_000,
        100,
      ).catch(() => undefined);
      t.is(again?.status, 200, 'a place came free');
      await again?.body?.cancel();
      for (const ac of holders) ac.abort();
    },
  );

  test.serial(
    'a program whose last await is a wait gets its exit code: a pending wait keeps the event loop alive',
    async (t) => {
      const script = fileURLToPath(new URL('../../../test/fixtures/wait-last.mjs', import.meta.url));
      const { stdout, code } = await new Promise<{ stdout: string; code: number | null }>((resolve, reject) => {
        const child = spawn(process.execPath, [script, ls.home], { stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        child.stdout.on('data', (b: Buffer) => (out += b.toString()));
        const timer = setTimeout(() => {
          child.kill('SIGKILL');
          reject(new Error(`wait-last.mjs did not end within 60 s: ${out}`));
        }, 60_000);
        child.on('exit', (c) => {
          clearTimeout(timer);
          resolve({ stdout: out, code: c });
        });
      });
      t.is(stdout, 'exit 7\n');
      t.is(code, 0);
    },
  );

  test.serial(
    'finding 4: 20k planted <n>.stdout files: a background start, its output and wait answer exactly, and the listing reads a bounded part of the folder',
    async (t) => {
      const { client } = await startServer(t, ls);
      const a = client.as(tenantToken(ls, 'stall-out-a'));
      const b = client.as(tenantToken(ls, 'stall-out-b'));
      const sa: string = (await a.post('/v1/sandboxes', { memoryMb: 128, image: 'dev' })).body.id;
      await b.post('/v1/sandboxes', { memoryMb: 64 });
      const bList = await timedGet(b, '/v1/sandboxes');

      const PLANTED = 20_000;
      const plant = await a.post(`/v1/sandboxes/${sa}/commands`, {
        cmd: [
          'python3',
          '-c',
          `import os\nos.makedirs('/run/lockstep/out', exist_ok=True)\nfor i in range(${PLANTED}):\n    open('/run/lockstep/out/%d.stdout' % (500000 + i), 'w').close()\nprint(len(os.listdir('/run/lockstep/out')))`,
        ],
        timeoutMs: 120_000,
      });
      t.is(plant.status, 200, plant.text);
      t.true(Number(plant.body.stdout.trim()) >= PLANTED, plant.text);

      const t0 = performance.now();
      const started = await a.post(`/v1/sandboxes/${sa}/commands`, {
        cmd: 'printf "hello from %s" bg; printf oops >&2',
        background: true,
      });
      const startMs = Math.round(performance.now() - t0);
      t.is(started.status, 200, started.text);
      const pid: number = started.body.pid;
      const waited = await a.post(`/v1/sandboxes/${sa}/commands/${pid}/wait`, { timeoutMs: 30_000 });
      t.deepEqual(waited.body, { pid, exitCode: 0 });
      const t1 = performance.now();
      const out = await a.get(`/v1/sandboxes/${sa}/commands/${pid}/output`);
      const outputMs = Math.round(performance.now() - t1);
      t.is(out.status, 200, out.text);
      t.like(out.body, { pid, stdout: 'hello from bg', stderr: 'oops', running: false, rewound: false });

      const t2 = performance.now();
      const list = await a.get(`/v1/sandboxes/${sa}/commands`);
      const listMs = Math.round(performance.now() - t2);
      t.is(list.status, 200, list.text);
      const rows = list.body as { pid: number; running: boolean; exitCode: number | null }[];
      t.true(rows.length > 0 && rows.length <= MAX_OUTPUT_ENTRIES_LISTED, `${rows.length} rows`);
      // Planted names are no commands that run; ours, if among the entries read, is exact.
      for (const r of rows)
        if (r.pid !== pid) t.deepEqual(r, { pid: r.pid, running: false, exitCode: null });
        else t.deepEqual(r, { pid, running: false, exitCode: 0 });
      t.log(
        `with ${PLANTED} planted files: start ${startMs} ms, output ${outputMs} ms, list ${listMs} ms (${rows.length} rows)`,
      );
      const bDuring = await timedGet(b, '/v1/sandboxes');
      t.is(bDuring.text, bList.text, "tenant B's listing is byte for byte the same");
      t.log(`tenant B GET /v1/sandboxes: ${bList.ms} ms before, ${bDuring.ms} ms after`);
    },
  );

  test.serial(
    '20k planted files in the PTY folder: a PTY starts, is reattached by id and listed; the listing reads a bounded part of the folder',
    async (t) => {
      const sb = await ls.create({ memoryMb: 128, image: 'dev' });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const PLANTED = 20_000;
      const plant = await sb.commands.run(
        [
          'python3',
          '-c',
          `import os\nos.makedirs('/run/lockstep/pty', exist_ok=True)\nfor i in range(${PLANTED}):\n    open('/run/lockstep/pty/%d.out' % (700000 + i), 'w').close()\nprint(len(os.listdir('/run/lockstep/pty')))`,
        ],
        { timeoutMs: 120_000 },
      );
      t.true(Number(plant.stdout.trim()) >= PLANTED, plant.stdout + plant.stderr);
      const t0 = performance.now();
      const pty = await sb.pty.create({ cols: 80, rows: 24, cmd: ['sh', '-c', 'echo pty-ready; sleep 600'] });
      const startMs = Math.round(performance.now() - t0);
      const again = await sb.pty.connect(pty.pid);
      t.is(again.pid, pty.pid);
      await t.throwsAsync(sb.pty.connect(999_999_999), { code: 'INVALID_ARGUMENT' });
      const t1 = performance.now();
      const listed = await sb.pty.list();
      const listMs = Math.round(performance.now() - t1);
      t.true(listed.length <= MAX_PTY_ENTRIES_LISTED, `${listed.length} PTYs listed from a bounded read`);
      t.log(`with ${PLANTED} planted files: PTY start ${startMs} ms, list ${listMs} ms (${listed.length} rows)`);
      await pty.kill();
    },
  );

  test.serial(
    'finding 5: a rollback of a sandbox holding thousands of TCP sockets succeeds, reads the table off the event loop and at most MAX_TCP_TABLE_BYTES of it',
    async (t) => {
      const sb = await ls.create({ image: 'dev', network: 'egress', memoryMb: 256 });
      t.teardown(() => sb.kill().catch(() => undefined));
      await sb.files.write('/workspace/mark.txt', 'before');
      const ck = await sb.checkpoint({ label: 'before-sockets' });
      await sb.files.write('/workspace/mark.txt', 'after');

      // 4000 loopback connections: 8000 sockets and the listener, past the bound.
      const CONNS = 4000;
      await sb.files.write(
        '/workspace/sockets.py',
        [
          'import resource, socket, time',
          'hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]',
          'resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))',
          'srv = socket.socket(); srv.bind(("127.0.0.1", 7777)); srv.listen(4096)',
          'keep = []',
          `for i in range(${CONNS}):`,
          '    c = socket.create_connection(("127.0.0.1", 7777)); s, _ = srv.accept(); keep += [c, s]',
          'open("/workspace/sockets.ready", "w").write(str(len(keep)))',
          'time.sleep(600)',
        ].join('\n'),
      );
      await sb.commands.spawn(['python3', '/workspace/sockets.py'], { stderrPath: '/workspace/sockets.err' });
      const ready = await eventually(
        async () => {
          if (await sb.files.exists('/workspace/sockets.ready'))
            return (await sb.files.read('/workspace/sockets.ready')).content.toString();
          if (await sb.files.exists('/workspace/sockets.err')) {
            const err = (await sb.files.read('/workspace/sockets.err')).content.toString();
            if (err.includes('Error')) throw new Error(`sockets.py failed: ${err}`);
          }
          throw new Error('the sockets are not open yet');
        },
        120_000,
        200,
      );
      t.is(ready, String(2 * CONNS));

      const row = ls.engine.catalog.sandbox(sb.id)!;
      const table = await outsideConnections(row.init_pid);
      t.true(table.truncated, `more than ${MAX_TCP_TABLE_BYTES} bytes of table`);
      t.deepEqual(table.connections, [], 'loopback connections are not outside ones');

      const h = monitorEventLoopDelay({ resolution: 10 });
      h.enable();
      const t0 = performance.now();
      const report = await sb.rollback(ck.id);
      const ms = Math.round(performance.now() - t0);
      h.disable();
      t.deepEqual(report.connectionsReset, []);
      t.is((await sb.files.read('/workspace/mark.txt')).content.toString(), 'before');
      t.false(await sb.files.exists('/workspace/sockets.ready'));
      t.log(
        `rollback with ${2 * CONNS} sockets: ${ms} ms; event-loop delay max ${Math.round(h.max / 1e6)} ms, p99 ${Math.round(h.percentile(99) / 1e6)} ms`,
      );
    },
  );
});
