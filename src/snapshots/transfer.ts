/**
 * Verbs: push a snapshot to the snapshot store (store.ts) and pull one
 * back from it into this state directory.
 *
 * Tenancy: a tenant's bundles live in its own part of the store
 * (`tenants/<tn_…>/`, chunks and manifests of its own: ChunkedStore.forTenant),
 * and a key is one name segment, so no key a tenant can write reaches
 * another tenant's part. A pull checks again that the manifest it read is
 * the key it asked for in the caller's part (the store's parseManifest),
 * and the import re-verifies everything (digest, signature, host).
 *
 * Push streams the export straight into the store's put (chunks already
 * present are not sent again); pull streams the store's verified chunks
 * straight into the import. Neither holds more than a few chunks.
 */
import { InvalidArgumentError, LockstepError } from '../errors.js';
import { openExport } from './export.js';
import { importSnapshot } from './import.js';
import { openSnapshotStore } from './open-store.js';
import type { SnapshotRow } from './snapshot-rows.js';
import type { BundleStat, SnapshotStore } from './store.js';
import type { ExportDeps } from './export.js';
import type { ImportDeps } from './import.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';

/** What transfer.ts uses of the manager's services (api/engine.ts builds them). */
export interface TransferDeps extends ExportDeps, ImportDeps {
  config: LockstepConfig;
  log: Logger;
}

/** How far a push or a pull has come; reported about once per chunk. */
export interface TransferProgress {
  phase: 'push' | 'pull';
  /** Bundle bytes through so far. */
  bytes: number;
  /** The bundle's length, when known (a pull knows it from the manifest; a push once it has been exported before). */
  totalBytes: number | null;
  /** Push: chunks sent, and chunks the store already had. */
  uploadedChunks?: number;
  skippedChunks?: number;
}

interface TransferCommon {
  /** The caller's tenant (tn_…): its own part of the store, its own snapshots. */
  tenant?: string | null | undefined;
  /** Another store than the configured one (LOCKSTEP_SNAPSHOT_STORE). */
  store?: SnapshotStore | undefined;
  onProgress?: ((p: TransferProgress) => void) | undefined;
  signal?: AbortSignal | undefined;
}

export interface PushOptions extends TransferCommon {
  /** Its name in the store (default: the snapshot's name, else its id). */
  key?: string | undefined;
}

export interface StorePullOptions extends TransferCommon {
  /** A name of its own here (default: the name it had). */
  name?: string | undefined;
}

/** What a push stored. */
export interface PushReport {
  key: string;
  snapshotId: string;
  /** `sha256:<hex>` of the bundle, as the store names it. */
  digest: string;
  bytes: number;
  chunks: number;
  uploadedChunks: number;
  skippedChunks: number;
  ms: number;
}

/** What a pull from the store made. */
export interface StorePullReport {
  key: string;
  snapshot: SnapshotRow;
  bytes: number;
  ms: number;
}

const KEY = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** A key in a tenant's part of the store: one segment, so it cannot name another part. */
export function validateStoreKey(key: unknown): string {
  if (typeof key !== 'string' || !KEY.test(key))
    throw new InvalidArgumentError(
      'key',
      'a store key of at most 128 letters, digits, ".", "_" or "-", starting with a letter or digit',
      key,
    );
  return key;
}

/** Opens the configured store, or STORE_NOT_CONFIGURED. */
export async function configuredStore(engine: TransferDeps): Promise<SnapshotStore> {
  const cfg = engine.config.snapshotStore;
  if (!cfg.url)
    throw new LockstepError(
      'STORE_NOT_CONFIGURED',
      'No snapshot store is configured: set LOCKSTEP_SNAPSHOT_STORE (s3://BUCKET[/PREFIX] or a folder)',
    );
  return openSnapshotStore(cfg);
}

/** The part of `store` the tenant may use: its own, or the whole store outside any tenant. */
function scope(store: SnapshotStore, tenant: string | null | undefined): SnapshotStore {
  return tenant == null ? store : store.forTenant(tenant);
}

async function withStore<T>(
  engine: TransferDeps,
  opts: TransferCommon,
  fn: (store: SnapshotStore) => Promise<T>,
): Promise<T> {
  const store = opts.store ?? (await configuredStore(engine));
  try {
    return await fn(scope(store, opts.tenant));
  } finally {
    if (!opts.store) store.close();
  }
}

/** Exports the snapshot into the store under `key`. */
export async function pushSnapshot(engine: TransferDeps, ref: string, opts: PushOptions = {}): Promise<PushReport> {
  if (opts.key !== undefined) validateStoreKey(opts.key);
  const started = performance.now();
  return withStore(engine, opts, async (store) => {
    const { snapshot, stream } = await openExport(engine, ref, opts.tenant);
    const key = opts.key ?? validateStoreKey(snapshot.name ?? snapshot.id);
    const total = snapshot.bundle_bytes ?? null;
    try {
      const r = await store.put(key, stream, {
        ...(opts.signal ? { signal: opts.signal } : {}),
        onProgress: (p) =>
          opts.onProgress?.({
            phase: 'push',
            bytes: p.bytes,
            totalBytes: total,
            uploadedChunks: p.uploadedChunks,
            skippedChunks: p.skippedChunks,
          }),
      });
      engine.log.info({ snapshotId: snapshot.id, key, ...r }, 'snapshot pushed');
      return { key, snapshotId: snapshot.id, ...r, ms: performance.now() - started };
    } finally {
      stream.destroy();
    }
  });
}

/** Imports the bundle stored under `key` (in the tenant's part of the store) as a new snapshot. */
export async function pullFromStore(
  engine: TransferDeps,
  key: string,
  opts: StorePullOptions = {},
): Promise<StorePullReport> {
  validateStoreKey(key);
  const started = performance.now();
  return withStore(engine, opts, async (store) => {
    const stat = await store.stat(key);
    const source = await store.get(key, opts.signal ? { signal: opts.signal } : {});
    let bytes = 0;
    async function* counted(): AsyncGenerator<Buffer> {
      for await (const c of source) {
        bytes += (c as Buffer).length;
        opts.onProgress?.({ phase: 'pull', bytes, totalBytes: stat.bytes });
        yield c as Buffer;
      }
    }
    try {
      const snapshot = await importSnapshot(engine, counted(), {
        tenant: opts.tenant,
        name: opts.name,
        signal: opts.signal,
      });
      engine.log.info({ snapshotId: snapshot.id, key, bytes }, 'snapshot pulled from the store');
      return { key, snapshot, bytes: stat.bytes, ms: performance.now() - started };
    } finally {
      source.destroy();
    }
  });
}

/** The tenant's bundles in the store. */
export async function listStored(engine: TransferDeps, opts: TransferCommon = {}): Promise<BundleStat[]> {
  return withStore(engine, opts, (store) => store.list());
}

/** Removes a bundle from the tenant's part of the store (its chunks go at the next `lockstep store gc`). */
export async function deleteStored(engine: TransferDeps, key: string, opts: TransferCommon = {}): Promise<void> {
  validateStoreKey(key);
  await withStore(engine, opts, (store) => store.delete(key));
}
