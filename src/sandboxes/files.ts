/**
 * File access to a sandbox from the host, through its overlay root. Every
 * path a caller gives is resolved by the kernel with openat2(RESOLVE_BENEATH),
 * so neither "../" nor a symlink planted inside the sandbox can reach a file
 * outside it: such paths fail with PATH_ESCAPES_SANDBOX.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { native } from '../native/binding.js';
import { InvalidArgumentError, LockstepError, SystemCallError, isNativeError } from '../errors.js';

/** A caller's path would leave the sandbox root. */
export class PathEscapeError extends LockstepError {
  constructor(p: string) {
    super('PATH_ESCAPES_SANDBOX', `Path ${JSON.stringify(p)} resolves outside the sandbox (through ".." or a symlink)`, { details: { field: 'path', path: p } });
  }
}

/** A file or directory the caller named does not exist in the sandbox. */
export class FileNotFoundError extends LockstepError {
  constructor(p: string) {
    super('FILE_NOT_FOUND', `No such file or directory in the sandbox: ${p}`, { details: { field: 'path', path: p } });
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

const MAX_PATH = 4096;

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
    if (code === 'ENOTEMPTY') throw new InvalidArgumentError('path', 'an empty directory (pass recursive to remove a tree)', p);
    throw new SystemCallError('FILE_ACCESS_FAILED', `Cannot access ${p} in the sandbox: ${(e as Error).message}`, e as Error);
  }
  throw e;
}

/** Files of one sandbox root on the host. */
export class SandboxFiles {
  /**
   * `owner`: the host id of the sandbox's root when it has a user namespace.
   * What the API creates is then given to it, as if root inside had made it:
   * a file left to host root would be out of the sandbox's reach.
   */
  constructor(
    private readonly root: () => string,
    private readonly owner: () => number | null = () => null,
  ) {}

  private open(p: string, flags: number, mode = 0o644): number {
    const rel = sandboxRelative(p);
    try {
      return native().openBeneath(this.root(), rel, flags, mode);
    } catch (e) {
      mapError(e, p);
    }
  }

  /** Opens the parent directory safely and returns [dirFd, leaf name]. */
  private openParent(p: string): [number, string] {
    const rel = sandboxRelative(p);
    const leaf = path.posix.basename(rel);
    if (!leaf || leaf === '.' || leaf === '..') throw new InvalidArgumentError('path', 'a path naming a file, not "/" or ".."', p);
    const parent = path.posix.dirname(rel);
    try {
      const fd = native().openBeneath(this.root(), parent === '.' ? '' : parent, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
      return [fd, leaf];
    } catch (e) {
      mapError(e, p);
    }
  }

  async read(p: string): Promise<{ content: Buffer; sha256: string }> {
    const fd = this.open(p, fs.constants.O_RDONLY);
    try {
      const content = fs.readFileSync(fd);
      return { content, sha256: createHash('sha256').update(content).digest('hex') };
    } catch (e) {
      mapError(e, p);
    } finally {
      fs.closeSync(fd);
    }
  }

  /** Content hash of a file, or null when it does not exist (for bound verdicts). */
  async hash(p: string): Promise<string | null> {
    try {
      return (await this.read(p)).sha256;
    } catch (e) {
      if (e instanceof FileNotFoundError) return null;
      throw e;
    }
  }

  async write(p: string, data: string | Uint8Array, opts: { mode?: number; createParents?: boolean } = {}): Promise<{ sha256: string; bytes: number }> {
    if (opts.createParents !== false) await this.mkdir(path.posix.dirname(p.startsWith('/') ? p : `/workspace/${p}`));
    const fd = this.open(p, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_TRUNC, opts.mode ?? 0o644);
    try {
      const owner = this.owner();
      if (owner !== null && fs.fstatSync(fd).uid === 0) fs.fchownSync(fd, owner, owner);
      const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
      fs.writeSync(fd, buf);
      return { sha256: createHash('sha256').update(buf).digest('hex'), bytes: buf.length };
    } catch (e) {
      mapError(e, p);
    } finally {
      fs.closeSync(fd);
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
        const fd = native().openBeneath(this.root(), next, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
        fs.closeSync(fd);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') mapError(e, p);
        const parentFd = native().openBeneath(this.root(), cur, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
        try {
          fs.mkdirSync(`/proc/self/fd/${parentFd}/${part}`, { mode: 0o755 });
          const owner = this.owner();
          if (owner !== null) fs.lchownSync(`/proc/self/fd/${parentFd}/${part}`, owner, owner);
        } catch (e2) {
          if ((e2 as NodeJS.ErrnoException).code !== 'EEXIST') mapError(e2, p);
        } finally {
          fs.closeSync(parentFd);
        }
      }
      cur = next;
    }
  }

  async list(p: string): Promise<FileEntry[]> {
    const fd = this.open(p, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    try {
      const base = `/proc/self/fd/${fd}`;
      const abs = '/' + sandboxRelative(p);
      return fs
        .readdirSync(base)
        .sort()
        .map((name) => {
          const st = fs.lstatSync(`${base}/${name}`);
          const type = st.isFile() ? 'file' : st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symlink' : 'other';
          return { name, path: path.posix.join(abs, name), type, size: st.size, mode: st.mode & 0o7777, mtimeMs: st.mtimeMs } as FileEntry;
        });
    } catch (e) {
      mapError(e, p);
    } finally {
      fs.closeSync(fd);
    }
  }

  async exists(p: string): Promise<boolean> {
    try {
      const fd = this.open(p, native().openFlags.O_PATH);
      fs.closeSync(fd);
      return true;
    } catch (e) {
      if (e instanceof FileNotFoundError) return false;
      throw e;
    }
  }

  /** Removes a file, symlink or empty directory (trees are removed inside the sandbox by the caller). */
  async remove(p: string): Promise<void> {
    const [dirFd, leaf] = this.openParent(p);
    const target = `/proc/self/fd/${dirFd}/${leaf}`;
    try {
      const st = fs.lstatSync(target);
      if (st.isDirectory()) fs.rmdirSync(target);
      else fs.unlinkSync(target);
    } catch (e) {
      mapError(e, p);
    } finally {
      fs.closeSync(dirFd);
    }
  }
}
