/**
 * The snapshot store in a folder: one host, or a filesystem several hosts
 * mount (NFS, CephFS). Layout under the root:
 *
 *   chunks/<first two hex digits>/<sha256>   one file per chunk
 *   manifests/<name, URI-encoded>.json       one file per name ("/" → %2F: one flat folder)
 *   tmp/                                     files being written
 *   tenants/<tn_…>/                          a tenant's own store, the same layout
 *
 * Every file is written in tmp/, fsynced, renamed into place and its folder
 * fsynced: a reader (or a crash) sees the whole file or none, and a chunk
 * is durable before a manifest can name it.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { ChunkedStore, isChunkHash, type ChunkBackend, type ChunkedStoreOptions, type StoredChunk } from './store.js';

/** Temporary files older than this are what a crashed put left behind. */
const STALE_TMP_MS = 60 * 60 * 1000;

function isMissing(e: unknown): boolean {
  return (e as NodeJS.ErrnoException)?.code === 'ENOENT';
}

async function fsyncDir(dir: string): Promise<void> {
  const fd = await fsp.open(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  try {
    await fd.sync();
  } finally {
    await fd.close();
  }
}

/** Folder backend of the snapshot store. */
export class DirBackend implements ChunkBackend {
  readonly location: string;
  private readonly made = new Set<string>();

  constructor(readonly root: string) {
    this.location = path.resolve(root);
  }

  private chunkPath(sha256: string): string {
    return path.join(this.location, 'chunks', sha256.slice(0, 2), sha256);
  }

  private manifestPath(name: string): string {
    return path.join(this.location, 'manifests', `${encodeURIComponent(name)}.json`);
  }

  private async mkdir(dir: string): Promise<void> {
    if (this.made.has(dir)) return;
    await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
    this.made.add(dir);
  }

  /** Writes `data` to `target` atomically and durably. */
  private async writeAtomic(target: string, data: Buffer, signal?: AbortSignal): Promise<void> {
    const tmpDir = path.join(this.location, 'tmp');
    await Promise.all([this.mkdir(tmpDir), this.mkdir(path.dirname(target))]);
    const tmp = path.join(tmpDir, `${path.basename(target)}.${randomBytes(6).toString('hex')}`);
    try {
      const fd = await fsp.open(tmp, 'wx', 0o600);
      try {
        await fd.writeFile(data, { signal });
        await fd.sync();
      } finally {
        await fd.close();
      }
      signal?.throwIfAborted();
      await fsp.rename(tmp, target);
    } catch (e) {
      await fsp.rm(tmp, { force: true });
      throw e;
    }
    await fsyncDir(path.dirname(target));
  }

  async chunkSize(sha256: string): Promise<number | undefined> {
    try {
      return (await fsp.stat(this.chunkPath(sha256))).size;
    } catch (e) {
      if (isMissing(e)) return undefined;
      throw e;
    }
  }

  putChunk(sha256: string, data: Buffer, signal?: AbortSignal): Promise<void> {
    return this.writeAtomic(this.chunkPath(sha256), data, signal);
  }

  async getChunk(sha256: string, signal?: AbortSignal): Promise<Buffer | undefined> {
    try {
      return await fsp.readFile(this.chunkPath(sha256), { signal });
    } catch (e) {
      if (isMissing(e)) return undefined;
      throw e;
    }
  }

  async listChunks(): Promise<StoredChunk[]> {
    const out: StoredChunk[] = [];
    const top = path.join(this.location, 'chunks');
    let fans: string[];
    try {
      fans = await fsp.readdir(top);
    } catch (e) {
      if (isMissing(e)) return out;
      throw e;
    }
    for (const fan of fans) {
      for (const name of await fsp.readdir(path.join(top, fan))) {
        if (!isChunkHash(name)) continue;
        try {
          const st = await fsp.stat(path.join(top, fan, name));
          out.push({ sha256: name, bytes: st.size, modifiedMs: st.mtimeMs });
        } catch (e) {
          if (!isMissing(e)) throw e;
        }
      }
    }
    return out;
  }

  async deleteChunk(sha256: string): Promise<void> {
    await fsp.rm(this.chunkPath(sha256), { force: true });
  }

  putManifest(name: string, body: Buffer): Promise<void> {
    return this.writeAtomic(this.manifestPath(name), body);
  }

  async getManifest(name: string): Promise<Buffer | undefined> {
    try {
      return await fsp.readFile(this.manifestPath(name));
    } catch (e) {
      if (isMissing(e)) return undefined;
      throw e;
    }
  }

  async listManifests(prefix: string): Promise<string[]> {
    let files: string[];
    try {
      files = await fsp.readdir(path.join(this.location, 'manifests'));
    } catch (e) {
      if (isMissing(e)) return [];
      throw e;
    }
    return files
      .filter((f) => f.endsWith('.json'))
      .map((f) => decodeURIComponent(f.slice(0, -'.json'.length)))
      .filter((n) => n.startsWith(prefix));
  }

  async deleteManifest(name: string): Promise<void> {
    const p = this.manifestPath(name);
    await fsp.rm(p, { force: true });
    await fsyncDir(path.dirname(p));
  }

  scoped(tenant: string): ChunkBackend {
    return new DirBackend(path.join(this.location, 'tenants', tenant));
  }

  async listScopes(): Promise<string[]> {
    try {
      return await fsp.readdir(path.join(this.location, 'tenants'));
    } catch (e) {
      if (isMissing(e)) return [];
      throw e;
    }
  }

  /** Removes temporary files a crashed put left (an aborted one removes its own). */
  async beforePut(): Promise<void> {
    const tmpDir = path.join(this.location, 'tmp');
    let files: string[];
    try {
      files = await fsp.readdir(tmpDir);
    } catch (e) {
      if (isMissing(e)) return;
      throw e;
    }
    const cutoff = Date.now() - STALE_TMP_MS;
    for (const f of files) {
      const p = path.join(tmpDir, f);
      const st = await fsp.stat(p).catch(() => undefined);
      if (st && st.mtimeMs < cutoff) await fsp.rm(p, { force: true });
    }
  }
}

/** A snapshot store in a folder. */
export class DirSnapshotStore extends ChunkedStore {
  constructor(root: string, opts: ChunkedStoreOptions = {}) {
    super(new DirBackend(root), opts);
  }
}
