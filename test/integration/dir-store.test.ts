/**
 * The folder snapshot store on the real filesystem: the shared store
 * behaviour (test/helpers/store-behaviour.ts), plus what only a folder has:
 * nothing half-written is ever visible, and an interrupted write leaves no
 * temporary file behind.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { DirSnapshotStore } from '../../src/snapshots/dir-store.js';
import { openSnapshotStore } from '../../src/snapshots/open-store.js';
import { resolveStoreConfig } from '../../src/config.js';
import type { Manifest } from '../../src/snapshots/store.js';
import { TEST_ROOT } from '../helpers/harness.js';
import { digestOf, randomStream, storeBehaviour } from '../helpers/store-behaviour.js';

const MiB = 1024 * 1024;
const CHUNK = 8 * MiB;

function freshRoot(t: { teardown: (fn: () => void) => void }): string {
  fs.mkdirSync(TEST_ROOT, { recursive: true, mode: 0o711 });
  const root = path.join(TEST_ROOT, `dir-store-${process.pid}-${randomBytes(4).toString('hex')}`);
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  return root;
}

const chunkFile = (root: string, sha256: string) => path.join(root, 'chunks', sha256.slice(0, 2), sha256);

const roots: string[] = [];
test.after.always(() => {
  for (const r of roots) fs.rmSync(r, { recursive: true, force: true });
});

storeBehaviour(test, async () => {
  const root = path.join(TEST_ROOT, `dir-store-${process.pid}-${randomBytes(4).toString('hex')}`);
  fs.mkdirSync(TEST_ROOT, { recursive: true, mode: 0o711 });
  roots.push(root);
  const store = new DirSnapshotStore(root, { chunkBytes: CHUNK });
  const countChunks = () => {
    const top = path.join(root, 'chunks');
    if (!fs.existsSync(top)) return 0;
    return fs.readdirSync(top).reduce((n, fan) => n + fs.readdirSync(path.join(top, fan)).length, 0);
  };
  return {
    store,
    chunkBytes: CHUNK,
    chunkObjects: async () => countChunks(),
    corruptChunk: async (sha256, mutate) => {
      const file = chunkFile(root, sha256);
      fs.writeFileSync(file, mutate(fs.readFileSync(file)));
    },
    removeChunk: async (sha256) => fs.rmSync(chunkFile(root, sha256)),
    chunksOf: async (name) => {
      const m = JSON.parse(
        fs.readFileSync(path.join(root, 'manifests', `${encodeURIComponent(name)}.json`), 'utf8'),
      ) as Manifest;
      return m.chunks.map((c) => c.sha256);
    },
  };
});

test.serial('files are private, and an aborted put leaves no temporary file', async (t) => {
  t.timeout(300_000);
  const root = freshRoot(t);
  const store = new DirSnapshotStore(root, { chunkBytes: MiB });
  await store.put('p', randomStream('perm', 3 * MiB));
  const manifest = path.join(root, 'manifests', 'p.json');
  t.is(fs.statSync(manifest).mode & 0o777, 0o600);
  t.is(fs.statSync(path.join(root, 'chunks')).mode & 0o777, 0o700);
  const ac = new AbortController();
  await t.throwsAsync(
    store.put('q', randomStream('abort', 40 * MiB), {
      signal: ac.signal,
      onProgress: (p) => {
        if (p.chunks >= 5) ac.abort();
      },
    }),
    { code: 'TRANSFER_ABORTED' },
  );
  t.deepEqual(fs.readdirSync(path.join(root, 'tmp')), []);
  await t.throwsAsync(store.stat('q'), { code: 'BUNDLE_NOT_FOUND' });
});

test.serial('the store opens from a file:// URL or a folder; other URLs are refused', async (t) => {
  const root = freshRoot(t);
  for (const url of [`file://${root}`, root]) {
    const store = await openSnapshotStore(resolveStoreConfig({ url, chunkMib: 1 }, {}));
    const r = await store.put('x', randomStream('open', 2 * MiB + 1));
    t.is(r.chunks, 3);
    t.deepEqual(await digestOf(await store.get('x')), await digestOf(randomStream('open', 2 * MiB + 1)));
  }
  await t.throwsAsync(openSnapshotStore(resolveStoreConfig({}, {})), { code: 'INVALID_ARGUMENT' });
  await t.throwsAsync(openSnapshotStore(resolveStoreConfig({ url: 'relative/dir' }, {})), { code: 'INVALID_ARGUMENT' });
  await t.throwsAsync(openSnapshotStore(resolveStoreConfig({ url: 'http://x/' }, {})), { code: 'INVALID_ARGUMENT' });
  t.throws(() => resolveStoreConfig({}, { LOCKSTEP_STORE_CHUNK_MIB: '0' }), { code: 'CONFIG_INVALID' });
  t.throws(() => resolveStoreConfig({}, { LOCKSTEP_S3_ACCESS_KEY_ID: 'a' }), { code: 'CONFIG_INVALID' });
  t.throws(() => resolveStoreConfig({}, { LOCKSTEP_S3_FORCE_PATH_STYLE: 'yes' }), { code: 'CONFIG_INVALID' });
});

test.serial(
  'a put killed with SIGKILL halfway is resumed by the next put, which sends only the missing chunks',
  async (t) => {
    t.timeout(300_000);
    const root = freshRoot(t);
    const cli = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../bin/lockstep.js');
    const size = 64 * MiB;
    const child = spawn(process.execPath, [cli, 'store', 'put', 'killed', '--store', root, '--json'], {
      stdio: ['pipe', 'ignore', 'ignore'],
    });
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      child.once('exit', (_code, signal) => resolve(signal)),
    );
    t.teardown(() => child.kill('SIGKILL'));
    randomStream('killed', size)
      .pipe(child.stdin)
      .on('error', () => undefined);
    const chunkCount = () => {
      const top = path.join(root, 'chunks');
      return fs.existsSync(top)
        ? fs.readdirSync(top).reduce((n, f) => n + fs.readdirSync(path.join(top, f)).length, 0)
        : 0;
    };
    let gone = false;
    void exited.then(() => (gone = true));
    while (chunkCount() < 3 && !gone) await new Promise((r) => setTimeout(r, 10));
    t.false(gone, 'the put ended on its own before three chunks were stored');
    child.kill('SIGKILL');
    t.is(await exited, 'SIGKILL');
    const stored = chunkCount();
    t.true(stored >= 3 && stored < size / CHUNK, `${stored} chunks stored before the kill`);
    const store = new DirSnapshotStore(root, { chunkBytes: CHUNK });
    await t.throwsAsync(store.stat('killed'), { code: 'BUNDLE_NOT_FOUND' });
    const resumed = await store.put('killed', randomStream('killed', size));
    t.like(resumed, { skippedChunks: stored, uploadedChunks: size / CHUNK - stored });
    t.deepEqual(await digestOf(await store.get('killed')), await digestOf(randomStream('killed', size)));
  },
);
