/**
 * What every snapshot store must do, as one set of tests run against each
 * backend (test/integration/s3-store.test.ts, dir-store.test.ts): exact
 * bytes back, chunks sent once, interrupted puts resumed, corruption found
 * on get and named, memory bounded whatever the bundle's size.
 */
import { createCipheriv, createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type { TestFn } from 'ava';
import type { LockstepError } from '../../src/errors.js';
import type { SnapshotStore } from '../../src/snapshots/store.js';

const MiB = 1024 * 1024;

/** A byte edit applied to a generated stream. */
export interface Edit {
  offset: number;
  xor: number;
}

/**
 * `bytes` pseudo-random bytes determined by `seed` (AES-256-CTR of zeros),
 * produced 1 MiB at a time, with `edits` applied: the same arguments give
 * the same bytes, so a test can regenerate what it stored.
 */
export function randomStream(seed: string, bytes: number, edits: Edit[] = []): Readable {
  const key = createHash('sha256').update(seed).digest();
  const cipher = createCipheriv('aes-256-ctr', key, Buffer.alloc(16));
  const zeros = Buffer.alloc(MiB);
  let made = 0;
  return new Readable({
    highWaterMark: MiB,
    read() {
      if (made >= bytes) {
        this.push(null);
        return;
      }
      const n = Math.min(MiB, bytes - made);
      const piece = cipher.update(zeros.subarray(0, n));
      for (const e of edits) if (e.offset >= made && e.offset < made + n) piece[e.offset - made]! ^= e.xor;
      made += n;
      this.push(piece);
    },
  });
}

/** SHA-256 and length of a stream, read to its end. */
export async function digestOf(stream: Readable): Promise<{ digest: string; bytes: number }> {
  const h = createHash('sha256');
  let bytes = 0;
  for await (const piece of stream) {
    h.update(piece as Buffer);
    bytes += (piece as Buffer).length;
  }
  return { digest: `sha256:${h.digest('hex')}`, bytes };
}

/** What a backend's test file gives the shared tests. */
export interface StoreFixture {
  store: SnapshotStore;
  chunkBytes: number;
  /** Number of chunk objects the backend holds now. */
  chunkObjects(): Promise<number>;
  /** Overwrites the stored chunk with other bytes, behind the store's back. */
  corruptChunk(sha256: string, mutate: (data: Buffer) => Buffer): Promise<void>;
  /** Removes the stored chunk behind the store's back. */
  removeChunk(sha256: string): Promise<void>;
  /** Chunk hashes of a stored name, in order (read from its manifest). */
  chunksOf(name: string): Promise<string[]>;
}

/** Registers the shared tests on `test`, each against the fixture `setup` gives. */
export function storeBehaviour(test: TestFn, setup: () => Promise<StoreFixture>): void {
  test.serial('put then get returns a 64 MiB random stream byte for byte', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    const size = 64 * MiB;
    const expected = await digestOf(randomStream('a', size));
    const put = await f.store.put('runs/a', randomStream('a', size));
    t.deepEqual(put, {
      digest: expected.digest,
      bytes: size,
      chunks: size / f.chunkBytes,
      uploadedChunks: size / f.chunkBytes,
      skippedChunks: 0,
    });
    t.deepEqual(await digestOf(await f.store.get('runs/a')), expected);
    const stat = await f.store.stat('runs/a');
    t.like(stat, { name: 'runs/a', digest: expected.digest, bytes: size, chunks: size / f.chunkBytes });
    // An odd size: the last chunk is short, and still comes back exactly.
    const odd = 3 * f.chunkBytes + 12345;
    const oddPut = await f.store.put('runs/odd', randomStream('odd', odd));
    t.is(oddPut.chunks, 4);
    t.deepEqual(await digestOf(await f.store.get('runs/odd')), await digestOf(randomStream('odd', odd)));
  });

  test.serial('a second put with one chunk changed uploads that one chunk', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    const size = 64 * MiB;
    await f.store.put('base', randomStream('b', size));
    const before = await f.chunkObjects();
    const edits = [{ offset: 2 * f.chunkBytes + 777, xor: 0xff }];
    const second = await f.store.put('edited', randomStream('b', size, edits));
    t.is(second.uploadedChunks, 1);
    t.is(second.skippedChunks, size / f.chunkBytes - 1);
    t.is(await f.chunkObjects(), before + 1);
    t.deepEqual(await digestOf(await f.store.get('edited')), await digestOf(randomStream('b', size, edits)));
    t.deepEqual(await digestOf(await f.store.get('base')), await digestOf(randomStream('b', size)));
    // The same bytes again: nothing is uploaded.
    const again = await f.store.put('edited-again', randomStream('b', size, edits));
    t.is(again.uploadedChunks, 0);
  });

  test.serial('an interrupted put leaves no name, and the re-run uploads only what was missing', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    const size = 64 * MiB;
    const total = size / f.chunkBytes;
    const ac = new AbortController();
    const err = await t.throwsAsync<LockstepError>(
      f.store.put('interrupted', randomStream('c', size), {
        signal: ac.signal,
        onProgress: (p) => {
          if (p.uploadedChunks >= 3) ac.abort();
        },
      }),
    );
    t.is(err?.code, 'TRANSFER_ABORTED');
    await t.throwsAsync(f.store.stat('interrupted'), { code: 'BUNDLE_NOT_FOUND' });
    const stored = await f.chunkObjects();
    t.true(stored >= 3 && stored < total, `${stored} chunks stored before the abort`);
    const resumed = await f.store.put('interrupted', randomStream('c', size));
    t.is(resumed.skippedChunks, stored);
    t.is(resumed.uploadedChunks, total - stored);
    t.deepEqual(await digestOf(await f.store.get('interrupted')), await digestOf(randomStream('c', size)));
  });

  test.serial('a corrupted or missing chunk is found on get and named; the bytes before it are exact', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    const size = 4 * f.chunkBytes;
    await f.store.put('damaged', randomStream('d', size));
    const chunks = await f.chunksOf('damaged');
    await f.corruptChunk(chunks[2]!, (data) => {
      data[1000]! ^= 1;
      return data;
    });
    const received: Buffer[] = [];
    const stream = await f.store.get('damaged');
    const err = await t.throwsAsync<LockstepError>(async () => {
      for await (const piece of stream) received.push(piece as Buffer);
    });
    t.is(err?.code, 'BUNDLE_CORRUPT');
    t.like(err?.details, { name: 'damaged', chunk: 2, sha256: chunks[2] });
    t.regex(err!.message, new RegExp(`chunk 2 \\(${chunks[2]}\\) does not hash to its name`));
    // Only verified chunks left the store: the first two, exactly.
    const got = Buffer.concat(received);
    t.is(got.length, 2 * f.chunkBytes);
    const original = await digestOf(randomStream('d', 2 * f.chunkBytes));
    t.is(`sha256:${createHash('sha256').update(got).digest('hex')}`, original.digest);

    // Truncated: the size differs.
    await f.corruptChunk(chunks[1]!, (data) => data.subarray(0, 100));
    const e2 = await t.throwsAsync<LockstepError>(digestOf(await f.store.get('damaged')));
    t.is(e2?.code, 'BUNDLE_CORRUPT');
    t.like(e2?.details, { chunk: 1, reason: `has 100 bytes, not ${f.chunkBytes}` });

    await f.removeChunk(chunks[0]!);
    const e3 = await t.throwsAsync<LockstepError>(digestOf(await f.store.get('damaged')));
    t.like(e3?.details, { chunk: 0, reason: 'is missing from the store' });
    // A put of the same bytes sends the missing chunk and replaces the truncated one
    // (its size is wrong); a chunk damaged in place at the same size is only found by get.
    const repaired = await f.store.put('damaged', randomStream('d', size));
    t.is(repaired.uploadedChunks, 2);
    const e4 = await t.throwsAsync<LockstepError>(digestOf(await f.store.get('damaged')));
    t.like(e4?.details, { chunk: 2 });
    // The remedy the error points to: remove the object it names, and put again.
    await f.removeChunk(chunks[2]!);
    t.is((await f.store.put('damaged', randomStream('d', size))).uploadedChunks, 1);
    t.deepEqual(await digestOf(await f.store.get('damaged')), await digestOf(randomStream('d', size)));
  });

  test.serial('an aborted get ends the stream with TRANSFER_ABORTED after the chunks already verified', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    await f.store.put('aborted-get', randomStream('h', 4 * f.chunkBytes));
    const ac = new AbortController();
    const stream = await f.store.get('aborted-get', { signal: ac.signal });
    let received = 0;
    const err = await t.throwsAsync<LockstepError>(async () => {
      for await (const piece of stream) {
        received += (piece as Buffer).length;
        if (received >= f.chunkBytes) ac.abort();
      }
    });
    t.is(err?.code, 'TRANSFER_ABORTED');
    t.true(received >= f.chunkBytes && received < 4 * f.chunkBytes, `${received} bytes before the abort`);
    // The store is untouched: the next get reads it whole.
    t.deepEqual(await digestOf(await f.store.get('aborted-get')), await digestOf(randomStream('h', 4 * f.chunkBytes)));
  });

  test.serial('list, stat, delete and garbage collection; bad names and missing names are typed errors', async (t) => {
    t.timeout(300_000);
    const f = await setup();
    await f.store.put('tn_a/one', randomStream('e1', 2 * f.chunkBytes));
    await f.store.put('tn_a/two', randomStream('e2', f.chunkBytes + 5));
    await f.store.put('tn_b/one', randomStream('e1', 2 * f.chunkBytes));
    t.deepEqual(
      (await f.store.list('tn_a/')).map((s) => s.name),
      ['tn_a/one', 'tn_a/two'],
    );
    t.true((await f.store.list()).length >= 3);
    await f.store.delete('tn_a/one');
    await t.throwsAsync(f.store.stat('tn_a/one'), { code: 'BUNDLE_NOT_FOUND' });
    await t.throwsAsync(f.store.delete('tn_a/one'), { code: 'BUNDLE_NOT_FOUND' });
    await t.throwsAsync(f.store.get('nope'), { code: 'BUNDLE_NOT_FOUND' });
    // Chunks of tn_a/one are shared with tn_b/one: nothing of it may go.
    const chunksBefore = await f.chunkObjects();
    await f.store.delete('tn_a/two');
    const gc = await f.store.collectGarbage({ graceMs: 0 });
    t.is(gc.removedChunks, 2);
    t.is(gc.removedBytes, f.chunkBytes + 5);
    t.is(await f.chunkObjects(), chunksBefore - 2);
    t.deepEqual(await digestOf(await f.store.get('tn_b/one')), await digestOf(randomStream('e1', 2 * f.chunkBytes)));
    // Chunks younger than the grace period stay, listed or not.
    await f.store.delete('tn_b/one');
    t.is((await f.store.collectGarbage()).removedChunks, 0);
    for (const bad of ['', '../x', 'a//b', '.hidden', 'a/../b', 'sp ace', 'x'.repeat(513)])
      await t.throwsAsync(f.store.put(bad, randomStream('f', 10)), { code: 'INVALID_ARGUMENT' }, JSON.stringify(bad));
    await t.throwsAsync(f.store.list('../'), { code: 'INVALID_ARGUMENT' });
  });

  test.serial(
    "memory does not grow with the bundle: a 512 MiB put and get stay within a few chunks' worth",
    async (t) => {
      t.timeout(900_000);
      const f = await setup();
      const size = 512 * MiB;
      globalThis.gc?.();
      const baseline = process.memoryUsage().rss;
      let peak = baseline;
      const sampler = setInterval(() => {
        peak = Math.max(peak, process.memoryUsage().rss);
      }, 20);
      t.teardown(() => clearInterval(sampler));
      const put = await f.store.put('big', randomStream('g', size));
      t.is(put.bytes, size);
      const got = await digestOf(await f.store.get('big'));
      clearInterval(sampler);
      peak = Math.max(peak, process.memoryUsage().rss);
      t.is(got.bytes, size);
      t.is(got.digest, put.digest);
      const grewMiB = (peak - baseline) / MiB;
      t.log(
        `RSS ${Math.round(baseline / MiB)} MiB before, peak ${Math.round(peak / MiB)} MiB (+${grewMiB.toFixed(0)})`,
      );
      // The bundle is 512 MiB. Chunks are 8 MiB: at most 3 uploads in flight plus the one being
      // cut, or one read ahead on get, ~56 MiB of buffers at a time, plus what the garbage
      // collector has not given back yet (16-66 MiB measured). A store that held the bundle
      // would grow by 512 MiB or more.
      t.true(grewMiB < 200, `RSS grew by ${grewMiB.toFixed(0)} MiB for a 512 MiB bundle`);
    },
  );
}
