/** Named snapshots of the calling tenant, over HTTP: the SDK's `ls.snapshots` shape. */
import { Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import type { WireForkResults } from '../http/fork-results.js';
import { forkResultsFromWire, type RemoteForkResult } from './fork-results.js';
import type { SnapshotInfo } from '../snapshots/snapshot-rows.js';
import type { PullReport } from '../snapshots/pull.js';
import type { PushReport, StorePullReport } from '../snapshots/transfer.js';
import type { BundleStat } from '../snapshots/store.js';
import type { Answer, Body, Checked } from './wire.js';
import { Transport, type CallOptions, type ConnectionOptions } from './transport.js';

const enc = encodeURIComponent;

/** What a pull did, as the API reports it. */
export type RemotePullResult = Omit<PullReport, 'snapshot'> & { snapshot: SnapshotInfo };
/** What a pull from the snapshot store did, as the API reports it. */
export type RemoteStorePullResult = Omit<StorePullReport, 'snapshot'> & { snapshot: SnapshotInfo };

/** The tenant's snapshots on one server. */
export class Snapshots {
  /** @internal */
  readonly transport: Transport;

  constructor(opts: ConnectionOptions = {}) {
    this.transport = new Transport(opts);
  }

  /** Promotes a checkpoint of one of the tenant's sandboxes to a snapshot. */
  async create(
    checkpointId: string,
    opts: { name?: string | undefined; metadata?: Record<string, string> | undefined } & CallOptions = {},
  ): Promise<SnapshotInfo> {
    const { signal, idempotencyKey, ...body } = opts;
    return this.transport.json<Checked<SnapshotInfo, Answer<'/v1/snapshots', 'post', 201>>>({
      method: 'POST',
      path: '/snapshots',
      body: { json: { checkpointId, ...body } satisfies Body<'/v1/snapshots', 'post'> },
      signal,
      idempotencyKey,
    });
  }

  async list(opts: CallOptions = {}): Promise<SnapshotInfo[]> {
    return this.transport.json<Checked<SnapshotInfo, Answer<'/v1/snapshots', 'get'>[number]>[]>({
      method: 'GET',
      path: '/snapshots',
      signal: opts.signal,
    });
  }

  async get(ref: string, opts: CallOptions = {}): Promise<SnapshotInfo> {
    return this.transport.json<Checked<SnapshotInfo, Answer<'/v1/snapshots/{snap}', 'get'>>>({
      method: 'GET',
      path: `/snapshots/${enc(ref)}`,
      signal: opts.signal,
    });
  }

  async delete(ref: string, opts: CallOptions = {}): Promise<void> {
    await this.transport.send({ method: 'DELETE', path: `/snapshots/${enc(ref)}`, signal: opts.signal });
  }

  /** The context stored with the snapshot (JSON; "bytes" contexts as base64 text). */
  async context(ref: string, opts: CallOptions = {}): Promise<unknown> {
    const r = await this.transport.json<
      Checked<{ context: Record<string, unknown> | null }, Answer<'/v1/snapshots/{snap}/context', 'get'>>
    >({
      method: 'GET',
      path: `/snapshots/${enc(ref)}/context`,
      signal: opts.signal,
    });
    return r.context;
  }

  /** Starts sandboxes from it; one result each, in order (connect with Sandbox.connect(id)). */
  async start(ref: string, opts: { count?: number | undefined } & CallOptions = {}): Promise<RemoteForkResult[]> {
    const r = await this.transport.json<Checked<WireForkResults, Answer<'/v1/snapshots/{snap}/sandboxes', 'post'>>>({
      method: 'POST',
      path: `/snapshots/${enc(ref)}/sandboxes`,
      body: {
        json: (opts.count !== undefined ? { count: opts.count } : {}) satisfies Body<
          '/v1/snapshots/{snap}/sandboxes',
          'post'
        >,
      },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
    return forkResultsFromWire(r);
  }

  /** The snapshot's bundle as a stream; a failed request is the stream's error. */
  export(ref: string, opts: CallOptions = {}): Readable {
    const t = this.transport;
    async function* body(): AsyncGenerator<Buffer> {
      const res = await t.send({
        method: 'GET',
        path: `/snapshots/${enc(ref)}/bundle`,
        accept: 'application/octet-stream',
        signal: opts.signal,
      });
      for await (const c of Readable.fromWeb(res.body! as WebReadableStream<Uint8Array>)) yield c as Buffer;
    }
    return Readable.from(body(), { objectMode: false });
  }

  /** Uploads a bundle stream; the server keeps nothing unless all of it verifies. */
  async import(
    stream: AsyncIterable<Uint8Array | string>,
    opts: { name?: string | undefined } & CallOptions = {},
  ): Promise<SnapshotInfo> {
    return this.transport.json<Checked<SnapshotInfo, Answer<'/v1/snapshots/import', 'post', 201>>>({
      method: 'POST',
      path: '/snapshots/import',
      query: { name: opts.name },
      body: { stream },
      signal: opts.signal,
      idempotencyKey: opts.idempotencyKey,
    });
  }

  /** Makes the server pull a snapshot from another server (`from`, with a token of the tenant there). */
  async pull(
    opts: { from: string; snapshot: string; token: string; name?: string | undefined } & CallOptions,
  ): Promise<RemotePullResult>;
  /** Makes the server import the bundle stored under `key` in the tenant's part of its snapshot store. */
  async pull(key: string, opts?: { name?: string | undefined } & CallOptions): Promise<RemoteStorePullResult>;
  async pull(
    a: ({ from: string; snapshot: string; token: string; name?: string | undefined } & CallOptions) | string,
    b: { name?: string | undefined } & CallOptions = {},
  ): Promise<RemotePullResult | RemoteStorePullResult> {
    if (typeof a === 'string') {
      const { signal, idempotencyKey, ...body } = b;
      return this.transport.json<Checked<RemoteStorePullResult, Answer<'/v1/store/bundles/{key}/pull', 'post', 201>>>({
        method: 'POST',
        path: `/store/bundles/${enc(a)}/pull`,
        body: { json: body satisfies Body<'/v1/store/bundles/{key}/pull', 'post'> },
        signal,
        idempotencyKey,
      });
    }
    const { signal, idempotencyKey, ...body } = a;
    return this.transport.json<Checked<RemotePullResult, Answer<'/v1/snapshots/pull', 'post', 201>>>({
      method: 'POST',
      path: '/snapshots/pull',
      body: { json: body satisfies Body<'/v1/snapshots/pull', 'post'> },
      signal,
      idempotencyKey,
    });
  }

  /** Makes the server export the snapshot into the tenant's part of its snapshot store, under `key`. */
  async push(ref: string, opts: { key?: string | undefined } & CallOptions = {}): Promise<PushReport> {
    const { signal, idempotencyKey, ...body } = opts;
    return this.transport.json<Checked<PushReport, Answer<'/v1/snapshots/{snap}/push', 'post', 201>>>({
      method: 'POST',
      path: `/snapshots/${enc(ref)}/push`,
      body: { json: body satisfies Body<'/v1/snapshots/{snap}/push', 'post'> },
      signal,
      idempotencyKey,
    });
  }

  /** The bundles in the tenant's part of the server's snapshot store. */
  async listStored(opts: CallOptions = {}): Promise<BundleStat[]> {
    return this.transport.json<Checked<BundleStat, Answer<'/v1/store/bundles', 'get'>[number]>[]>({
      method: 'GET',
      path: '/store/bundles',
      signal: opts.signal,
    });
  }

  /** Removes a bundle from the tenant's part of the store. */
  async deleteStored(key: string, opts: CallOptions = {}): Promise<void> {
    await this.transport.send({ method: 'DELETE', path: `/store/bundles/${enc(key)}`, signal: opts.signal });
  }
}
