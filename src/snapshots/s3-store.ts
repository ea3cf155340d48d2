/**
 * The snapshot store in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW,
 * R2, ...), through `@aws-sdk/client-s3`. Keys under the configured prefix:
 *
 *   chunks/<sha256>           one object per chunk
 *   manifests/<name>.json     one object per name, written last
 *   tenants/<tn_…>/           a tenant's own store, the same layout
 *
 * A chunk larger than `partBytes` goes up as a multipart upload
 * (`@aws-sdk/lib-storage`'s Upload, parts in parallel); an aborted or
 * failed one is aborted on the server by Upload itself. Uploads a crash
 * left behind are aborted by the next put (ListMultipartUploads, those
 * older than `staleUploadMs`); on servers without that call, a bucket
 * lifecycle rule `AbortIncompleteMultipartUpload` does the same job.
 * An object appears whole or not at all (S3's PUT and CompleteMultipartUpload
 * are atomic), so a chunk that HEAD finds with the right size is complete.
 */
import {
  AbortMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type S3ClientConfig,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../errors.js';
import { ChunkedStore, isChunkHash, type ChunkBackend, type ChunkedStoreOptions, type StoredChunk } from './store.js';

/** S3's smallest part (except the last). */
const MIN_PART_BYTES = 5 * 1024 * 1024;

export interface S3StoreOptions extends ChunkedStoreOptions {
  bucket: string;
  /** Key prefix inside the bucket ("" or ending in "/"). */
  prefix?: string;
  /** An S3-compatible server's URL; unset: AWS's own endpoint for the region. */
  endpoint?: string;
  region?: string;
  /** Path-style URLs (`endpoint/bucket/key`), which most S3-compatible servers need. */
  forcePathStyle?: boolean;
  /** Explicit credentials; unset: the SDK's default chain (AWS_* variables, profiles, web identity). */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** Chunks larger than this go up as multipart uploads of parts this size (default 8 MiB, at least 5 MiB). */
  partBytes?: number;
  /** Multipart uploads older than this are an interrupted put's and are aborted (default 24 h). */
  staleUploadMs?: number;
  /** A client to use instead of one built from the options above (tests count its requests). */
  client?: S3Client;
}

function httpStatus(e: unknown): number | undefined {
  return (e as { $metadata?: { httpStatusCode?: number } })?.$metadata?.httpStatusCode;
}

function isNotFound(e: unknown): boolean {
  const name = (e as Error)?.name;
  return name === 'NotFound' || name === 'NoSuchKey' || httpStatus(e) === 404;
}

/** The S3 client settings Lockstep uses for any S3-compatible server. */
export function s3ClientConfig(opts: S3StoreOptions): S3ClientConfig {
  return {
    region: opts.region ?? 'us-east-1',
    ...(opts.endpoint ? { endpoint: opts.endpoint } : {}),
    forcePathStyle: opts.forcePathStyle ?? opts.endpoint !== undefined,
    ...(opts.credentials ? { credentials: opts.credentials } : {}),
    // Every chunk is verified end to end by its SHA-256 on get; the SDK's
    // default CRC checksums are headers many S3-compatible servers reject.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts: 4,
  };
}

/** S3 backend of the snapshot store. */
export class S3Backend implements ChunkBackend {
  readonly location: string;
  readonly client: S3Client;
  private readonly ownsClient: boolean;
  private readonly bucket: string;
  private readonly prefix: string;
  private readonly partBytes: number;
  private readonly staleUploadMs: number;
  /** False once the server answered that it cannot list multipart uploads. */
  private listsUploads = true;

  constructor(opts: S3StoreOptions) {
    if (typeof opts.bucket !== 'string' || !/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(opts.bucket))
      throw new InvalidArgumentError('bucket', 'an S3 bucket name (3-63 of a-z, 0-9, ".", "-")', opts.bucket);
    const prefix = opts.prefix ?? '';
    if (prefix !== '' && (!prefix.endsWith('/') || prefix.startsWith('/')))
      throw new InvalidArgumentError('prefix', 'empty, or a key prefix ending in "/" (not starting with one)', prefix);
    const partBytes = opts.partBytes ?? 8 * 1024 * 1024;
    if (!Number.isSafeInteger(partBytes) || partBytes < MIN_PART_BYTES)
      throw new InvalidArgumentError('partBytes', `an integer ≥ ${MIN_PART_BYTES} (S3's smallest part)`, partBytes);
    this.bucket = opts.bucket;
    this.prefix = prefix;
    this.partBytes = partBytes;
    this.staleUploadMs = opts.staleUploadMs ?? 24 * 60 * 60 * 1000;
    this.location = `s3://${opts.bucket}/${prefix}`;
    this.ownsClient = opts.client === undefined;
    this.client = opts.client ?? new S3Client(s3ClientConfig(opts));
  }

  private chunkKey(sha256: string): string {
    return `${this.prefix}chunks/${sha256}`;
  }

  private manifestKey(name: string): string {
    return `${this.prefix}manifests/${name}.json`;
  }

  async chunkSize(sha256: string): Promise<number | undefined> {
    try {
      const head = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: this.chunkKey(sha256) }));
      return head.ContentLength;
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  }

  async putChunk(sha256: string, data: Buffer, signal?: AbortSignal): Promise<void> {
    const Key = this.chunkKey(sha256);
    if (data.length <= this.partBytes) {
      await this.client.send(
        new PutObjectCommand({
          Bucket: this.bucket,
          Key,
          Body: data,
          ContentLength: data.length,
          // The server checks the bytes it received against this before storing them.
          ContentMD5: createHash('md5').update(data).digest('base64'),
        }),
        { abortSignal: signal },
      );
      return;
    }
    const abortController = new AbortController();
    const onAbort = () => abortController.abort();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      signal?.throwIfAborted();
      const upload = new Upload({
        client: this.client,
        params: { Bucket: this.bucket, Key, Body: data },
        partSize: this.partBytes,
        queueSize: 2,
        leavePartsOnError: false,
        abortController,
      });
      await upload.done();
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  async getChunk(sha256: string, signal?: AbortSignal): Promise<Buffer | undefined> {
    try {
      const out = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.chunkKey(sha256) }), {
        abortSignal: signal,
      });
      return Buffer.from(await out.Body!.transformToByteArray());
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  }

  /** Every object under `prefix`, page by page. */
  private async *objects(prefix: string): AsyncGenerator<{ key: string; size: number; modifiedMs: number }> {
    let token: string | undefined;
    do {
      const page = await this.client.send(
        new ListObjectsV2Command({ Bucket: this.bucket, Prefix: prefix, ContinuationToken: token }),
      );
      for (const o of page.Contents ?? [])
        if (o.Key) yield { key: o.Key, size: o.Size ?? 0, modifiedMs: o.LastModified?.getTime() ?? 0 };
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
  }

  async listChunks(): Promise<StoredChunk[]> {
    const out: StoredChunk[] = [];
    const base = `${this.prefix}chunks/`;
    for await (const o of this.objects(base)) {
      const sha256 = o.key.slice(base.length);
      if (isChunkHash(sha256)) out.push({ sha256, bytes: o.size, modifiedMs: o.modifiedMs });
    }
    return out;
  }

  async deleteChunk(sha256: string): Promise<void> {
    await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: this.chunkKey(sha256) }));
  }

  async putManifest(name: string, body: Buffer): Promise<void> {
    await this.client.send(
      new PutObjectCommand({
        Bucket: this.bucket,
        Key: this.manifestKey(name),
        Body: body,
        ContentType: 'application/json',
        ContentMD5: createHash('md5').update(body).digest('base64'),
      }),
    );
  }

  async getManifest(name: string): Promise<Buffer | undefined> {
    try {
      const out = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.manifestKey(name) }));
      return Buffer.from(await out.Body!.transformToByteArray());
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  }

  async listManifests(prefix: string): Promise<string[]> {
    const base = `${this.prefix}manifests/`;
    const names: string[] = [];
    for await (const o of this.objects(base + prefix))
      if (o.key.endsWith('.json')) names.push(o.key.slice(base.length, -'.json'.length));
    return names;
  }

  async deleteManifest(name: string): Promise<void> {
    await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: this.manifestKey(name) }));
  }

  scoped(tenant: string): ChunkBackend {
    return new S3Backend({
      bucket: this.bucket,
      prefix: `${this.prefix}tenants/${tenant}/`,
      partBytes: this.partBytes,
      staleUploadMs: this.staleUploadMs,
      client: this.client,
    });
  }

  async listScopes(): Promise<string[]> {
    const base = `${this.prefix}tenants/`;
    const out: string[] = [];
    let token: string | undefined;
    do {
      const page = await this.client.send(
        new ListObjectsV2Command({ Bucket: this.bucket, Prefix: base, Delimiter: '/', ContinuationToken: token }),
      );
      for (const p of page.CommonPrefixes ?? []) if (p.Prefix) out.push(p.Prefix.slice(base.length, -1));
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return out;
  }

  /**
   * Aborts the multipart uploads of chunks that an interrupted put left
   * (a killed process never reaches Upload's own abort). Only uploads older
   * than `staleUploadMs` are touched: a younger one may be another put's.
   */
  async beforePut(signal?: AbortSignal): Promise<void> {
    if (!this.listsUploads) return;
    const cutoff = Date.now() - this.staleUploadMs;
    let keyMarker: string | undefined;
    let uploadIdMarker: string | undefined;
    do {
      let page;
      try {
        page = await this.client.send(
          new ListMultipartUploadsCommand({
            Bucket: this.bucket,
            Prefix: `${this.prefix}chunks/`,
            KeyMarker: keyMarker,
            UploadIdMarker: uploadIdMarker,
          }),
          { abortSignal: signal },
        );
      } catch (e) {
        const status = httpStatus(e);
        if ((e as Error)?.name === 'NotImplemented' || status === 501 || status === 405) {
          this.listsUploads = false;
          return;
        }
        throw e;
      }
      for (const u of page.Uploads ?? []) {
        if (!u.Key || !u.UploadId || (u.Initiated?.getTime() ?? 0) > cutoff) continue;
        await this.client.send(
          new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: u.Key, UploadId: u.UploadId }),
        );
      }
      keyMarker = page.IsTruncated ? page.NextKeyMarker : undefined;
      uploadIdMarker = page.IsTruncated ? page.NextUploadIdMarker : undefined;
    } while (keyMarker);
  }

  /** Closes the client's connections (when the store made the client). */
  close(): void {
    if (this.ownsClient) this.client.destroy();
  }
}

/** A snapshot store in an S3-compatible bucket. */
export class S3SnapshotStore extends ChunkedStore {
  private readonly s3: S3Backend;
  constructor(opts: S3StoreOptions) {
    const backend = new S3Backend(opts);
    super(backend, opts);
    this.s3 = backend;
  }

  /** The S3 client (for tests and for sharing its connection pool). */
  get client(): S3Client {
    return this.s3.client;
  }

  override close(): void {
    this.s3.close();
  }
}
