/**
 * Snapshots through the snapshot store, on real sandboxes (issue 14, "every
 * interface"): pushed from one state directory and pulled into another
 * through the SDK (a folder store and an S3-compatible one), the HTTP API
 * and its TypeScript client, and the CLI; progress reported; tenants kept
 * apart in the store (attacks: another tenant's key, keys that try to climb
 * out of the tenant's part, a push under the same key); imports refused
 * unless a trusted host signed them (unsigned, untrusted, altered: nothing
 * left behind); snapshot bytes counted in the tenant's quota.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { createHash, generateKeyPairSync } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep } from '../../src/index.js';
import { resolveStoreConfig } from '../../src/config.js';
import { S3SnapshotStore } from '../../src/snapshots/s3-store.js';
import { keyName, signDigest } from '../../src/snapshots/signing.js';
import type { TransferProgress } from '../../src/snapshots/transfer.js';
import { integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { listDir } from '../fixtures/host-state.js';
import { S3RVER_CREDENTIALS, startS3Server } from '../helpers/s3-server.js';
import { Snapshots as RemoteSnapshots } from '../../src/client/index.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));
const MiB = 1024 * 1024;

/** Runs the CLI on a state directory; resolves with its exit code and output. */
function cli(home: string, args: string[], env: NodeJS.ProcessEnv = {}) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { ...process.env, LOCKSTEP_HOME: home, LOCKSTEP_LOG_LEVEL: 'warn', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

type Frame = { type: string; payload: Buffer<ArrayBufferLike> };

/** Splits a bundle into its frames (type, payload), in order. */
function frames(bytes: Buffer): Frame[] {
  const out: Frame[] = [];
  for (let at = 8; at < bytes.length;) {
    const type = bytes.toString('latin1', at, at + 1);
    const len = bytes.readUInt32BE(at + 1);
    out.push({ type, payload: bytes.subarray(at + 5, at + 5 + len) });
    at += 5 + len;
  }
  return out;
}

/** Joins frames back into a bundle. */
function join(fs_: Frame[]): Buffer {
  return Buffer.concat([
    Buffer.from('LSBUNDL1', 'latin1'),
    ...fs_.flatMap((f) => {
      const head = Buffer.alloc(5);
      head.write(f.type, 0, 'latin1');
      head.writeUInt32BE(f.payload.length, 1);
      return [head, f.payload];
    }),
  ]);
}

/** The digest frame recomputed over everything before it (what an attacker can always redo). */
function redigest(fr: Frame[]): Buffer {
  const body = join(fr.filter((f) => f.type !== 'Z' && f.type !== 'S'));
  return createHash('sha256').update(body).digest();
}

integration(test, () => {
  let ls: Lockstep;
  let other: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];
  const storeDir = path.join(TEST_ROOT, `store-transfer-${process.pid}-${Date.now()}`);

  test.before(async () => {
    const t = { teardown: (fn: () => Promise<void>) => teardowns.push(fn) };
    ls = await openTestLockstep(t, { images: ['base'], open: { config: { snapshotStore: storeConfig(storeDir) } } });
    other = await openTestLockstep(t, {
      images: ['base'],
      open: {
        config: { snapshotStore: storeConfig(storeDir), trustedBundleKeys: [ls.snapshots.signingKey()] },
      },
    });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
    fs.rmSync(storeDir, { recursive: true, force: true });
  });

  function storeConfig(url: string) {
    return resolveStoreConfig({ url, chunkMib: 1 });
  }

  /** A snapshot (of tenant, if given) whose sandbox wrote `text` to /workspace/kept.txt; its sandbox is removed. */
  async function snapshotWith(t: ExecutionContext, text: string, opts: { tenant?: string; name?: string } = {}) {
    const sb = await ls.create({ image: 'base', ...(opts.tenant ? { tenant: opts.tenant } : {}) });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    await sb.files.write('/workspace/kept.txt', text);
    await sb.files.write('/workspace/bulk.bin', Buffer.alloc(3 * MiB, 7));
    const ck = await sb.checkpoint({ context: { format: 'openai-chat', messages: [{ role: 'user', content: text }] } });
    const snap = await ls.snapshots.create(ck.id, { name: opts.name, tenant: opts.tenant });
    t.teardown(() => ls.snapshots.delete(snap.id).catch(() => undefined));
    await ls.remove(sb.id);
    return snap;
  }

  function nothingImported(
    t: ExecutionContext,
    m: Lockstep,
    before: { layers: string[]; images: string[]; n: number },
  ) {
    t.deepEqual(listDir(m.engine.paths.layers), before.layers, 'no layer left');
    t.deepEqual(listDir(m.engine.paths.processImages), before.images, 'no process image left');
    t.is(m.snapshots.list().length, before.n, 'no snapshot row');
    t.deepEqual(listDir(m.engine.paths.scratch), [], 'scratch empty');
  }
  const state = (m: Lockstep) => ({
    layers: listDir(m.engine.paths.layers),
    images: listDir(m.engine.paths.processImages),
    n: m.snapshots.list().length,
  });

  test.serial(
    'SDK: push to a folder store, pull into another state directory; progress; nothing re-sent',
    async (t) => {
      const snap = await snapshotWith(t, 'through the store\n', { name: 'via-store' });
      const seen: TransferProgress[] = [];
      const pushed = await ls.snapshots.push(snap.id, { onProgress: (p) => seen.push(p) });
      t.like(pushed, { key: 'via-store', snapshotId: snap.id, skippedChunks: 0 });
      t.true(pushed.uploadedChunks >= 3, `${pushed.uploadedChunks} chunks of 1 MiB`);
      t.true(seen.length >= pushed.chunks, 'a progress report per chunk');
      t.true(seen.every((p) => p.phase === 'push'));
      t.is(seen.at(-1)!.bytes, pushed.bytes, 'the last report has every byte');
      t.is(
        pushed.digest,
        `sha256:${createHash('sha256')
          .update(await readAll(ls.snapshots.export(snap.id)))
          .digest('hex')}`,
      );

      const again = await ls.snapshots.push(snap.id);
      t.is(again.uploadedChunks, 0, 'a second push sends nothing');
      t.is(again.skippedChunks, pushed.chunks);
      t.deepEqual(
        (await ls.snapshots.listStored()).map((b) => [b.name, b.digest]),
        [['via-store', pushed.digest]],
      );

      const pulledProgress: TransferProgress[] = [];
      const pulled = await other.snapshots.pull('via-store', { onProgress: (p) => pulledProgress.push(p) });
      t.teardown(() => other.snapshots.delete(pulled.snapshot.id).catch(() => undefined));
      t.like(pulled.snapshot, { name: 'via-store', lineageId: snap.lineageId });
      t.is(pulledProgress.at(-1)!.bytes, pushed.bytes);
      t.is(pulledProgress.at(-1)!.totalBytes, pushed.bytes);
      const started = await other.create({ fromSnapshot: pulled.snapshot.id });
      t.teardown(() => other.remove(started.id).catch(() => undefined));
      t.is((await started.files.read('/workspace/kept.txt')).content.toString(), 'through the store\n');
      t.deepEqual(other.snapshots.context(pulled.snapshot.id), ls.snapshots.context(snap.id));

      // A missing key, and keys that are not one segment.
      await t.throwsAsync(other.snapshots.pull('no-such-key'), { code: 'BUNDLE_NOT_FOUND' });
      for (const key of ['../via-store', 'tenants/x', '', '.hidden'])
        await t.throwsAsync(other.snapshots.pull(key), { code: 'INVALID_ARGUMENT' });
      await ls.snapshots.deleteStored('via-store');
      t.deepEqual(await ls.snapshots.listStored(), []);
    },
  );

  test.serial('SDK: push to and pull from an S3-compatible store (s3rver on loopback)', async (t) => {
    const s3 = await startS3Server(path.join(TEST_ROOT, `s3-transfer-${process.pid}-${Date.now()}`));
    t.teardown(() => s3.stop());
    const store = new S3SnapshotStore({
      bucket: s3.bucket,
      endpoint: s3.endpoint,
      credentials: S3RVER_CREDENTIALS,
      chunkBytes: 1 * MiB,
    });
    t.teardown(() => store.close());
    const snap = await snapshotWith(t, 'through S3\n');
    const pushed = await ls.snapshots.push(snap.id, { store, key: 'on-s3' });
    t.true(pushed.uploadedChunks >= 3);
    t.is((await ls.snapshots.push(snap.id, { store, key: 'on-s3' })).uploadedChunks, 0);
    const pulled = await other.snapshots.pull('on-s3', { store });
    t.teardown(() => other.snapshots.delete(pulled.snapshot.id).catch(() => undefined));
    const started = await other.create({ fromSnapshot: pulled.snapshot.id });
    t.teardown(() => other.remove(started.id).catch(() => undefined));
    t.is((await started.files.read('/workspace/kept.txt')).content.toString(), 'through S3\n');
  });

  test.serial(
    "HTTP and the TS client: a tenant's bundles are its own; another tenant's key is a missing one (attacks)",
    async (t) => {
      const { client } = await startServer(t, ls);
      const url = client.base;
      const tokenA = tenantToken(ls, 'store-alice');
      const tokenB = tenantToken(ls, 'store-bob');
      const a = new RemoteSnapshots({ apiUrl: url, apiKey: tokenA });
      const b = new RemoteSnapshots({ apiUrl: url, apiKey: tokenB });
      const snapA = await snapshotWith(t, 'alice\n', { tenant: tenantId(ls, 'store-alice'), name: 'mine' });
      const snapB = await snapshotWith(t, 'bob\n', { tenant: tenantId(ls, 'store-bob'), name: 'mine' });

      const pushedA = await a.push('mine', { key: 'shared' });
      t.like(pushedA, { key: 'shared', snapshotId: snapA.id });
      // A's objects are in A's part of the store, not at its top.
      const aPart = path.join(storeDir, 'tenants', tenantId(ls, 'store-alice'));
      t.true(fs.existsSync(path.join(aPart, 'manifests', 'shared.json')));
      t.false(fs.existsSync(path.join(storeDir, 'manifests', 'shared.json')));

      // B sees nothing of A's, and cannot pull it.
      t.deepEqual(await b.listStored(), []);
      await t.throwsAsync(b.pull('shared'), { code: 'BUNDLE_NOT_FOUND' });
      // Keys that try to reach A's part: refused at the edge (400), not looked up.
      for (const key of [`../${tenantId(ls, 'store-alice')}/shared`, 'tenants%2Fx', '.hidden'])
        await t.throwsAsync(b.pull(key), { code: 'INVALID_ARGUMENT' });
      // `..` itself: the URL normalises it away, to a route that does not exist.
      await t.throwsAsync(b.pull('..'), { code: 'ROUTE_NOT_FOUND' });
      // B pushing its own snapshot under the same key writes B's part only.
      const pushedB = await b.push('mine', { key: 'shared' });
      t.not(pushedB.digest, pushedA.digest);
      t.deepEqual(
        (await a.listStored()).map((x) => x.digest),
        [pushedA.digest],
        "A's bundle is unchanged",
      );
      // Another tenant's snapshot cannot be pushed: exactly a missing one.
      await t.throwsAsync(b.push(snapA.id, { key: 'stolen' }), { code: 'SNAPSHOT_NOT_FOUND' });
      t.deepEqual(
        (await b.listStored()).map((x) => x.name),
        ['shared'],
      );

      // Each pulls its own bundle back, as its own snapshot.
      const back = await a.pull('shared', { name: 'mine-again' });
      t.like(back.snapshot, { tenant: tenantId(ls, 'store-alice'), lineageId: snapA.lineageId, name: 'mine-again' });
      await a.delete(back.snapshot.id);
      const backB = await b.pull('shared', { name: 'mine-again' });
      t.is(backB.snapshot.lineageId, snapB.lineageId);
      await b.delete(backB.snapshot.id);
      // B removing "shared" removes B's only; the garbage collector then takes B's chunks, not A's.
      await b.deleteStored('shared');
      t.deepEqual(
        (await a.listStored()).map((x) => x.name),
        ['shared'],
      );
      const chunksOf = (who: string) =>
        listDir(path.join(storeDir, 'tenants', tenantId(ls, who), 'chunks')).flatMap((fan) =>
          listDir(path.join(storeDir, 'tenants', tenantId(ls, who), 'chunks', fan)),
        );
      const aChunks = chunksOf('store-alice');
      t.true(chunksOf('store-bob').length > 0);
      const gc = await cli(ls.home, ['store', 'gc', '--grace-ms', '0', '--store', storeDir, '--json']);
      t.is(gc.code, 0, gc.stderr);
      t.deepEqual(chunksOf('store-bob'), [], "B's unlisted chunks are collected");
      t.deepEqual(chunksOf('store-alice'), aChunks, "A's listed chunks stay");
      await a.deleteStored('shared');
    },
  );

  test.serial('CLI: snapshot push and pull with --store, progress on stderr, the signing key', async (t) => {
    await snapshotWith(t, 'through the CLI\n', { name: 'by-cli' });
    const dir = `${storeDir}-cli`;
    t.teardown(async () => fs.rmSync(dir, { recursive: true, force: true }));
    const pushed = await cli(ls.home, ['snapshot', 'push', 'by-cli', '--key', 'cli-key', '--store', dir, '--json']);
    t.is(pushed.code, 0, pushed.stderr);
    const r = JSON.parse(pushed.stdout) as { key: string; uploadedChunks: number };
    t.like(r, { key: 'cli-key' });
    const ls2 = await cli(ls.home, ['store', 'ls', '--store', dir, '--json']);
    t.deepEqual(
      (JSON.parse(ls2.stdout) as { name: string }[]).map((x) => x.name),
      ['cli-key'],
    );
    const key = (await cli(ls.home, ['snapshot', 'key'])).stdout.trim();
    t.is(key, ls.snapshots.signingKey());
    const pulled = await cli(other.home, ['snapshot', 'pull', 'cli-key', '--store', dir, '--name', 'from-cli'], {
      LOCKSTEP_TRUSTED_BUNDLE_KEYS: key,
    });
    t.is(pulled.code, 0, pulled.stderr);
    t.regex(pulled.stderr, /pull: \d+ of \d+ MiB/, 'progress on stderr');
    const id = pulled.stdout.trim();
    t.teardown(() => other.snapshots.delete(id).catch(() => undefined));
    t.is(other.snapshots.get(id).name, 'from-cli');
    // Without trusting the key, the same pull is refused (exit 4, BUNDLE_UNTRUSTED) and keeps nothing.
    const before = state(other);
    const refused = await cli(other.home, ['snapshot', 'pull', 'cli-key', '--store', dir, '--name', 'nope']);
    t.is(refused.code, 4, refused.stderr);
    t.regex(refused.stderr, /not trusted here/);
    nothingImported(t, other, before);
    // No store at all: a typed error.
    const none = await cli(ls.home, ['snapshot', 'push', 'by-cli'], { LOCKSTEP_SNAPSHOT_STORE: '' });
    t.is(none.code, 1);
    t.regex(none.stderr, /No snapshot store is configured/);
  });

  test.serial(
    'import trust: unsigned, untrusted and altered bundles are refused; nothing is half-imported',
    async (t) => {
      const snap = await snapshotWith(t, 'signed\n');
      const good = await readAll(ls.snapshots.export(snap.id));
      const fr = frames(good);
      t.is(fr.at(-1)!.type, 'S', 'the bundle ends with its signature');
      const before = state(other);
      const refuse = async (bytes: Buffer, reason: RegExp) => {
        const e = await t.throwsAsync(other.snapshots.import(bufferStream(bytes)), { code: 'BUNDLE_UNTRUSTED' });
        t.regex(e!.message, reason);
        nothingImported(t, other, before);
      };
      // Unsigned: the signature frame dropped.
      await refuse(join(fr.slice(0, -1)), /not signed/);
      // Signed, by a key nobody trusts (an attacker's own).
      const { privateKey, publicKey } = generateKeyPairSync('ed25519');
      const digest = fr.find((f) => f.type === 'Z')!.payload;
      const forged = signDigest({ privateKey, name: keyName(publicKey) }, digest);
      await refuse(
        join([...fr.slice(0, -1), { type: 'S', payload: Buffer.from(JSON.stringify(forged)) }]),
        /does not trust/,
      );
      // Altered: a byte of the layer changed and the digest recomputed, the trusted signature kept.
      const altered: Frame[] = fr.map((f) => ({ type: f.type, payload: Buffer.from(f.payload) }));
      const data = altered.find((f) => f.type === 'D')!;
      data.payload[data.payload.length >> 1]! ^= 0x01;
      // Its part's checksum (E) must match too, or the reader stops at BUNDLE_CORRUPT first.
      const dIndex = altered.indexOf(data);
      const end = altered.slice(dIndex).find((f) => f.type === 'E')!;
      const partData = altered
        .slice(altered.findLastIndex((f, i) => i < dIndex && f.type === 'P') + 1, altered.indexOf(end))
        .filter((f) => f.type === 'D');
      createHash('sha256')
        .update(Buffer.concat(partData.map((f) => f.payload)))
        .digest()
        .copy(end.payload, 0);
      altered.find((f) => f.type === 'Z')!.payload = redigest(altered);
      await refuse(join(altered), /does not verify/);
      // The real one imports (the other host trusts this one's key).
      const ok = await other.snapshots.import(bufferStream(good));
      t.teardown(() => other.snapshots.delete(ok.id).catch(() => undefined));
      t.is(ok.lineageId, snap.lineageId);
    },
  );

  test.serial("snapshot bytes count in the tenant's quota; deleting a snapshot frees them", async (t) => {
    // Room for about one snapshot of ~4 MiB (3 MiB of workspace and the process image).
    const name = 'store-quota';
    tenantToken(ls, name, { maxCheckpointMb: 40 });
    const tenant = tenantId(ls, name);
    const first = await snapshotWith(t, 'one\n', { tenant });
    const used = ls.tenants.usage(tenant);
    t.is(used.checkpointMb, 0, 'its sandbox and checkpoint are gone');
    t.true(used.snapshotMb >= 3, `the snapshot counts: ${used.snapshotMb} MiB`);
    const bundle = await readAll(ls.snapshots.export(first.id));
    // Lower the quota below what it holds: it may make no other snapshot, by import, pull or create.
    ls.engine.catalog.db
      .prepare('UPDATE tenants SET max_checkpoint_mb = ? WHERE id = ?')
      .run(used.snapshotMb - 1, tenant);
    const before = state(ls);
    await t.throwsAsync(ls.snapshots.import(bufferStream(bundle), { tenant, name: 'second' }), {
      code: 'QUOTA_EXCEEDED',
    });
    nothingImported(t, ls, before);
    await ls.snapshots.push(first.id, { tenant, key: 'q' });
    await t.throwsAsync(ls.snapshots.pull('q', { tenant, name: 'third' }), { code: 'QUOTA_EXCEEDED' });
    nothingImported(t, ls, before);
    const sb = await ls.create({ image: 'base', tenant });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    ls.engine.catalog.db.prepare('UPDATE tenants SET max_checkpoint_mb = NULL WHERE id = ?').run(tenant);
    const ck = await sb.checkpoint();
    ls.engine.catalog.db
      .prepare('UPDATE tenants SET max_checkpoint_mb = ? WHERE id = ?')
      .run(used.snapshotMb - 1, tenant);
    await t.throwsAsync(ls.snapshots.create(ck.id, { tenant, name: 'fourth' }), { code: 'QUOTA_EXCEEDED' });
    t.is(ls.snapshots.list({ tenant }).length, 1);
    await ls.remove(sb.id);
    // Deleting the snapshot frees its bytes: the import now fits.
    await ls.snapshots.delete(first.id, { tenant });
    t.is(ls.tenants.usage(tenant).snapshotMb, 0);
    ls.engine.catalog.db
      .prepare('UPDATE tenants SET max_checkpoint_mb = ? WHERE id = ?')
      .run(used.snapshotMb + 8, tenant);
    const again = await ls.snapshots.import(bufferStream(bundle), { tenant, name: 'second' });
    t.teardown(() => ls.snapshots.delete(again.id).catch(() => undefined));
    t.true(ls.tenants.usage(tenant).snapshotMb >= 3);
    await ls.snapshots.deleteStored('q', { tenant });
  });
});

async function readAll(stream: AsyncIterable<unknown>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

async function* bufferStream(b: Buffer): AsyncGenerator<Buffer> {
  for (let i = 0; i < b.length; i += MiB) yield b.subarray(i, i + MiB);
}
