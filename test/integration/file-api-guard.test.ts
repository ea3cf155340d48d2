/**
 * The file API against what a sandbox can plant: a FIFO (whose read would
 * block forever), a device node, a unix socket and a symlink leaf. Each gets
 * FILE_TYPE_NOT_SUPPORTED naming the path and the type, through the SDK and
 * through HTTP, and the manager keeps serving while it is attempted: a timer
 * in this process keeps firing, other requests are answered. Large files
 * stream: 64 MiB round-trips byte-exact through the SDK's stream API and
 * through HTTP.
 */
import net from 'node:net';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';
import type { Lockstep } from '../../src/index.js';

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const MiB = 1024 * 1024;

/** A sandbox with one of each kind of thing the file API must not open, planted the way a sandbox (or host root) would. */
async function plant(ls: Lockstep, t: { teardown: (fn: () => void) => void }) {
  const sb = await ls.create({ memoryMb: 64 });
  const r = await sb.commands.run(
    'mkfifo /workspace/fifo && echo hello > /workspace/hello.txt && ln -s hello.txt /workspace/link && mkdir /workspace/dir && ln -s dir /workspace/dirlink',
  );
  if (r.exitCode !== 0) throw new Error(r.stderr);
  // The sandbox has no CAP_MKNOD: a device node and a bound socket are made
  // from the host, through the sandbox's overlay root.
  const root = ls.engine.paths.sandboxRoot(ls.engine.catalog.sandbox(sb.id)!.instance);
  execFileSync('mknod', [path.join(root, 'workspace/null'), 'c', '1', '3']);
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(path.join(root, 'workspace/sock'), resolve));
  t.teardown(() => server.close());
  return sb;
}

const planted: [string, string][] = [
  ['/workspace/fifo', 'fifo'],
  ['/workspace/null', 'character-device'],
  ['/workspace/sock', 'socket'],
  ['/workspace/link', 'symlink'],
];

integration(test, () => {
  test.serial(
    'SDK: a FIFO, a device, a socket and a symlink leaf are refused for read, stream, write and hash; the event loop keeps running',
    async (t) => {
      const ls = await openTestLockstep(t);
      const sb = await plant(ls, t);
      let ticks = 0;
      const timer = setInterval(() => ticks++, 1);
      t.teardown(() => clearInterval(timer));

      for (const [p, type] of planted) {
        const ticksBefore = ticks;
        // A second read runs alongside the refused one and is answered.
        const [refused, other] = await Promise.allSettled([sb.files.read(p), sb.files.read('/workspace/hello.txt')]);
        t.is(refused.status, 'rejected', p);
        const err = (refused as PromiseRejectedResult).reason as {
          code: string;
          message: string;
          details: Record<string, unknown>;
        };
        t.is(err.code, 'FILE_TYPE_NOT_SUPPORTED', `${p}: ${err.message}`);
        t.like(err.details, { field: 'path', path: p, type });
        t.true(err.message.includes(p) && err.message.includes(type), err.message);
        t.is(other.status, 'fulfilled');
        t.is((other as PromiseFulfilledResult<{ content: Buffer }>).value.content.toString(), 'hello\n');
        await t.throwsAsync(sb.files.readStream(p), { code: 'FILE_TYPE_NOT_SUPPORTED' });
        await t.throwsAsync(sb.files.write(p, 'x'), { code: 'FILE_TYPE_NOT_SUPPORTED' });
        await t.throwsAsync(sb.files.writeStream(p, Readable.from([Buffer.from('x')])), {
          code: 'FILE_TYPE_NOT_SUPPORTED',
        });
        await t.throwsAsync(sb.files.hash(p), { code: 'FILE_TYPE_NOT_SUPPORTED' });
        // The timer this process runs fired while the call was in flight or
        // right after: the event loop was never blocked (a blocked loop would
        // hang this test instead).
        await new Promise((r) => setTimeout(r, 5));
        t.true(ticks > ticksBefore, `${p}: the timer kept firing`);
      }
      // A symlink to a directory is not followed for listing either; the directory itself lists.
      await t.throwsAsync(sb.files.list('/workspace/dirlink'), { code: 'FILE_TYPE_NOT_SUPPORTED' });
      t.deepEqual(
        (await sb.files.list('/workspace')).map((e) => [e.name, e.type]),
        [
          ['dir', 'directory'],
          ['dirlink', 'symlink'],
          ['fifo', 'other'],
          ['hello.txt', 'file'],
          ['link', 'symlink'],
          ['null', 'other'],
          ['sock', 'other'],
        ],
      );
      // Nothing was written through any of them, and the FIFO is still a FIFO.
      const inside = await sb.commands.run(
        'test -p /workspace/fifo && test -c /workspace/null && test -S /workspace/sock && test -L /workspace/link && cat /workspace/hello.txt',
      );
      t.is(inside.stdout, 'hello\n', inside.stderr);
      t.is(inside.exitCode, 0);
      t.deepEqual(
        (await sb.commands.run('ls -a /workspace')).stdout.split('\n').filter((n) => n.startsWith('.lockstep-')),
        [],
        'no temporary file left behind',
      );
    },
  );

  test.serial('HTTP: the same refusals are 400 FILE_TYPE_NOT_SUPPORTED; a concurrent read is answered', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const S = `/v1/sandboxes/${id}`;
    const mk = await api.post(`${S}/commands`, {
      cmd: 'mkfifo /workspace/fifo && echo hello > /workspace/hello.txt && ln -s hello.txt /workspace/link',
    });
    t.is(mk.body.exitCode, 0, mk.text);
    const root = ls.engine.paths.sandboxRoot(ls.engine.catalog.sandbox(id)!.instance);
    execFileSync('mknod', [path.join(root, 'workspace/null'), 'c', '1', '3']);
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(path.join(root, 'workspace/sock'), resolve));
    t.teardown(() => server.close());

    for (const [p, type] of planted) {
      const q = `path=${encodeURIComponent(p)}`;
      const attempts = [
        api.get(`${S}/files?${q}`),
        api.get(`${S}/files?${q}`, { headers: { accept: 'application/octet-stream' } }),
        api.put(`${S}/files?${q}`, { content: 'x' }),
        api.put(`${S}/files?${q}`, Buffer.from('x'), {
          raw: true,
          headers: { 'content-type': 'application/octet-stream' },
        }),
        api.get(`${S}/files/list?${q}`),
      ];
      // Sent together with the refused ones: answered all the same.
      const other = api.get(`${S}/files?path=/workspace/hello.txt`);
      for (const r of await Promise.all(attempts)) {
        t.is(r.status, 400, `${p}: ${r.text}`);
        t.is(r.body.error.code, 'FILE_TYPE_NOT_SUPPORTED', r.text);
        t.is(r.body.error.field, 'path');
        t.regex(r.body.error.message, new RegExp(`${p}.*${type}`));
      }
      const o = await other;
      t.is(o.status, 200);
      t.is(o.body.content, 'hello\n');
    }
    const inside = await api.post(`${S}/commands`, {
      cmd: 'test -p /workspace/fifo && test -c /workspace/null && test -S /workspace/sock && test -L /workspace/link && cat /workspace/hello.txt',
    });
    t.is(inside.body.stdout, 'hello\n', inside.text);
  });

  test.serial(
    '64 MiB round-trips byte-exact through the SDK streams and through HTTP (streamed both ways); the event loop keeps turning meanwhile',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls, { fileBodyLimit: 80 * MiB });
      const api = client.as(tenantToken(ls, 'acme'));
      const id: string = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
      const sb = ls.get(id);
      const data = randomBytes(64 * MiB);
      const want = sha256(data);

      // SDK: write from a stream of 1 MiB chunks, read back as a stream.
      let turns = 0;
      let spinning = true;
      const spin = () => {
        turns++;
        if (spinning) setImmediate(spin);
      };
      setImmediate(spin);
      const chunks = Readable.from(
        (function* () {
          for (let off = 0; off < data.length; off += MiB) yield data.subarray(off, off + MiB);
        })(),
      );
      const w = await sb.files.writeStream('/workspace/big.bin', chunks);
      t.deepEqual({ sha256: w.sha256, bytes: w.bytes }, { sha256: want, bytes: data.length });
      const turnsAfterWrite = turns;
      t.true(turnsAfterWrite > 0, 'the event loop turned while 64 MiB were written');
      const rs = await sb.files.readStream('/workspace/big.bin');
      t.is(rs.size, data.length);
      const hash = createHash('sha256');
      let bytes = 0;
      for await (const c of rs.stream) {
        hash.update(c as Buffer);
        bytes += (c as Buffer).length;
      }
      t.is(hash.digest('hex'), want);
      t.is(bytes, data.length);
      const done = await rs.done;
      t.is(done.sha256, want);
      t.truthy(done.observationId, 'the streamed read is recorded as an observation with its hash');
      spinning = false;
      t.true(turns > turnsAfterWrite, 'the event loop turned while 64 MiB were read');
      const inside = await sb.commands.run(['sha256sum', '/workspace/big.bin']);
      t.is(inside.stdout.split(' ')[0], want);

      // HTTP: PUT streams the body to the file; GET with Accept: octet-stream streams it back, hash in a trailer.
      const put = await api.put(`/v1/sandboxes/${id}/files?path=/workspace/http.bin`, data, {
        raw: true,
        headers: { 'content-type': 'application/octet-stream' },
      });
      t.is(put.status, 200, put.text);
      t.like(put.body, { sha256: want, bytes: data.length });
      const res = await fetch(`${client.base}/v1/sandboxes/${id}/files?path=/workspace/http.bin`, {
        headers: { authorization: `Bearer ${api.token}`, accept: 'application/octet-stream' },
      });
      t.is(res.status, 200);
      t.is(res.headers.get('transfer-encoding'), 'chunked');
      t.regex(res.headers.get('trailer') ?? '', /x-lockstep-sha256/);
      const got = Buffer.from(await res.arrayBuffer());
      t.is(got.length, data.length);
      t.is(sha256(got), want);

      // Past the limit: 413, and the file keeps its old content (written to a temporary file, never renamed).
      const small = await startServer(t, ls, { fileBodyLimit: 8 * MiB });
      const api2 = small.client.as(api.token!);
      const over = await api2.put(`/v1/sandboxes/${id}/files?path=/workspace/http.bin`, data.subarray(0, 9 * MiB), {
        raw: true,
        headers: { 'content-type': 'application/octet-stream' },
      });
      t.is(over.status, 413);
      // A chunked body (no Content-Length) is counted as it arrives.
      const chunked = await fetch(`${small.client.base}/v1/sandboxes/${id}/files?path=/workspace/http.bin`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${api.token}`, 'content-type': 'application/octet-stream' },
        body: Readable.toWeb(
          Readable.from([data.subarray(0, 5 * MiB), data.subarray(5 * MiB, 10 * MiB)]),
        ) as ReadableStream,
        duplex: 'half',
      } as RequestInit);
      t.is(chunked.status, 413, await chunked.text());
      const json = await api2.get(`/v1/sandboxes/${id}/files?path=/workspace/http.bin`);
      t.is(json.status, 413, 'a JSON read holds the file in memory: only up to the file limit');
      t.is(json.body.error.code, 'FILE_TOO_LARGE');
      t.is(await sb.files.hash('/workspace/http.bin'), want, 'the refused writes changed nothing');
      t.deepEqual(
        (await sb.commands.run('ls -a /workspace')).stdout.split('\n').filter((n) => n.startsWith('.lockstep-')),
        [],
        'no temporary file left behind',
      );
    },
  );
});
