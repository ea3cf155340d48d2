/**
 * Opens the snapshot store a URL names: `s3://BUCKET[/PREFIX]` (an
 * S3-compatible bucket, settings from src/config.ts's SnapshotStoreConfig),
 * `file:///DIR` or an absolute folder. The S3 client library is loaded only
 * when an S3 store is opened.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { resolveStoreConfig, type SnapshotStoreConfig } from '../config.js';
import { InvalidArgumentError } from '../errors.js';
import { DirSnapshotStore } from './dir-store.js';
import type { SnapshotStore } from './store.js';

const EXPECTED = 's3://BUCKET[/PREFIX], file:///DIR or an absolute folder (LOCKSTEP_SNAPSHOT_STORE)';

/** The store `url` names (default: the configuration's). */
export async function openSnapshotStore(
  config: SnapshotStoreConfig = resolveStoreConfig(),
  url: string | undefined = config.url,
): Promise<SnapshotStore> {
  if (!url) throw new InvalidArgumentError('store', EXPECTED, url);
  if (url.startsWith('s3://')) {
    const rest = url.slice('s3://'.length);
    const slash = rest.indexOf('/');
    const bucket = slash < 0 ? rest : rest.slice(0, slash);
    let prefix = slash < 0 ? '' : rest.slice(slash + 1);
    if (prefix && !prefix.endsWith('/')) prefix += '/';
    const { S3SnapshotStore } = await import('./s3-store.js');
    return new S3SnapshotStore({
      bucket,
      prefix,
      chunkBytes: config.chunkBytes,
      region: config.s3.region,
      forcePathStyle: config.s3.forcePathStyle,
      ...(config.s3.endpoint ? { endpoint: config.s3.endpoint } : {}),
      ...(config.s3.credentials ? { credentials: config.s3.credentials } : {}),
    });
  }
  if (url.startsWith('file://')) return new DirSnapshotStore(fileURLToPath(url), { chunkBytes: config.chunkBytes });
  if (path.isAbsolute(url)) return new DirSnapshotStore(url, { chunkBytes: config.chunkBytes });
  throw new InvalidArgumentError('store', EXPECTED, url);
}
