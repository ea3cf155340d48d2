/**
 * The snapshot store: where portable bundles (byte streams made by a
 * snapshot export) live between hosts. One interface, two backends
 * (src/snapshots/s3-store.ts, src/snapshots/dir-store.ts), one algorithm:
 *
 * - a bundle is cut into fixed-size chunks; each is stored once, under its
 *   SHA-256 (`chunks/<sha256>`), so a chunk already present is never sent
 *   again: a second put of a mostly-equal bundle, or the re-run of an
 *   interrupted put, uploads only what is missing;
 * - a manifest per name lists the chunks in order with the whole stream's
 *   digest; it is written last, so a name exists only once all its chunks do;
 * - `get` re-hashes every chunk before handing its bytes on and fails with
 *   BUNDLE_CORRUPT naming the chunk; nothing unverified leaves the store;
 * - memory stays at a few chunks whatever the bundle's size (reading one
 *   chunk while `concurrency` uploads run, one chunk read ahead on get).
 *
 * The store is the operator's: it does not authorise. Callers that serve
 * tenants scope names by tenant (`<tenantId>/<name>`) and check access first.
 */
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { InvalidArgumentError, LockstepError, NotFoundError } from '../errors.js';

/** Default chunk size: large enough that per-object overhead is small, small enough to hold a few in memory. */
export const DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024;
/** Uploads in flight at once during a put (each holds one chunk in memory). */
export const DEFAULT_UPLOAD_CONCURRENCY = 3;
/** The manifest format this code writes and reads. */
export const MANIFEST_VERSION = 1;

/** How far a put has come, reported after each chunk. */
export interface PutProgress {
  /** Bytes of the bundle read so far. */
  bytes: number;
  /** Chunks cut so far. */
  chunks: number;
  uploadedChunks: number;
  skippedChunks: number;
}

/** What a put stored. */
export interface PutResult {
  /** `sha256:<hex>` of the whole stream. */
  digest: string;
  bytes: number;
  chunks: number;
  /** Chunks sent to the store by this put. */
  uploadedChunks: number;
  /** Chunks the store already held (from another bundle, or an interrupted put of this one). */
  skippedChunks: number;
}

/** What the store knows about a name, without reading its chunks. */
export interface BundleStat {
  name: string;
  digest: string;
  bytes: number;
  chunks: number;
  chunkBytes: number;
  createdAt: string;
}

export interface PutOptions {
  signal?: AbortSignal;
  onProgress?: (p: PutProgress) => void;
}

export interface GetOptions {
  signal?: AbortSignal;
}

/** A store of named, content-addressed bundles. */
export interface SnapshotStore {
  /** Reads `body` to its end and stores it under `name` (replacing what was there). */
  put(name: string, body: Readable, opts?: PutOptions): Promise<PutResult>;
  /** The bundle's bytes, verified chunk by chunk; the stream errors with BUNDLE_CORRUPT on a bad chunk. */
  get(name: string, opts?: GetOptions): Promise<Readable>;
  stat(name: string): Promise<BundleStat>;
  /** Names (with their stat), sorted, optionally only those starting with `prefix`. */
  list(prefix?: string): Promise<BundleStat[]>;
  /** Removes the name. Its chunks stay (other bundles may share them) until `collectGarbage`. */
  delete(name: string): Promise<void>;
  /**
   * Removes chunks no manifest lists and older than `graceMs` (default one
   * hour): the grace keeps chunks a put in progress has stored or found but
   * not yet listed in a manifest.
   */
  collectGarbage(opts?: { graceMs?: number }): Promise<{ removedChunks: number; removedBytes: number }>;
  /**
   * The tenant's part of the store (`tenants/<tenant>/`): its own names and
   * chunks. Closing it does not close this store.
   */
  forTenant(tenant: string): SnapshotStore;
  /** Tenants that have a part in this store (for garbage collection). */
  tenants(): Promise<string[]>;
  /** Where the bundles are, for messages. */
  readonly location: string;
  /** Releases connections; idempotent. */
  close(): void;
}

/** One chunk of a manifest. */
export interface ManifestChunk {
  sha256: string;
  bytes: number;
}

/** The object stored per name. */
export interface Manifest {
  version: typeof MANIFEST_VERSION;
  name: string;
  digest: string;
  bytes: number;
  chunkBytes: number;
  chunks: ManifestChunk[];
  createdAt: string;
}

/** A chunk as a backend holds it. */
export interface StoredChunk {
  sha256: string;
  bytes: number;
  /** When it was written (for the garbage collector's grace period). */
  modifiedMs: number;
}

/**
 * What a backend provides: named manifests and hash-named chunks. The
 * algorithm above them (chunking, dedup, verification) is ChunkedStore's.
 */
export interface ChunkBackend {
  /** A human-readable location for messages (`s3://bucket/prefix`, a folder). */
  readonly location: string;
  /** Size of the stored chunk, or undefined when absent. */
  chunkSize(sha256: string): Promise<number | undefined>;
  /** Stores the chunk atomically: a reader sees all of it or nothing. */
  putChunk(sha256: string, data: Buffer, signal?: AbortSignal): Promise<void>;
  /** The chunk's bytes, or undefined when absent. */
  getChunk(sha256: string, signal?: AbortSignal): Promise<Buffer | undefined>;
  listChunks(): Promise<StoredChunk[]>;
  deleteChunk(sha256: string): Promise<void>;
  putManifest(name: string, body: Buffer): Promise<void>;
  getManifest(name: string): Promise<Buffer | undefined>;
  /** Names of every manifest starting with `prefix`. */
  listManifests(prefix: string): Promise<string[]>;
  deleteManifest(name: string): Promise<void>;
  /** Called before a put: a backend removes what interrupted puts left (dangling multipart uploads). */
  beforePut?(signal?: AbortSignal): Promise<void>;
  /**
   * The same store narrowed to `tenants/<tenant>/`: chunks and manifests of
   * its own, so that one tenant's bundles share nothing with another's (no
   * chunk read, overwritten or even found by another tenant's put).
   */
  scoped(tenant: string): ChunkBackend;
  /** Tenants that have a scope in this store. */
  listScopes(): Promise<string[]>;
}

const TENANT_ID = /^tn_[a-z0-9]{1,64}$/;

/** A tenant id usable as a store scope (`tn_…`); anything else is refused before it reaches a key or a path. */
export function validateTenantScope(tenant: unknown): string {
  if (typeof tenant !== 'string' || !TENANT_ID.test(tenant))
    throw new InvalidArgumentError('tenant', 'a tenant id (tn_ and lowercase letters or digits)', tenant);
  return tenant;
}

/** A chunk's bytes are not what its manifest says, or it is missing: the bundle cannot be read whole. */
export class BundleCorruptError extends LockstepError {
  constructor(name: string, chunk: { index: number; sha256: string }, reason: string, location: string) {
    super(
      'BUNDLE_CORRUPT',
      `Bundle ${JSON.stringify(name)}: chunk ${chunk.index} (${chunk.sha256}) ${reason} ` +
        `(object chunks/${chunk.sha256} of ${location}; remove it and put the bundle again to repair)`,
      { details: { name, chunk: chunk.index, sha256: chunk.sha256, reason, location } },
    );
  }
}

/** A put or get stopped by its AbortSignal; what a put stored so far is reused by the next put. */
export class TransferAbortedError extends LockstepError {
  constructor(what: string, cause?: unknown) {
    super('TRANSFER_ABORTED', `${what} was aborted`, { cause });
  }
}

/** The store itself failed (unreachable, refused, out of room); the cause has the backend's error. */
export class StoreUnavailableError extends LockstepError {
  constructor(location: string, what: string, cause: unknown) {
    const why = cause instanceof Error ? cause.message : String(cause);
    super('STORE_UNAVAILABLE', `Snapshot store ${location}: ${what} failed: ${why}`, {
      cause,
      details: { location },
    });
  }
}

const NAME_SEGMENT = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/**
 * A bundle name: `/`-separated segments of letters, digits, `.`, `_`, `-`,
 * none starting with a dot (so no `..`), at most 512 characters in all.
 */
export function validateBundleName(name: unknown, field = 'name'): string {
  const expected = 'segments of [A-Za-z0-9._-] separated by "/", each starting with a letter or digit, ≤ 512 chars';
  if (typeof name !== 'string' || name.length === 0 || name.length > 512)
    throw new InvalidArgumentError(field, expected, name);
  if (!name.split('/').every((s) => NAME_SEGMENT.test(s))) throw new InvalidArgumentError(field, expected, name);
  return name;
}

/** A prefix of names: like a name, but may be empty or end in `/` or mid-segment. */
export function validatePrefix(prefix: unknown): string {
  if (prefix === undefined || prefix === '') return '';
  if (
    typeof prefix !== 'string' ||
    prefix.length > 512 ||
    !/^[A-Za-z0-9._/-]+$/.test(prefix) ||
    /(^|\/)\./.test(prefix)
  )
    throw new InvalidArgumentError('prefix', 'the start of a bundle name', prefix);
  return prefix;
}

const SHA256_HEX = /^[0-9a-f]{64}$/;

/** True for a chunk key: 64 lowercase hex digits. */
export function isChunkHash(s: string): boolean {
  return SHA256_HEX.test(s);
}

function abortReason(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

function isAbort(e: unknown): boolean {
  return e instanceof Error && (e.name === 'AbortError' || (e as { code?: string }).code === 'ABORT_ERR');
}

/**
 * Cuts a stream into chunks of exactly `size` bytes (the last may be
 * shorter). Holds one chunk being filled; yields each as it fills.
 */
export async function* cutChunks(body: AsyncIterable<Buffer | string>, size: number): AsyncGenerator<Buffer> {
  let current = Buffer.allocUnsafe(size);
  let filled = 0;
  for await (const piece of body) {
    let data = typeof piece === 'string' ? Buffer.from(piece) : piece;
    while (data.length > 0) {
      const n = Math.min(size - filled, data.length);
      data.copy(current, filled, 0, n);
      filled += n;
      data = data.subarray(n);
      if (filled === size) {
        yield current;
        current = Buffer.allocUnsafe(size);
        filled = 0;
      }
    }
  }
  if (filled > 0) yield current.subarray(0, filled);
}

/** Parses and checks a manifest read from a backend. */
function parseManifest(name: string, raw: Buffer, location: string): Manifest {
  let m: Manifest;
  try {
    m = JSON.parse(raw.toString('utf8')) as Manifest;
  } catch (e) {
    throw new LockstepError(
      'BUNDLE_CORRUPT',
      `Bundle ${JSON.stringify(name)} in ${location}: the manifest is not JSON`,
      {
        cause: e,
        details: { name },
      },
    );
  }
  const ok =
    m &&
    m.version === MANIFEST_VERSION &&
    m.name === name &&
    typeof m.digest === 'string' &&
    Number.isSafeInteger(m.bytes) &&
    Array.isArray(m.chunks) &&
    m.chunks.every((c) => isChunkHash(c?.sha256) && Number.isSafeInteger(c.bytes) && c.bytes > 0) &&
    m.chunks.reduce((n, c) => n + c.bytes, 0) === m.bytes;
  if (!ok)
    throw new LockstepError(
      'BUNDLE_CORRUPT',
      `Bundle ${JSON.stringify(name)} in ${location}: the manifest is not a version-${MANIFEST_VERSION} manifest of that name whose chunks add up to its size`,
      { details: { name } },
    );
  return m;
}

function statOf(m: Manifest): BundleStat {
  return {
    name: m.name,
    digest: m.digest,
    bytes: m.bytes,
    chunks: m.chunks.length,
    chunkBytes: m.chunkBytes,
    createdAt: m.createdAt,
  };
}

export interface ChunkedStoreOptions {
  /** Chunk size in bytes (default 8 MiB); at least 64 KiB. */
  chunkBytes?: number;
  /** Uploads in flight during a put (default 3). */
  concurrency?: number;
}

/** The store's algorithm over a backend: chunking, dedup by hash, verification on read. */
export class ChunkedStore implements SnapshotStore {
  readonly chunkBytes: number;
  readonly concurrency: number;

  constructor(
    protected readonly backend: ChunkBackend,
    opts: ChunkedStoreOptions = {},
  ) {
    const chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
    if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 64 * 1024 || chunkBytes > 4 * 1024 * 1024 * 1024)
      throw new InvalidArgumentError('chunkBytes', 'an integer from 65536 (64 KiB) to 4 GiB', chunkBytes);
    const concurrency = opts.concurrency ?? DEFAULT_UPLOAD_CONCURRENCY;
    if (!Number.isSafeInteger(concurrency) || concurrency < 1 || concurrency > 64)
      throw new InvalidArgumentError('concurrency', 'an integer from 1 to 64', concurrency);
    this.chunkBytes = chunkBytes;
    this.concurrency = concurrency;
  }

  /** Where the bundles are (for messages). */
  get location(): string {
    return this.backend.location;
  }

  /** Runs a backend call, turning its failures into typed errors. */
  private async call<T>(what: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      if (e instanceof LockstepError) throw e;
      if (isAbort(e) || abortReason(signal)) throw new TransferAbortedError(what, e);
      throw new StoreUnavailableError(this.backend.location, what, e);
    }
  }

  async put(name: string, body: Readable, opts: PutOptions = {}): Promise<PutResult> {
    validateBundleName(name);
    const { signal } = opts;
    const what = `put of ${JSON.stringify(name)}`;
    if (signal?.aborted) throw new TransferAbortedError(what, signal.reason);
    if (this.backend.beforePut)
      await this.call(`${what} (clean-up of interrupted uploads)`, () => this.backend.beforePut!(signal), signal);
    const whole = createHash('sha256');
    const chunks: ManifestChunk[] = [];
    const progress: PutProgress = { bytes: 0, chunks: 0, uploadedChunks: 0, skippedChunks: 0 };
    const inFlight = new Set<Promise<void>>();
    let failure: unknown;
    const store = async (sha256: string, data: Buffer): Promise<void> => {
      const have = await this.call(`${what}: look-up of chunk ${sha256}`, () => this.backend.chunkSize(sha256), signal);
      if (have === data.length) progress.skippedChunks++;
      else {
        // A chunk of another size under this hash is a damaged object: replace it.
        await this.call(
          `${what}: upload of chunk ${sha256}`,
          () => this.backend.putChunk(sha256, data, signal),
          signal,
        );
        progress.uploadedChunks++;
      }
      opts.onProgress?.({ ...progress });
    };
    const onAbort = () => body.destroy();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for await (const chunk of cutChunks(body, this.chunkBytes)) {
        if (failure) break;
        if (signal?.aborted) throw new TransferAbortedError(what, signal.reason);
        whole.update(chunk);
        const sha256 = createHash('sha256').update(chunk).digest('hex');
        chunks.push({ sha256, bytes: chunk.length });
        progress.bytes += chunk.length;
        progress.chunks++;
        const p: Promise<void> = store(sha256, chunk).then(
          () => void inFlight.delete(p),
          (e: unknown) => {
            inFlight.delete(p);
            failure ??= e;
          },
        );
        inFlight.add(p);
        while (inFlight.size >= this.concurrency && !failure) await Promise.race(inFlight);
      }
      await Promise.all(inFlight);
      if (failure) throw failure;
      if (signal?.aborted) throw new TransferAbortedError(what, signal.reason);
    } catch (e) {
      await Promise.all(inFlight);
      if (e instanceof LockstepError) throw e;
      if (isAbort(e) || signal?.aborted) throw new TransferAbortedError(what, e);
      // The body itself failed (its producer errored): nothing is named, the chunks stay for a retry.
      throw e;
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
    const manifest: Manifest = {
      version: MANIFEST_VERSION,
      name,
      digest: `sha256:${whole.digest('hex')}`,
      bytes: progress.bytes,
      chunkBytes: this.chunkBytes,
      chunks,
      createdAt: new Date().toISOString(),
    };
    await this.call(`${what}: manifest`, () => this.backend.putManifest(name, Buffer.from(JSON.stringify(manifest))));
    return {
      digest: manifest.digest,
      bytes: manifest.bytes,
      chunks: chunks.length,
      uploadedChunks: progress.uploadedChunks,
      skippedChunks: progress.skippedChunks,
    };
  }

  private async manifest(name: string): Promise<Manifest> {
    validateBundleName(name);
    const raw = await this.call(`read of ${JSON.stringify(name)}`, () => this.backend.getManifest(name));
    if (!raw) throw new NotFoundError('bundle', name);
    return parseManifest(name, raw, this.backend.location);
  }

  async stat(name: string): Promise<BundleStat> {
    return statOf(await this.manifest(name));
  }

  async get(name: string, opts: GetOptions = {}): Promise<Readable> {
    const m = await this.manifest(name);
    const { signal } = opts;
    const what = `get of ${JSON.stringify(name)}`;
    const loc = this.backend.location;
    const fetchChunk = async (index: number): Promise<Buffer> => {
      const c = m.chunks[index]!;
      const data = await this.call(`${what}: chunk ${c.sha256}`, () => this.backend.getChunk(c.sha256, signal), signal);
      if (!data) throw new BundleCorruptError(name, { index, sha256: c.sha256 }, 'is missing from the store', loc);
      if (data.length !== c.bytes)
        throw new BundleCorruptError(
          name,
          { index, sha256: c.sha256 },
          `has ${data.length} bytes, not ${c.bytes}`,
          loc,
        );
      if (createHash('sha256').update(data).digest('hex') !== c.sha256)
        throw new BundleCorruptError(name, { index, sha256: c.sha256 }, 'does not hash to its name', loc);
      return data;
    };
    async function* chunks(): AsyncGenerator<Buffer> {
      const whole = createHash('sha256');
      // One chunk read ahead: the next download overlaps the consumer's work on this one.
      let next: Promise<Buffer> | undefined = m.chunks.length ? fetchChunk(0) : undefined;
      next?.catch(() => undefined);
      for (let i = 0; i < m.chunks.length; i++) {
        if (signal?.aborted) throw new TransferAbortedError(what, signal.reason);
        const data = await next!;
        next = i + 1 < m.chunks.length ? fetchChunk(i + 1) : undefined;
        next?.catch(() => undefined);
        whole.update(data);
        if (i === m.chunks.length - 1 && `sha256:${whole.digest('hex')}` !== m.digest)
          throw new LockstepError(
            'BUNDLE_CORRUPT',
            `Bundle ${JSON.stringify(name)}: its chunks do not hash to the manifest's digest`,
            {
              details: { name },
            },
          );
        yield data;
      }
    }
    const stream = Readable.from(chunks(), { objectMode: false, highWaterMark: 1 });
    if (signal) {
      const onAbort = () => stream.destroy(new TransferAbortedError(what, signal.reason));
      if (signal.aborted) onAbort();
      else {
        signal.addEventListener('abort', onAbort, { once: true });
        stream.once('close', () => signal.removeEventListener('abort', onAbort));
      }
    }
    return stream;
  }

  async list(prefix?: string): Promise<BundleStat[]> {
    const p = validatePrefix(prefix);
    const names = await this.call('list', () => this.backend.listManifests(p));
    const out: BundleStat[] = [];
    for (const name of names.sort()) {
      // A name deleted between the listing and the read is skipped, not an error.
      const raw = await this.call(`read of ${JSON.stringify(name)}`, () => this.backend.getManifest(name));
      if (raw) out.push(statOf(parseManifest(name, raw, this.backend.location)));
    }
    return out;
  }

  async delete(name: string): Promise<void> {
    validateBundleName(name);
    const raw = await this.call(`read of ${JSON.stringify(name)}`, () => this.backend.getManifest(name));
    if (!raw) throw new NotFoundError('bundle', name);
    await this.call(`delete of ${JSON.stringify(name)}`, () => this.backend.deleteManifest(name));
  }

  close(): void {}

  forTenant(tenant: string): SnapshotStore {
    const scoped = new ChunkedStore(this.backend.scoped(validateTenantScope(tenant)), {
      chunkBytes: this.chunkBytes,
      concurrency: this.concurrency,
    });
    return scoped;
  }

  async tenants(): Promise<string[]> {
    const all = await this.call('listing of tenants', () => this.backend.listScopes());
    return all.filter((t) => TENANT_ID.test(t)).sort();
  }

  async collectGarbage(opts: { graceMs?: number } = {}): Promise<{ removedChunks: number; removedBytes: number }> {
    const graceMs = opts.graceMs ?? 60 * 60 * 1000;
    if (!Number.isFinite(graceMs) || graceMs < 0)
      throw new InvalidArgumentError('graceMs', 'a number of ms ≥ 0', graceMs);
    // Chunks first, then manifests: a chunk written after the listing is not seen, so it cannot be removed.
    const stored = await this.call('garbage collection: chunk listing', () => this.backend.listChunks());
    const used = new Set<string>();
    for (const name of await this.call('garbage collection: listing', () => this.backend.listManifests(''))) {
      const raw = await this.call(`read of ${JSON.stringify(name)}`, () => this.backend.getManifest(name));
      if (raw) for (const c of parseManifest(name, raw, this.backend.location).chunks) used.add(c.sha256);
    }
    const cutoff = Date.now() - graceMs;
    let removedChunks = 0;
    let removedBytes = 0;
    for (const c of stored) {
      if (used.has(c.sha256) || c.modifiedMs > cutoff) continue;
      await this.call(`garbage collection: delete of chunk ${c.sha256}`, () => this.backend.deleteChunk(c.sha256));
      removedChunks++;
      removedBytes += c.bytes;
    }
    return { removedChunks, removedBytes };
  }
}
