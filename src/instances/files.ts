/**
 * File access to a sandbox from the host, through its overlay root. Every
 * byte of it is the sandbox's to choose, so:
 *
 * - every path is resolved by the kernel with openat2(RESOLVE_BENEATH):
 *   neither "../" nor a symlink planted inside the sandbox can reach a file
 *   outside it (PATH_ESCAPES_SANDBOX);
 * - only regular files are read or written and only directories listed: the
 *   leaf is looked at with O_PATH|O_NOFOLLOW and fstat before anything opens
 *   it, so a FIFO, a device node, a socket or a symlink leaf gets
 *   FILE_TYPE_NOT_SUPPORTED instead of an open or read that could block the
 *   manager forever (native/addon/files.cc);
 * - nothing runs on the event loop: the opens are async native calls and the
 *   I/O is Node's fs on the fd, both on libuv's pool, in chunks, so a large
 *   file streams instead of sitting in memory (readStream / writeStream);
 * - a write goes to a temporary file beside the target that is renamed over
 *   it at the end: a failed or cut-off write leaves the old file as it was.
 */
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { createHash, randomBytes, type Hash } from 'node:crypto';
import { Readable, Transform, type TransformCallback } from 'node:stream';
import type { NativeBinding, OpenedFile } from '../native/binding.js';
import { readDirPage } from './dir-page.js';
import { InvalidArgumentError, LockstepError, SystemCallError, isNativeError } from '../errors.js';

/** A caller's path would leave the sandbox root. */
export class PathEscapeError extends LockstepError {
  constructor(p: string) {
    super(
      'PATH_ESCAPES_SANDBOX',
      `Path ${JSON.stringify(p)} resolves outside the sandbox (through ".." or a symlink)`,
      { details: { field: 'path', path: p } },
    );
  }
}

/** A file or directory the caller named does not exist in the sandbox. */
export class FileNotFoundError extends LockstepError {
  constructor(p: string) {
    super('FILE_NOT_FOUND', `No such file or directory in the sandbox: ${p}`, { details: { field: 'path', path: p } });
  }
}

/** The path names a FIFO, a device, a socket or a symlink: the file API reads and writes only regular files. */
export class FileTypeNotSupportedError extends LockstepError {
  constructor(p: string, type: string) {
    const why =
      type === 'symlink'
        ? 'the file API does not follow a symlink at the end of a path'
        : 'the file API reads and writes only regular files';
    super('FILE_TYPE_NOT_SUPPORTED', `${p} in the sandbox is a ${type}, not a regular file: ${why}`, {
      details: { field: 'path', path: p, type },
    });
  }
}

/** A process in the sandbox holds a lease on the file; opening it now would wait for the lease to break. */
export class FileBusyError extends LockstepError {
  constructor(p: string) {
    super('FILE_BUSY', `${p} in the sandbox is leased by a process inside it; try again later`, {
      details: { field: 'path', path: p },
    });
  }
}

/** More bytes than the caller allowed for one file. */
export class FileTooLargeError extends LockstepError {
  constructor(p: string, limit: number, what = 'this request') {
    super('FILE_TOO_LARGE', `${p} is larger than ${what} accepts (${limit} bytes)`, {
      details: { field: 'path', path: p, limit },
    });
  }
}

export interface FileEntry {
  name: string;
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtimeMs: number;
}

/** Options of listPage. */
export interface ListPageOptions {
  /** At most this many entries (default LIST_DEFAULT_LIMIT, at most LIST_MAX_LIMIT). */
  limit?: number | undefined;
  /** The previous page's nextCursor: entries whose names sort after it. */
  cursor?: string | null | undefined;
}

/** One page of a directory listing. */
export interface FilePage {
  entries: FileEntry[];
  /** Pass as cursor for the next page; null when this page is the last. */
  nextCursor: string | null;
}

/** A file being read as a stream. */
export interface FileReadStream {
  stream: Readable;
  /** Size when it was opened (the sandbox may change it while it is read). */
  size: number;
  /** Settles when the stream has ended: the hash and length of what it delivered. Rejects if it was cut off. */
  done: Promise<{ sha256: string; bytes: number }>;
}

/** What a write produced. */
export interface WriteResult {
  sha256: string;
  bytes: number;
}

/** Options of write and writeStream. */
export interface WriteOptions {
  /** Permission bits (default: those of the file it replaces, else 0644). */
  mode?: number | undefined;
  /** Create missing parent directories (default true). */
  createParents?: boolean | undefined;
  /** Refuse (FILE_TOO_LARGE) past this many bytes; nothing is changed then. */
  maxBytes?: number | undefined;
  signal?: AbortSignal | undefined;
}

const MAX_PATH = 4096;

/** Entries of one listPage when the caller names no limit. */
export const LIST_DEFAULT_LIMIT = 1000;
/** The most entries one listPage returns (about 2 MB of JSON). */
export const LIST_MAX_LIMIT = 10_000;
/** lstat calls of one listing in flight at once (each is a pool job). */
const LSTAT_CONCURRENCY = 8;
export const IDENTITY_HASH_PREFIX = 'identity:';

/** Files larger than this are bound to verdicts by identity, not by hashing their bytes (verdictHash). */
export const VERDICT_HASH_MAX_BYTES = 64 * 1024 * 1024;
/** I/O goes in chunks of this size: no single read or write holds a pool thread long. */
export const CHUNK_BYTES = 1024 * 1024;

const read = promisify(fs.read);
const write = promisify(fs.write);
const close = promisify(fs.close);
const fchmod = promisify(fs.fchmod);
const fchown = promisify(fs.fchown);
const fstat = promisify(fs.fstat);

/** Validates a sandbox path and returns it relative to the root ("" for "/"). */
export function sandboxRelative(p: unknown, field = 'path'): string {
  if (typeof p !== 'string' || p.length === 0 || p.length > MAX_PATH || p.includes('\0')) {
    throw new InvalidArgumentError(field, 'a path inside the sandbox (1-4096 characters, no NUL)', p);
  }
  const abs = p.startsWith('/') ? p : `/workspace/${p}`;
  return abs.replace(/^\/+/, '');
}

function mapError(e: unknown, p: string): never {
  if (e instanceof LockstepError) throw e;
  if (isNativeError(e) || (e as NodeJS.ErrnoException)?.code) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'EXDEV' || code === 'ELOOP') throw new PathEscapeError(p);
    if (code === 'ENOENT' || code === 'ENOTDIR') throw new FileNotFoundError(p);
    if (code === 'EISDIR') throw new InvalidArgumentError('path', 'a regular file, not a directory', p);
    if (code === 'ENOTEMPTY')
      throw new InvalidArgumentError('path', 'an empty directory (pass recursive to remove a tree)', p);
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK') throw new FileBusyError(p);
    if (code === 'EDQUOT')
      throw new SystemCallError(
        'DISK_QUOTA_EXCEEDED',
        `Cannot write ${p}: the sandbox's disk quota is used up`,
        e as Error,
      );
    if (code === 'ENOSPC')
      throw new SystemCallError('DISK_FULL', `Cannot write ${p}: the layer store is full`, e as Error);
    throw new SystemCallError(
      'FILE_ACCESS_FAILED',
      `Cannot access ${p} in the sandbox: ${(e as Error).message}`,
      e as Error,
    );
  }
  throw e;
}

const closeQuietly = (fd: number) => close(fd).catch(() => undefined);
const viaFd = (dirFd: number, name = '') => `/proc/self/fd/${dirFd}${name ? `/${name}` : ''}`;

/** Passes bytes through while hashing and counting them. */
class Hasher extends Transform {
  private readonly hash: Hash = createHash('sha256');
  bytes = 0;
  readonly done: Promise<WriteResult>;
  private settle!: (r: WriteResult) => void;
  private fail!: (e: Error) => void;

  constructor() {
    super({ highWaterMark: CHUNK_BYTES });
    this.done = new Promise((resolve, reject) => {
      this.settle = resolve;
      this.fail = reject;
    });
    // Nobody may be waiting for `done`; a cut-off stream must not become an unhandled rejection.
    this.done.catch(() => undefined);
    this.once('close', () => this.fail(new Error('the stream was closed before its end')));
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.hash.update(chunk);
    this.bytes += chunk.length;
    cb(null, chunk);
  }

  override _flush(cb: TransformCallback): void {
    this.settle({ sha256: this.hash.digest('hex'), bytes: this.bytes });
    cb();
  }
}

/** Files of one sandbox root on the host. */
export class SandboxFiles {
  /**
   * `native`: the addon's surface (the engine's, so a fake host can stand in).
   * `owner`: the host id of the sandbox's root when it has a user namespace.
   * What the API creates is then given to it, as if root inside had made it:
   * a file left to host root would be out of the sandbox's reach.
   */
  constructor(
    private readonly native: Pick<NativeBinding, 'openBeneath' | 'openChecked' | 'openFlags'>,
    private readonly root: () => string,
    private readonly owner: () => number | null = () => null,
  ) {}

  /** Opens a regular file (or, with O_DIRECTORY, a directory) for I/O; anything else is refused. */
  private async openChecked(
    p: string,
    flags: number,
    under = this.root(),
    rel = sandboxRelative(p),
  ): Promise<OpenedFile> {
    let opened: OpenedFile;
    try {
      opened = await this.native.openChecked(under, rel, flags);
    } catch (e) {
      mapError(e, p);
    }
    if (opened.fd >= 0) return opened;
    const wantDir = (flags & fs.constants.O_DIRECTORY) !== 0;
    if (opened.type === 'directory') throw new InvalidArgumentError('path', 'a regular file, not a directory', p);
    if (opened.type === 'file' && wantDir) throw new FileNotFoundError(p);
    throw new FileTypeNotSupportedError(p, opened.type);
  }

  private async openDir(p: string, rel: string): Promise<number> {
    try {
      return await this.native.openBeneath(this.root(), rel, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    } catch (e) {
      mapError(e, p);
    }
  }

  /** Opens the parent directory safely and returns [dirFd, leaf name]. */
  private async openParent(p: string): Promise<[number, string]> {
    const rel = sandboxRelative(p);
    const leaf = path.posix.basename(rel);
    if (!leaf || leaf === '.' || leaf === '..')
      throw new InvalidArgumentError('path', 'a path naming a file, not "/" or ".."', p);
    const parent = path.posix.dirname(rel);
    return [await this.openDir(p, parent === '.' ? '' : parent), leaf];
  }

  /** Reads fd to its end in chunks, handing each to `onChunk`. */
  private async drain(fd: number, p: string, onChunk: (b: Buffer) => void): Promise<void> {
    try {
      for (;;) {
        const buf = Buffer.allocUnsafe(CHUNK_BYTES);
        const { bytesRead } = await read(fd, buf, 0, CHUNK_BYTES, null);
        if (bytesRead === 0) return;
        onChunk(buf.subarray(0, bytesRead));
      }
    } catch (e) {
      mapError(e, p);
    }
  }

  /**
   * Reads a whole file into memory; past `maxBytes` (if given) FILE_TOO_LARGE, also
   * for a file that grows while it is read.
   */
  async read(p: string, opts: { maxBytes?: number | undefined } = {}): Promise<{ content: Buffer; sha256: string }> {
    const { fd, size } = await this.openChecked(p, fs.constants.O_RDONLY);
    try {
      if (opts.maxBytes !== undefined && size > opts.maxBytes) throw new FileTooLargeError(p, opts.maxBytes);
      const chunks: Buffer[] = [];
      const hash = createHash('sha256');
      let bytes = 0;
      await this.drain(fd, p, (b) => {
        bytes += b.length;
        if (opts.maxBytes !== undefined && bytes > opts.maxBytes) throw new FileTooLargeError(p, opts.maxBytes);
        chunks.push(b);
        hash.update(b);
      });
      return { content: Buffer.concat(chunks), sha256: hash.digest('hex') };
    } finally {
      await closeQuietly(fd);
    }
  }

  /**
   * Up to `maxBytes` of a file from byte `offset` on, and the file's size
   * when opened (a transcript read by offsets: the reader learns where the
   * file ends, and that it is shorter than its offset after a rollback).
   */
  async readFrom(p: string, offset: number, maxBytes: number): Promise<{ content: Buffer; size: number }> {
    const { fd, size } = await this.openChecked(p, fs.constants.O_RDONLY);
    try {
      if (offset >= size) return { content: Buffer.alloc(0), size };
      const want = Math.min(maxBytes, size - offset);
      const buf = Buffer.allocUnsafe(want);
      let got = 0;
      try {
        while (got < want) {
          const { bytesRead } = await read(fd, buf, got, want - got, offset + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
      } catch (e) {
        mapError(e, p);
      }
      return { content: buf.subarray(0, got), size };
    } finally {
      await closeQuietly(fd);
    }
  }

  /**
   * Opens a file for reading as a stream (chunks of CHUNK_BYTES). Refusals
   * (missing, escaping, not a regular file) reject here, before any byte.
   */
  async readStream(p: string): Promise<FileReadStream> {
    const { fd, size } = await this.openChecked(p, fs.constants.O_RDONLY);
    const source = fs.createReadStream('', { fd, highWaterMark: CHUNK_BYTES, autoClose: true });
    const hasher = new Hasher();
    source.on('error', (e) => hasher.destroy(e));
    hasher.on('close', () => source.destroy());
    source.pipe(hasher);
    return { stream: hasher, size, done: hasher.done };
  }

  /** sha256 of a file's content, or null when it does not exist. */
  async hash(p: string): Promise<string | null> {
    return this.hashUpTo(p, Infinity);
  }

  /**
   * What a verdict is bound to, or null when the file does not exist: the
   * sha256 of its content up to VERDICT_HASH_MAX_BYTES; past that, its
   * identity (size, mtime, ctime and inode, as `identity:` + their values)
   * instead of its bytes. Every rollback asks this for every file a verdict
   * is about: a 40 GB sparse file must cost a stat, not 40 GB of hashing.
   * The identity changes with any write (ctime cannot be set from inside the
   * sandbox), so a changed large file is stale; an unchanged one is fresh as
   * long as the restore keeps its inode and times.
   */
  async verdictHash(p: string): Promise<string | null> {
    return this.hashUpTo(p, VERDICT_HASH_MAX_BYTES);
  }

  private async hashUpTo(p: string, maxBytes: number): Promise<string | null> {
    let opened: OpenedFile;
    try {
      opened = await this.openChecked(p, fs.constants.O_RDONLY);
    } catch (e) {
      if (e instanceof FileNotFoundError) return null;
      throw e;
    }
    const { fd } = opened;
    try {
      if (opened.size > maxBytes) return await identityOf(fd, p);
      // Read in chunks on the pool; each chunk is hashed between them, so the
      // event loop runs on (at most maxBytes of hashing in all).
      const hash = createHash('sha256');
      let bytes = 0;
      let grew = false;
      try {
        for (;;) {
          const buf = Buffer.allocUnsafe(CHUNK_BYTES);
          const { bytesRead } = await read(fd, buf, 0, CHUNK_BYTES, null);
          if (bytesRead === 0) break;
          bytes += bytesRead;
          if (bytes > maxBytes) {
            grew = true; // it grew past the bound while read: judged like any large file
            break;
          }
          hash.update(buf.subarray(0, bytesRead));
        }
      } catch (e) {
        mapError(e, p);
      }
      return grew ? await identityOf(fd, p) : hash.digest('hex');
    } finally {
      await closeQuietly(fd);
    }
  }

  async write(p: string, data: string | Uint8Array, opts: WriteOptions = {}): Promise<WriteResult> {
    const buf =
      typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    return this.writeFrom(p, chunked(buf), opts);
  }

  /** Writes a file from a stream of bytes, chunk by chunk; the file changes only if the whole stream arrives. */
  async writeStream(
    p: string,
    source: Readable | AsyncIterable<Uint8Array | string>,
    opts: WriteOptions = {},
  ): Promise<WriteResult> {
    return this.writeFrom(p, source, opts);
  }

  private async writeFrom(
    p: string,
    source: AsyncIterable<Uint8Array | string>,
    opts: WriteOptions,
  ): Promise<WriteResult> {
    if (opts.mode !== undefined && (!Number.isInteger(opts.mode) || opts.mode < 0 || opts.mode > 0o7777))
      throw new InvalidArgumentError('mode', 'permission bits from 0 to 0o7777', opts.mode);
    const rel = sandboxRelative(p);
    if (opts.createParents !== false) await this.mkdir('/' + path.posix.dirname(rel));
    const [dirFd, leaf] = await this.openParent(p);
    const tmp = `.lockstep-write-${randomBytes(6).toString('hex')}`;
    let tmpFd = -1;
    try {
      // What is there now decides the mode and owner the new content keeps.
      let existing: OpenedFile | undefined;
      try {
        existing = await this.openChecked(p, fs.constants.O_RDONLY, viaFd(dirFd), leaf);
        await closeQuietly(existing.fd);
      } catch (e) {
        if (!(e instanceof FileNotFoundError)) throw e;
      }
      const mode = opts.mode ?? existing?.mode ?? 0o644;
      try {
        tmpFd = await this.native.openBeneath(
          viaFd(dirFd),
          tmp,
          fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW,
          0o600,
        );
      } catch (e) {
        mapError(e, p);
      }
      const hash = createHash('sha256');
      let bytes = 0;
      try {
        for await (const chunk of source) {
          opts.signal?.throwIfAborted();
          const b =
            typeof chunk === 'string'
              ? Buffer.from(chunk)
              : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
          bytes += b.length;
          if (opts.maxBytes !== undefined && bytes > opts.maxBytes) throw new FileTooLargeError(p, opts.maxBytes);
          hash.update(b);
          for (let off = 0; off < b.length;)
            off += (await write(tmpFd, b, off, Math.min(CHUNK_BYTES, b.length - off))).bytesWritten;
        }
        opts.signal?.throwIfAborted();
        // New files belong to the sandbox's root (with a user namespace, a host id); existing ones keep their owner.
        const owner = this.owner();
        if (existing) await fchown(tmpFd, existing.uid, existing.gid);
        else if (owner !== null) await fchown(tmpFd, owner, owner);
        await fchmod(tmpFd, mode);
        await fs.promises.rename(viaFd(dirFd, tmp), viaFd(dirFd, leaf));
      } catch (e) {
        await fs.promises.unlink(viaFd(dirFd, tmp)).catch(() => undefined);
        mapError(e, p);
      }
      return { sha256: hash.digest('hex'), bytes };
    } finally {
      if (tmpFd >= 0) await closeQuietly(tmpFd);
      await closeQuietly(dirFd);
    }
  }

  async mkdir(p: string): Promise<void> {
    const rel = sandboxRelative(p);
    if (rel === '') return;
    // Create one component at a time, each below a safely opened parent.
    let cur = '';
    for (const part of rel.split('/').filter(Boolean)) {
      if (part === '..') throw new PathEscapeError(p);
      const next = cur ? `${cur}/${part}` : part;
      try {
        await closeQuietly(
          await this.native.openBeneath(this.root(), next, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY),
        );
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') mapError(e, p);
        const parentFd = await this.openDir(p, cur);
        try {
          await fs.promises.mkdir(viaFd(parentFd, part), { mode: 0o755 });
          const owner = this.owner();
          if (owner !== null) await fs.promises.lchown(viaFd(parentFd, part), owner, owner);
        } catch (e2) {
          if ((e2 as NodeJS.ErrnoException).code !== 'EEXIST') mapError(e2, p);
        } finally {
          await closeQuietly(parentFd);
        }
      }
      cur = next;
    }
  }

  /** Every entry of a directory, sorted by name (the caller holds them all; listPage bounds what one call holds). */
  async list(p: string): Promise<FileEntry[]> {
    return (await this.listEntries(p, Infinity)).entries;
  }

  /**
   * One page of a directory, sorted by name: at most `limit` entries
   * (default LIST_DEFAULT_LIMIT, at most LIST_MAX_LIMIT) after the name
   * `cursor`. `nextCursor` is the last name of the page when more follow
   * (pass it as the next call's cursor), else null. See dir-page.ts for why
   * by name.
   */
  async listPage(p: string, opts: ListPageOptions = {}): Promise<FilePage> {
    const limit = opts.limit ?? LIST_DEFAULT_LIMIT;
    if (!Number.isInteger(limit) || limit < 1 || limit > LIST_MAX_LIMIT)
      throw new InvalidArgumentError('limit', `an integer from 1 to ${LIST_MAX_LIMIT}`, opts.limit);
    const cursor = opts.cursor ?? undefined;
    if (cursor !== undefined && (typeof cursor !== 'string' || cursor.length === 0 || cursor.length > MAX_PATH))
      throw new InvalidArgumentError('cursor', 'the nextCursor of the previous page (a name)', cursor);
    return this.listEntries(p, limit, cursor);
  }

  private async listEntries(p: string, limit: number, after?: string): Promise<FilePage> {
    const { fd } = await this.openChecked(p, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    try {
      const base = viaFd(fd);
      const abs = '/' + sandboxRelative(p);
      const { names, more } = await readDirPage(base, limit, after);
      const stats = await mapBounded(names, LSTAT_CONCURRENCY, (name) =>
        fs.promises.lstat(`${base}/${name}`).catch(() => undefined),
      );
      const entries: FileEntry[] = [];
      names.forEach((name, i) => {
        const st = stats[i];
        if (!st) return; // removed by the sandbox while we listed
        const type = st.isFile() ? 'file' : st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symlink' : 'other';
        entries.push({
          name,
          path: path.posix.join(abs, name),
          type,
          size: st.size,
          mode: st.mode & 0o7777,
          mtimeMs: st.mtimeMs,
        });
      });
      return { entries, nextCursor: more ? names.at(-1)! : null };
    } catch (e) {
      mapError(e, p);
    } finally {
      await closeQuietly(fd);
    }
  }

  /**
   * The names and kinds (from the directory itself, no stat per entry) of at
   * most maxEntries entries of a directory, in the order it yields them,
   * read in batches on libuv's pool; `truncated` when it holds more. For
   * directories the sandbox can fill: reading them whole is of its choosing.
   */
  async listSome(
    p: string,
    maxEntries: number,
  ): Promise<{ entries: { name: string; type: FileEntry['type'] }[]; truncated: boolean }> {
    const { fd } = await this.openChecked(p, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    let dir: fs.Dir | undefined;
    try {
      // Through a /proc/self/fd path opendir opens its own descriptor of the directory checked above.
      dir = await fs.promises.opendir(viaFd(fd), { bufferSize: 256 });
      const entries: { name: string; type: FileEntry['type'] }[] = [];
      let d: fs.Dirent | null;
      while ((d = await dir.read()) !== null) {
        if (entries.length === maxEntries) return { entries, truncated: true };
        const type = d.isFile() ? 'file' : d.isDirectory() ? 'directory' : d.isSymbolicLink() ? 'symlink' : 'other';
        entries.push({ name: d.name, type });
      }
      return { entries, truncated: false };
    } catch (e) {
      return mapError(e, p);
    } finally {
      await dir?.close().catch(() => undefined);
      await closeQuietly(fd);
    }
  }

  /** The kind of the entry at p (a symlink is not followed), or undefined when there is none. */
  async typeOf(p: string): Promise<FileEntry['type'] | undefined> {
    let dirFd: number;
    let leaf: string;
    try {
      [dirFd, leaf] = await this.openParent(p);
    } catch (e) {
      if (e instanceof FileNotFoundError) return undefined;
      throw e;
    }
    try {
      const st = await fs.promises.lstat(viaFd(dirFd, leaf));
      return st.isFile() ? 'file' : st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symlink' : 'other';
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return undefined;
      return mapError(e, p);
    } finally {
      await closeQuietly(dirFd);
    }
  }

  /** Whether the entry exists (a symlink counts as itself; it is not followed). */
  async exists(p: string): Promise<boolean> {
    const rel = sandboxRelative(p);
    try {
      await closeQuietly(
        await this.native.openBeneath(this.root(), rel, this.native.openFlags.O_PATH | fs.constants.O_NOFOLLOW),
      );
      return true;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return false;
      mapError(e, p);
    }
  }

  /** Removes a file, symlink or empty directory (trees are removed inside the sandbox by the caller). */
  async remove(p: string): Promise<void> {
    const [dirFd, leaf] = await this.openParent(p);
    const target = viaFd(dirFd, leaf);
    try {
      const st = await fs.promises.lstat(target);
      if (st.isDirectory()) await fs.promises.rmdir(target);
      else await fs.promises.unlink(target);
    } catch (e) {
      mapError(e, p);
    } finally {
      await closeQuietly(dirFd);
    }
  }
}

/** A large file's identity for verdicts: what changes when it is written, without reading it. */
async function identityOf(fd: number, p: string): Promise<string> {
  try {
    const st = await fstat(fd, { bigint: true });
    return `${IDENTITY_HASH_PREFIX}size=${st.size},mtime=${st.mtimeNs},ctime=${st.ctimeNs},ino=${st.ino}`;
  } catch (e) {
    mapError(e, p);
  }
}

/** fn over items, at most `width` at once, results in order. */
async function mapBounded<T, R>(items: T[], width: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  return out;
}

/** A buffer as a sequence of chunks (so one code path writes both buffers and streams). */
async function* chunked(buf: Buffer): AsyncIterable<Buffer> {
  for (let off = 0; off < buf.length; off += CHUNK_BYTES) yield buf.subarray(off, off + CHUNK_BYTES);
}
