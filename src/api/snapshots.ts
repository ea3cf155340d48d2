/**
 * `ls.snapshots`: named snapshots through the SDK. Every method takes the
 * caller's tenant (tn_…) where tenants matter: another tenant's snapshot is
 * SNAPSHOT_NOT_FOUND, exactly like a missing one.
 */
import type { Readable } from 'node:stream';
import type { Engine } from './engine.js';
import type { ForkResult } from '../checkpoints/fork.js';
import type { AgentContext } from '../context/formats.js';
import { SnapshotRows, snapshotInfo, type SnapshotInfo } from '../snapshots/snapshot-rows.js';
import {
  createSnapshot,
  deleteSnapshot,
  snapshotContext,
  startFromSnapshot,
  type SnapshotOptions,
} from '../snapshots/snapshots.js';
import { bundleIdentity, exportSnapshot, openExport } from '../snapshots/export.js';
import { importSnapshot, type ImportOptions } from '../snapshots/import.js';
import { pullSnapshot, type PullOptions, type PullReport } from '../snapshots/pull.js';
import {
  deleteStored,
  listStored,
  pullFromStore,
  pushSnapshot,
  type PushOptions,
  type PushReport,
  type StorePullOptions,
  type StorePullReport,
} from '../snapshots/transfer.js';
import { hostSigningKey } from '../snapshots/signing.js';
import type { BundleStat } from '../snapshots/store.js';

type Tenanted = { tenant?: string | null | undefined };

/** What a pull did, with the snapshot it made. */
export type PullResult = Omit<PullReport, 'snapshot'> & { snapshot: SnapshotInfo };
/** What a pull from the snapshot store did, with the snapshot it made. */
export type StorePullResult = Omit<StorePullReport, 'snapshot'> & { snapshot: SnapshotInfo };

/** Named snapshots of one state directory. */
export class Snapshots {
  /** @internal */
  constructor(
    private readonly engine: Engine,
    private readonly assertOpen: () => void,
  ) {}

  /** Promotes a checkpoint to a snapshot that outlives its sandbox. */
  async create(checkpointId: string, opts: SnapshotOptions = {}): Promise<SnapshotInfo> {
    this.assertOpen();
    return snapshotInfo(await createSnapshot(this.engine, checkpointId, opts));
  }

  /** The tenant's snapshots (every snapshot without one), oldest first. */
  list(opts: Tenanted = {}): SnapshotInfo[] {
    this.assertOpen();
    return new SnapshotRows(this.engine.catalog.db).list(opts.tenant).map(snapshotInfo);
  }

  /** One snapshot, by id or name. */
  get(ref: string, opts: Tenanted = {}): SnapshotInfo {
    this.assertOpen();
    return snapshotInfo(new SnapshotRows(this.engine.catalog.db).require(ref, opts.tenant));
  }

  /** Deletes it; its layer and process image go once no checkpoint or other snapshot holds them. */
  async delete(ref: string, opts: Tenanted = {}): Promise<void> {
    this.assertOpen();
    await deleteSnapshot(this.engine, ref, opts.tenant);
  }

  /** The agent's context stored with it (null if none). */
  context(ref: string, opts: Tenanted = {}): AgentContext | null {
    this.assertOpen();
    return snapshotContext(this.engine, ref, opts.tenant);
  }

  /** Starts sandboxes from it (the fork path); one result per sandbox. */
  async start(
    ref: string,
    opts: Tenanted & { count?: number | undefined; signal?: AbortSignal | undefined } = {},
  ): Promise<ForkResult[]> {
    this.assertOpen();
    return startFromSnapshot(this.engine, ref, opts);
  }

  /** The snapshot as one bundle stream (errors arrive as the stream's error). */
  export(ref: string, opts: Tenanted = {}): Readable {
    this.assertOpen();
    return exportSnapshot(this.engine, ref, opts.tenant);
  }

  /**
   * The export, verified and holding the snapshot before its first byte: errors
   * that can be known first (missing, busy, corrupt) are thrown here, so a
   * server can still answer them with a status. Consume or destroy the stream.
   */
  async openExport(ref: string, opts: Tenanted = {}): Promise<{ snapshot: SnapshotInfo; stream: Readable }> {
    this.assertOpen();
    const { snapshot, stream } = await openExport(this.engine, ref, opts.tenant);
    return { snapshot: snapshotInfo(snapshot), stream };
  }

  /** The bundle's digest and length (exporting it once into nothing if no export has finished yet). */
  async bundleIdentity(ref: string, opts: Tenanted = {}): Promise<{ digest: string; bytes: number }> {
    this.assertOpen();
    return bundleIdentity(this.engine, ref, opts.tenant);
  }

  /** Whether the HTTP API may pull from this origin (LOCKSTEP_PULL_SOURCES). */
  pullAllowed(origin: string): boolean {
    return this.engine.config.pullSources.includes(origin);
  }

  /** Imports a bundle stream; nothing is kept unless all of it verifies. */
  async import(stream: AsyncIterable<Buffer | Uint8Array | string>, opts: ImportOptions = {}): Promise<SnapshotInfo> {
    this.assertOpen();
    return snapshotInfo(await importSnapshot(this.engine, stream, opts));
  }

  /** Pulls a snapshot from another Lockstep server (its HTTP API, with a token of the tenant there). */
  async pull(opts: PullOptions): Promise<PullResult>;
  /**
   * Pulls the bundle stored under `key` in the snapshot store (the tenant's
   * part of it) and imports it as a new snapshot; `onProgress` reports the bytes.
   */
  async pull(key: string, opts?: StorePullOptions): Promise<StorePullResult>;
  async pull(a: PullOptions | string, opts: StorePullOptions = {}): Promise<PullResult | StorePullResult> {
    this.assertOpen();
    if (typeof a === 'string') {
      const r = await pullFromStore(this.engine, a, opts);
      return { ...r, snapshot: snapshotInfo(r.snapshot) };
    }
    const r = await pullSnapshot(this.engine, a);
    return { ...r, snapshot: snapshotInfo(r.snapshot) };
  }

  /**
   * Exports the snapshot into the snapshot store (the configured one, or
   * `opts.store`) under `opts.key` (default: its name, else its id), in the
   * tenant's part of the store; chunks the store has already are not sent
   * again. `onProgress` reports the bytes and chunks.
   */
  async push(ref: string, opts: PushOptions = {}): Promise<PushReport> {
    this.assertOpen();
    return pushSnapshot(this.engine, ref, opts);
  }

  /** The bundles in the tenant's part of the snapshot store. */
  async listStored(opts: Tenanted & Pick<PushOptions, 'store'> = {}): Promise<BundleStat[]> {
    this.assertOpen();
    return listStored(this.engine, opts);
  }

  /** Removes a bundle from the tenant's part of the store (BUNDLE_NOT_FOUND if it has none of that key). */
  async deleteStored(key: string, opts: Tenanted & Pick<PushOptions, 'store'> = {}): Promise<void> {
    this.assertOpen();
    await deleteStored(this.engine, key, opts);
  }

  /**
   * This state directory's bundle-signing public key (`ed25519:…`): what
   * another host lists in LOCKSTEP_TRUSTED_BUNDLE_KEYS to import its bundles.
   */
  signingKey(): string {
    this.assertOpen();
    return hostSigningKey(this.engine.paths.bundleSigningKey).name;
  }
}
