/**
 * What `lockstep/client` adds over the shared scenario: retries that never
 * run a request twice, AbortSignal reaching the command on the server,
 * streamed files past the 16 MiB default, image listing, and its errors.
 * A real server on loopback throughout; the one proxy is a plain TCP relay
 * that cuts a connection the way a network does.
 */
import test from 'ava';
import net from 'node:net';
import { createHash, randomBytes } from 'node:crypto';
import { CommandAbortedError, ConnectionError, Images, LockstepError, Sandbox } from '../../src/client/index.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

const MiB = 1024 * 1024;

/**
 * A TCP relay to `port`. While `cutNext` is set, the first connection that
 * receives response bytes is closed instead of passing them on: the server
 * did the work, the client never hears of it.
 */
async function cuttingRelay(
  t: { teardown: (fn: () => Promise<void>) => void },
  port: number,
): Promise<{ url: string; cutNext: () => void; cuts: () => number }> {
  let armed = false;
  let cuts = 0;
  const open = new Set<net.Socket>();
  const server = net.createServer((down) => {
    const up = net.connect(port, '127.0.0.1');
    for (const s of [down, up]) {
      open.add(s);
      s.once('close', () => open.delete(s));
    }
    down.on('error', () => up.destroy());
    up.on('error', () => down.destroy());
    down.pipe(up);
    up.on('data', (d: Buffer) => {
      if (armed) {
        armed = false;
        cuts++;
        down.destroy();
        up.destroy();
        return;
      }
      down.write(d);
    });
    up.on('end', () => down.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  // Idle keep-alive connections would hold close() open for the server's keep-alive timeout.
  t.teardown(
    () =>
      new Promise<void>((r) => {
        server.close(() => r());
        for (const s of open) s.destroy();
      }),
  );
  const addr = server.address() as net.AddressInfo;
  return { url: `http://127.0.0.1:${addr.port}`, cutNext: () => (armed = true), cuts: () => cuts };
}

const portOf = (base: string) => Number(new URL(base).port);

integration(test, () => {
  test.serial(
    'a response lost on the way is retried under the same Idempotency-Key: the command ran once',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const relay = await cuttingRelay(t, portOf(client.base));
      const conn = { apiUrl: relay.url, apiKey: tenantToken(ls, 'acme'), retryDelayMs: 50 };
      const sbx = await Sandbox.create({ ...conn, memoryMb: 64 });
      t.teardown(() => sbx.kill().then(() => undefined));

      relay.cutNext();
      const r = await sbx.commands.run('echo ran >> /workspace/runs.txt; wc -l < /workspace/runs.txt');
      t.is(relay.cuts(), 1);
      t.is(r.stdout.trim(), '1');
      t.is((await sbx.files.read('runs.txt')).content.toString(), 'ran\n');

      // A checkpoint whose answer is lost is not taken twice either.
      relay.cutNext();
      const ck = await sbx.checkpoint({ label: 'once' });
      t.is(relay.cuts(), 2);
      t.deepEqual(
        (await sbx.checkpoints()).map((c) => c.id),
        [ck.id],
      );
    },
  );

  test.serial('an AbortSignal stops the command on the server', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const sbx = await Sandbox.create({ apiUrl: client.base, apiKey: tenantToken(ls, 'acme'), memoryMb: 64 });
    t.teardown(() => sbx.kill().then(() => undefined));
    const ctl = new AbortController();
    const run = sbx.commands.run('echo $$ > /workspace/pid; exec sleep 300', {
      signal: ctl.signal,
      onStdout: () => undefined,
    });
    await eventually(() => sbx.files.exists('pid'), 10_000);
    ctl.abort();
    const err = await t.throwsAsync(run);
    t.true(err instanceof CommandAbortedError);
    t.is((err as LockstepError).code, 'COMMAND_ABORTED');
    const pid = (await sbx.files.read('pid')).content.toString().trim();
    await eventually(
      async () =>
        (await sbx.commands.run(`kill -0 ${pid} 2>/dev/null && echo alive || echo gone`)).stdout.trim() === 'gone',
      15_000,
    );
    t.is((await sbx.commands.run(`kill -0 ${pid} 2>/dev/null && echo alive || echo gone`)).stdout.trim(), 'gone');
  });

  test.serial(
    'files past 16 MiB stream up and down whole; past the server limit the answer is 413 and the file is unchanged',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls, { fileBodyLimit: 64 * MiB });
      const token = tenantToken(ls, 'acme');
      const sbx = await Sandbox.create({ apiUrl: client.base, apiKey: token, memoryMb: 64 });
      t.teardown(() => sbx.kill().then(() => undefined));

      const hash = createHash('sha256');
      const seed = randomBytes(MiB);
      async function* source() {
        for (let i = 0; i < 24; i++) {
          const chunk = Buffer.from(seed);
          chunk.writeUInt32BE(i, 0);
          hash.update(chunk);
          yield chunk;
        }
      }
      const up = await sbx.files.writeStream('big.bin', source());
      const want = hash.digest('hex');
      t.is(up.bytes, 24 * MiB);
      t.is(up.sha256, want);
      t.is((await sbx.commands.run('sha256sum /workspace/big.bin')).stdout.split(' ')[0], want);

      const down = await sbx.files.readStream('big.bin');
      down.stream.resume();
      t.deepEqual(await down.done, { sha256: want, bytes: 24 * MiB });

      // Behind a server with the default limit (16 MiB), a larger file is refused and the old one stays.
      const { client: small } = await startServer(t, ls);
      const same = await Sandbox.connect(sbx.id, { apiUrl: small.base, apiKey: token });
      async function* tooBig() {
        for (let i = 0; i < 17; i++) yield seed;
      }
      const refused = await t.throwsAsync(same.files.writeStream('big.bin', tooBig()));
      t.like(refused, { code: 'PAYLOAD_TOO_LARGE' });
      t.is((await sbx.commands.run('sha256sum /workspace/big.bin')).stdout.split(' ')[0], want);
    },
  );

  test.serial(
    'the server lists images; a shipped recipe is made on first use; IMAGE_NOT_FOUND names the command that fixes it',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const conn = { apiUrl: client.base, apiKey: tenantToken(ls, 'acme') };
      const images = await Images.list(conn);
      t.like(
        images.find((i) => i.name === 'base'),
        { ready: true },
      );
      t.like(
        images.find((i) => i.name === 'dev'),
        { ready: false, source: 'recipe', sizeBytes: null },
      );
      t.false(JSON.stringify(images).includes(ls.home)); // host paths stay on the server

      // A shipped recipe not built here yet is made on first use (linked from the build cache).
      const dev = await Sandbox.create({ ...conn, image: 'dev', memoryMb: 128 });
      t.teardown(() => dev.kill().then(() => undefined));
      t.is((await dev.info()).image, 'dev');
      t.is((await dev.commands.run('python3 -c "print(6*7)"')).stdout, '42\n');
      t.like(
        (await Images.list(conn)).find((i) => i.name === 'dev'),
        { ready: true },
      );
      const unknown = await t.throwsAsync(Sandbox.create({ ...conn, image: 'nosuch' }));
      t.like(unknown, { code: 'IMAGE_NOT_FOUND', field: 'image' });
      t.regex(unknown!.message, /installed here: base/);
      t.regex(unknown!.message, /lockstep image build NAME/);
      t.regex(unknown!.message, /lockstep image import docker:REF --name nosuch/);
    },
  );

  test.serial('fork answers each child in order; a failed one is its typed error, nothing invented', async (t) => {
    // The second child's restore fails (the fault hook throws at its start, as a failed restore would).
    let forkBegins = 0;
    const ls = await openTestLockstep(t, {
      open: {
        fault: (point) => {
          if (point === 'fork:begin' && ++forkBegins === 2) throw new Error('injected: restore failed');
        },
      },
    });
    const { client } = await startServer(t, ls);
    const conn = { apiUrl: client.base, apiKey: tenantToken(ls, 'acme') };
    const sbx = await Sandbox.create({ ...conn, memoryMb: 64 });
    t.teardown(() => sbx.kill().then(() => undefined));
    const ck = await sbx.checkpoint({ label: 'before forks' });
    const results = await sbx.fork(ck.id, { count: 3 });
    t.is(results.length, 3);
    for (const r of [results[0]!, results[2]!]) {
      if (!r.ok) return t.fail(`fork failed: ${r.error.code}`);
      t.teardown(() => Sandbox.kill(r.id, conn).then(() => undefined));
      t.regex(r.id, /^sbx_/);
      t.true(Number.isInteger(r.ms) && r.ms > 0, 'the time the server measured');
      t.false('pid' in r, 'no pid made up for the wire');
      t.is((await Sandbox.connect(r.id, conn)).id, r.id);
    }
    const failed = results[1]!;
    if (failed.ok) return t.fail('the second fork should have failed');
    t.true(failed.error instanceof LockstepError);
    t.like(failed.error, { code: 'FORK_FAILED', message: 'Internal error; the server log has the details' });
    t.is(failed.error.details.status, 500);
  });

  test.serial('list sends the metadata filter: the server answers only the sandboxes with those labels', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const conn = { apiUrl: client.base, apiKey: tenantToken(ls, 'acme') };
    const a = await Sandbox.create({ ...conn, memoryMb: 64, metadata: { team: 'a', env: 'prod' } });
    t.teardown(() => a.kill().then(() => undefined));
    const b = await Sandbox.create({ ...conn, memoryMb: 64, metadata: { team: 'b', env: 'prod' } });
    t.teardown(() => b.kill().then(() => undefined));
    const ids = async (metadata: Record<string, string>) =>
      (await Sandbox.list({ ...conn, metadata })).map((s) => s.id);
    t.deepEqual(await ids({ team: 'b' }), [b.id]);
    t.deepEqual(await ids({ env: 'prod' }), [a.id, b.id]);
    t.deepEqual(await ids({ env: 'prod', team: 'a' }), [a.id]);
    t.deepEqual(await ids({ team: 'c' }), []);
    // The server checks the filter: a label value past 1024 characters is its INVALID_ARGUMENT.
    const tooLong = await t.throwsAsync(Sandbox.list({ ...conn, metadata: { team: 'x'.repeat(1025) } }));
    t.like(tooLong, { code: 'INVALID_ARGUMENT', field: 'metadata.team' });
    t.is((tooLong as LockstepError).details.status, 400);
  });

  test.serial('bad settings, a wrong token and an unreachable server are typed errors', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const noKey = await t.throwsAsync(Sandbox.list({ apiUrl: client.base, apiKey: '' }));
    t.like(noKey, { code: 'INVALID_ARGUMENT', field: 'apiKey' });
    const badUrl = await t.throwsAsync(Sandbox.list({ apiUrl: 'ftp://x', apiKey: 'k' }));
    t.like(badUrl, { code: 'INVALID_ARGUMENT', field: 'apiUrl' });
    const wrong = await t.throwsAsync(Sandbox.list({ apiUrl: client.base, apiKey: 'lst_not-a-token' }));
    t.true(wrong instanceof LockstepError);
    t.is((wrong as LockstepError).code, 'UNAUTHENTICATED');
    t.is((wrong as LockstepError).details.status, 401);

    // A port nobody listens on: the retries run out, then a ConnectionError.
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    const down = await t.throwsAsync(
      Sandbox.list({ apiUrl: `http://127.0.0.1:${port}`, apiKey: 'k', maxAttempts: 2, retryDelayMs: 10 }),
    );
    t.true(down instanceof ConnectionError);
    t.is((down as LockstepError).code, 'CONNECTION_FAILED');
    t.regex(down!.message, /ECONNREFUSED/);
  });
  test.serial('sandbox.ports: expose a listening port, reach it with the token, list and close it', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const sbx = await Sandbox.create({ apiUrl: client.base, apiKey: tenantToken(ls, 'acme'), memoryMb: 64 });
    t.teardown(() => sbx.kill().then(() => undefined));
    await sbx.files.write('/workspace/www/index.html', 'served from the sandbox\n');
    await sbx.commands.run('httpd -f -p 127.0.0.1:8080 -h /workspace/www', { background: true });
    const silent = await t.throwsAsync(sbx.ports.expose(8081));
    t.is((silent as LockstepError).code, 'PORT_NOT_LISTENING');
    const e = (await eventually(() => sbx.ports.expose(8080).catch(() => undefined), 10_000, 100))!;
    t.is(e.url, `${client.base}${e.path}`);
    const res = await fetch(e.url, { headers: { 'x-lockstep-token': e.token } });
    t.is(await res.text(), 'served from the sandbox\n');
    t.is((await fetch(e.url)).status, 401);
    t.deepEqual(
      (await sbx.ports.list()).map((x) => [x.id, x.port]),
      [[e.id, 8080]],
    );
    t.true(await sbx.ports.close(8080));
    t.false(await sbx.ports.close(8080));
    t.is((await fetch(e.url, { headers: { 'x-lockstep-token': e.token } })).status, 404);
  });
});
