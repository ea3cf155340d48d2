/**
 * The snapshot bundle's byte format: one stream, written and read in one
 * pass with bounded memory (no part is ever held whole, whatever its size).
 *
 *   "LSBUNDL1"                            8-byte magic and format version
 *   frame*                                each: type (1 byte), length (uint32 BE), payload
 *     H  header, JSON (BundleHeader)      first frame, at most 1 MiB
 *     P  part begins, JSON {name}         then its data:
 *     D  data, at most 1 MiB per frame
 *     E  part ends: SHA-256 (32 bytes) and size (uint64 BE) of its data
 *     Z  end: SHA-256 of every byte before this frame, the bundle's digest
 *     S  signature, JSON {key, signature}: the exporting host's Ed25519
 *        signature of the digest (signing.ts); the last frame
 *
 * Every part is checked against its E frame as it ends, and the whole
 * against Z; a reader refuses (BUNDLE_CORRUPT, naming what was wrong) a
 * truncated stream, a frame it does not know, an oversized frame, a part
 * checksum or a digest that does not match, and bytes after Z. The digest
 * names the bundle's content (it is content-addressed): the same snapshot
 * exported twice gives the same digest when its parts come out the same.
 */
import { createHash, type Hash } from 'node:crypto';
import { LockstepError } from '../errors.js';

export const BUNDLE_MAGIC = Buffer.from('LSBUNDL1', 'latin1');
export const MAX_FRAME = 1 << 20;
const FRAME_TYPES = new Set(['H', 'P', 'D', 'E', 'Z']); // S only after Z
/** Largest signature frame (a key name and a signature are ~150 bytes). */
const MAX_SIGNATURE_FRAME = 4096;

/** The bundle's bytes are not a whole, intact bundle; nothing was imported. */
export class BundleCorruptError extends LockstepError {
  constructor(reason: string, details: Record<string, unknown> = {}) {
    super('BUNDLE_CORRUPT', `The snapshot bundle is corrupt: ${reason}; nothing was imported`, {
      details: { reason, ...details },
    });
  }
}

/** Writes frames, hashing everything it emits so that end() can state the digest. */
export class BundleWriter {
  private readonly whole: Hash = createHash('sha256');
  private started = false;
  /** Bytes emitted so far. */
  bytes = 0;

  private frame(type: string, payload: Buffer): Buffer {
    const head = Buffer.alloc(5);
    head.write(type, 0, 'latin1');
    head.writeUInt32BE(payload.length, 1);
    const parts = this.started ? [head, payload] : [BUNDLE_MAGIC, head, payload];
    this.started = true;
    const out = Buffer.concat(parts);
    this.whole.update(out);
    this.bytes += out.length;
    return out;
  }

  header(header: unknown): Buffer {
    const json = Buffer.from(JSON.stringify(header), 'utf8');
    if (json.length > MAX_FRAME) throw new RangeError('bundle header larger than 1 MiB');
    return this.frame('H', json);
  }

  /** The frames of one part, its data taken from `source` as it comes. */
  async *part(
    name: string,
    source: AsyncIterable<Buffer | Uint8Array | string> | Iterable<Buffer>,
  ): AsyncGenerator<Buffer> {
    yield this.frame('P', Buffer.from(JSON.stringify({ name }), 'utf8'));
    const h = createHash('sha256');
    let size = 0;
    // Frames of exactly MAX_FRAME bytes (the last one shorter), however the source cuts its
    // chunks: the bundle's bytes, and so its digest, depend only on its content.
    const pending = new ByteQueue();
    const emit = (n: number) => {
      const piece = pending.take(n);
      h.update(piece);
      size += piece.length;
      return this.frame('D', piece);
    };
    for await (const c of source) {
      pending.push(typeof c === 'string' ? Buffer.from(c) : Buffer.isBuffer(c) ? c : Buffer.from(c));
      while (pending.length >= MAX_FRAME) yield emit(MAX_FRAME);
    }
    if (pending.length > 0) yield emit(pending.length);
    const end = Buffer.alloc(40);
    h.digest().copy(end, 0);
    end.writeBigUInt64BE(BigInt(size), 32);
    yield this.frame('E', end);
  }

  /**
   * The last frames: the digest, then (given a signer) its signature.
   * Returns them, the bundle's digest (hex) and its length.
   */
  end(sign?: (digest: Buffer) => unknown): { frame: Buffer; digest: string; bytes: number } {
    const digest = this.whole.copy().digest();
    const head = Buffer.alloc(5);
    head.write('Z', 0, 'latin1');
    head.writeUInt32BE(32, 1);
    const frames = [head, digest];
    if (sign) {
      const payload = Buffer.from(JSON.stringify(sign(digest)), 'utf8');
      const sHead = Buffer.alloc(5);
      sHead.write('S', 0, 'latin1');
      sHead.writeUInt32BE(payload.length, 1);
      frames.push(sHead, payload);
    }
    const frame = Buffer.concat(frames);
    this.bytes += frame.length;
    return { frame, digest: digest.toString('hex'), bytes: this.bytes };
  }
}

/** What the reader finds, in stream order. */
export type BundleEvent =
  | { type: 'header'; header: unknown }
  | { type: 'part'; name: string }
  | { type: 'data'; name: string; chunk: Buffer }
  | { type: 'partEnd'; name: string; size: number; sha256: string }
  /** `signature`: the S frame's JSON, undefined for an unsigned bundle; the caller checks it. */
  | { type: 'end'; digest: string; signature: unknown };

/** A byte queue that hands out exact lengths without concatenating more than it must. */
const EMPTY = Buffer.alloc(0);

class ByteQueue {
  private chunks: Buffer[] = [];
  /** Index of the first chunk still queued (no O(n) shift per chunk taken). */
  private head = 0;
  length = 0;
  push(b: Buffer): void {
    if (b.length) {
      this.chunks.push(b);
      this.length += b.length;
    }
  }
  take(n: number): Buffer {
    const out = Buffer.allocUnsafe(n);
    let got = 0;
    while (got < n) {
      const c = this.chunks[this.head]!;
      const k = Math.min(c.length, n - got);
      c.copy(out, got, 0, k);
      got += k;
      if (k === c.length)
        this.chunks[this.head++] = EMPTY; // let go of it now, not at the next compaction
      else this.chunks[this.head] = c.subarray(k);
    }
    if (this.head > 64) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
    this.length -= n;
    return out;
  }
}

/**
 * Parses and verifies a bundle as it streams. Part data is yielded before
 * its part is verified (a consumer writes it to a scratch place and keeps
 * it only once the part's end, and then the bundle's end, have been read).
 */
export async function* readBundle(source: AsyncIterable<Buffer | Uint8Array | string>): AsyncGenerator<BundleEvent> {
  const q = new ByteQueue();
  const whole = createHash('sha256');
  const it = source[Symbol.asyncIterator]();
  let eof = false;
  const fill = async (n: number): Promise<boolean> => {
    while (q.length < n && !eof) {
      const { value, done } = await it.next();
      if (done) eof = true;
      else q.push(typeof value === 'string' ? Buffer.from(value) : Buffer.isBuffer(value) ? value : Buffer.from(value));
    }
    return q.length >= n;
  };
  if (!(await fill(8))) throw new BundleCorruptError('it is too short to be a bundle');
  const magic = q.take(8);
  if (!magic.equals(BUNDLE_MAGIC))
    throw new BundleCorruptError('it does not start with a Lockstep bundle header (magic LSBUNDL1)');
  whole.update(magic);
  let part: { name: string; hash: Hash; size: number } | null = null;
  let sawHeader = false;
  for (;;) {
    if (!(await fill(5))) throw new BundleCorruptError('it ends before its last frame (truncated)');
    const head = q.take(5);
    const type = head.toString('latin1', 0, 1);
    const len = head.readUInt32BE(1);
    if (!FRAME_TYPES.has(type)) throw new BundleCorruptError(`it has a frame of unknown type ${JSON.stringify(type)}`);
    if (len > MAX_FRAME) throw new BundleCorruptError(`it has a frame of ${len} bytes (at most ${MAX_FRAME})`);
    if (!(await fill(len))) throw new BundleCorruptError('it ends inside a frame (truncated)');
    const payload = q.take(len);
    if (type === 'Z') {
      const digest = whole.digest();
      if (part) throw new BundleCorruptError(`it ends inside part ${part.name}`);
      if (len !== 32 || !payload.equals(digest))
        throw new BundleCorruptError('its digest does not match its content (SHA-256 of the bundle)');
      let signature: unknown;
      if (await fill(5)) {
        const sHead = q.take(5);
        const sLen = sHead.readUInt32BE(1);
        if (sHead.toString('latin1', 0, 1) !== 'S' || sLen > MAX_SIGNATURE_FRAME)
          throw new BundleCorruptError('it has bytes after its end');
        if (!(await fill(sLen))) throw new BundleCorruptError('it ends inside its signature (truncated)');
        try {
          signature = JSON.parse(q.take(sLen).toString('utf8'));
        } catch {
          throw new BundleCorruptError('its signature frame is not JSON');
        }
      }
      if (q.length > 0 || (await fill(1))) throw new BundleCorruptError('it has bytes after its end');
      yield { type: 'end', digest: digest.toString('hex'), signature };
      return;
    }
    whole.update(head);
    whole.update(payload);
    if (!sawHeader && type !== 'H') throw new BundleCorruptError('its first frame is not the header');
    switch (type) {
      case 'H': {
        if (sawHeader) throw new BundleCorruptError('it has two headers');
        sawHeader = true;
        let header: unknown;
        try {
          header = JSON.parse(payload.toString('utf8'));
        } catch {
          throw new BundleCorruptError('its header is not JSON');
        }
        yield { type: 'header', header };
        break;
      }
      case 'P': {
        if (part) throw new BundleCorruptError(`part ${part.name} has no end`);
        let name: unknown;
        try {
          name = (JSON.parse(payload.toString('utf8')) as { name?: unknown }).name;
        } catch {
          name = undefined;
        }
        if (typeof name !== 'string' || !name) throw new BundleCorruptError('a part has no name');
        part = { name, hash: createHash('sha256'), size: 0 };
        yield { type: 'part', name };
        break;
      }
      case 'D': {
        if (!part) throw new BundleCorruptError('it has data outside any part');
        part.hash.update(payload);
        part.size += payload.length;
        yield { type: 'data', name: part.name, chunk: payload };
        break;
      }
      case 'E': {
        if (!part) throw new BundleCorruptError('a part ends that never began');
        if (len !== 40) throw new BundleCorruptError(`the end of part ${part.name} is malformed`);
        const sha = part.hash.digest();
        const size = Number(payload.readBigUInt64BE(32));
        if (size !== part.size || !payload.subarray(0, 32).equals(sha))
          throw new BundleCorruptError(`part ${part.name} does not match its SHA-256`, { part: part.name });
        yield { type: 'partEnd', name: part.name, size, sha256: sha.toString('hex') };
        part = null;
        break;
      }
    }
  }
}
