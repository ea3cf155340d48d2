/** sandbox.files: the sandbox's files, with every read, write and listing recorded as an observation. */
import {
  SandboxFiles,
  type FileEntry,
  type FilePage,
  type FileReadStream,
  type ListPageOptions,
  type WriteOptions,
} from '../instances/files.js';
import type { AdmissionLimits } from '../admission.js';
import type { Readable } from 'node:stream';
import { SandboxCore, validateToolCallId, type Provenance } from './sandbox-core.js';

/**
 * Listings in flight at once: each reads its whole directory (on the pool,
 * holding only a page), so these bound the I/O and CPU a caller can make the
 * manager spend; past them RATE_LIMITED.
 */
export const LISTING_LIMITS: AdmissionLimits = { what: 'directory listings', perKey: 4, total: 16, scope: 'tenant' };

/** Files of a sandbox, with every read, write and listing recorded as an observation. */
export class ObservedFiles {
  constructor(
    private readonly sandbox: SandboxCore,
    private readonly raw: SandboxFiles,
  ) {}

  private record(
    kind: 'file-read' | 'file-write' | 'file-list',
    path: string,
    extra: { contentHash?: string; summary?: string },
    p: Provenance,
  ): string | undefined {
    if (p.observe === false) return undefined;
    const toolCallId = validateToolCallId(p.toolCallId);
    return this.sandbox.engine.agent.observe(this.sandbox.row(), {
      kind,
      subject: path,
      ...extra,
      ...(toolCallId ? { toolCallId } : {}),
    }).id;
  }

  /** Reads a file; returns its bytes, their sha256 and the observation id. */
  async read(
    path: string,
    p: Provenance & { maxBytes?: number | undefined } = {},
  ): Promise<{ content: Buffer; sha256: string; observationId: string | undefined }> {
    const r = await this.raw.read(path, { maxBytes: p.maxBytes });
    return { ...r, observationId: this.record('file-read', path, { contentHash: r.sha256 }, p) };
  }

  /**
   * Reads a file as a stream, for files too large to hold in memory. The read
   * is recorded as an observation (with the hash of what was delivered) when
   * the stream ends; `done` then gives the hash and the observation id.
   */
  async readStream(
    path: string,
    p: Provenance = {},
  ): Promise<
    Omit<FileReadStream, 'done'> & {
      done: Promise<{ sha256: string; bytes: number; observationId: string | undefined }>;
    }
  > {
    const validated = { toolCallId: validateToolCallId(p.toolCallId), observe: p.observe };
    const r = await this.raw.readStream(path);
    const done = r.done.then((d) => ({
      ...d,
      observationId: this.record('file-read', path, { contentHash: d.sha256 }, validated),
    }));
    done.catch(() => undefined); // a stream the caller cuts off is not an unhandled rejection
    return { ...r, done };
  }

  async write(
    path: string,
    data: string | Uint8Array,
    opts: { mode?: number } & Provenance = {},
  ): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    const r = await this.raw.write(path, data, opts.mode !== undefined ? { mode: opts.mode } : {});
    return { ...r, observationId: this.record('file-write', path, { contentHash: r.sha256 }, opts) };
  }

  /**
   * Writes a file from a stream (a Readable or any async iterable of bytes); the
   * file changes only once all of it arrived.
   */
  async writeStream(
    path: string,
    source: Readable | AsyncIterable<Uint8Array | string>,
    opts: Pick<WriteOptions, 'mode' | 'maxBytes' | 'signal'> & Provenance = {},
  ): Promise<{ sha256: string; bytes: number; observationId: string | undefined }> {
    validateToolCallId(opts.toolCallId);
    const r = await this.raw.writeStream(path, source, {
      mode: opts.mode,
      maxBytes: opts.maxBytes,
      signal: opts.signal,
    });
    return { ...r, observationId: this.record('file-write', path, { contentHash: r.sha256 }, opts) };
  }

  /** Every entry of a directory, sorted by name (all of them in memory: listPage for a bounded answer). */
  async list(path: string, p: Provenance = {}): Promise<FileEntry[] & { observationId?: string }> {
    const entries = await this.admitted(() => this.raw.list(path));
    return Object.assign(entries, { observationId: this.recordList(path, entries, p) });
  }

  /** One page of a directory, sorted by name (see SandboxFiles.listPage); the page is the observation. */
  async listPage(
    path: string,
    opts: ListPageOptions & Provenance = {},
  ): Promise<FilePage & { observationId: string | undefined }> {
    validateToolCallId(opts.toolCallId);
    const page = await this.admitted(() => this.raw.listPage(path, { limit: opts.limit, cursor: opts.cursor }));
    return { ...page, observationId: this.recordList(path, page.entries, opts) };
  }

  private admitted<T>(fn: () => Promise<T>): Promise<T> {
    const engine = this.sandbox.engine;
    return engine.listings.run(this.sandbox.row().tenant ?? '', fn);
  }

  private recordList(path: string, entries: FileEntry[], p: Provenance): string | undefined {
    return this.record('file-list', path, { summary: namesUpTo(entries, 500) }, p);
  }

  async exists(path: string): Promise<boolean> {
    return this.raw.exists(path);
  }

  async remove(path: string, p: Provenance = {}): Promise<void> {
    await this.raw.remove(path);
    this.record('file-write', path, { summary: 'removed' }, p);
  }

  async mkdir(path: string): Promise<void> {
    await this.raw.mkdir(path);
  }

  /** Content hash of a file, or null if it does not exist (not recorded). */
  async hash(path: string): Promise<string | null> {
    return this.raw.hash(path);
  }
}

/** The entries' names, space-separated, cut at `max` characters (without joining a whole directory first). */
function namesUpTo(entries: FileEntry[], max: number): string {
  let s = '';
  for (const e of entries) {
    s += (s ? ' ' : '') + e.name;
    if (s.length >= max) break;
  }
  return s.slice(0, max);
}
