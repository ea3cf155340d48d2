/**
 * Process images that store only the pages that changed.
 *
 * Soft-dirty tracking is off in this kernel, so CRIU cannot tell which pages
 * a process wrote since the last dump and writes all of them every time.
 * After the dump, the new page images are compared with the parent
 * checkpoint's, page by page, and rewritten to hold only the pages whose
 * bytes differ; the others become "in parent" entries (CRIU's own format for
 * incremental images: a `parent` symlink in the images folder, and pagemap
 * entries flagged PE_PARENT, which `criu restore` reads from the parent, and
 * from its parent, as far as needed). Restore, forks and standbys read the
 * chain with CRIU itself; nothing else changes.
 *
 * Two rules keep every chain readable and cheap:
 * - depth is bounded (MAX_CHAIN_DEPTH): a checkpoint whose parent is already
 *   that deep is stored whole, so a restore never walks more than that many
 *   images, however long the history;
 * - a checkpoint is deleted only after every image that links to it has
 *   absorbed the pages it took from it (flattenOnto), and linked to its
 *   grandparent instead; each step leaves a readable image, so a crash at any
 *   point loses nothing.
 *
 * Page bytes come from inside the sandbox and are only compared and copied;
 * the pagemaps are CRIU's, checked for order and bounds before use.
 */
import fs from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import protobuf from 'protobufjs';
import { InvalidStateError } from '../errors.js';

export const PAGE_SIZE = 4096;
/** Images a restore may have to read, the checkpoint's own included, is at most this plus one. */
export const MAX_CHAIN_DEPTH = 8;
export const PARENT_LINK = 'parent';

/** pagemap_entry flags (criu/include/pagemap.h); PE_LAZY (2) rides along on present entries and is kept. */
export const PE_PARENT = 1;
export const PE_PRESENT = 4;
/** The image-specific magic that follows CRIU's 4-byte common magic in pagemap images. */
export const PAGEMAP_MAGIC = 0x56084025;
const PAGEMAP_FILE = /^pagemap-(?:shmem-)?\d+\.img$/;
/** Pages compared per read: big enough for sequential I/O, small enough to stay in cache. */
const CHUNK_PAGES = 1024;

// images/pagemap.proto of CRIU 4.2: the page count moved to a 64-bit field
// 5 (huge mappings); field 2 is still required and written as 0.
const proto = protobuf.Root.fromJSON({
  nested: {
    pagemap_head: { fields: { pages_id: { rule: 'required', type: 'uint32', id: 1 } } },
    pagemap_entry: {
      fields: {
        vaddr: { rule: 'required', type: 'uint64', id: 1 },
        compat_nr_pages: { rule: 'required', type: 'uint32', id: 2 },
        in_parent: { type: 'bool', id: 3 },
        flags: { type: 'uint32', id: 4 },
        nr_pages: { type: 'uint64', id: 5 },
      },
    },
  },
});
const PagemapHead = proto.lookupType('pagemap_head');
const PagemapEntryType = proto.lookupType('pagemap_entry');

export interface PagemapEntry {
  vaddr: number;
  nrPages: number;
  flags: number;
}

export interface Pagemap {
  /** The 8 magic bytes the file starts with, written back unchanged. */
  magic: Buffer;
  pagesId: number;
  entries: PagemapEntry[];
}

/** What a rewrite did, for the checkpoint's sizes and the benchmark. */
export interface DeltaStats {
  pagesDumped: number;
  pagesStored: number;
  /** The parent checkpoint the image now links to; null when it was kept whole. */
  parentId: string | null;
}

function damaged(dir: string, why: string): InvalidStateError {
  const id = path.basename(dir);
  return new InvalidStateError('CHECKPOINT_DAMAGED', `Checkpoint ${id} has a damaged process image: ${why}`, {
    checkpointId: id,
  });
}

/** Reads and checks a CRIU pagemap image: entries in address order, none overlapping, each flagged once. */
export function readPagemap(file: string): Pagemap {
  const buf = fs.readFileSync(file);
  const dir = path.dirname(file);
  if (buf.length < 8 || buf.readUInt32LE(4) !== PAGEMAP_MAGIC)
    throw damaged(dir, `${path.basename(file)} is not a pagemap image`);
  const messages: Buffer[] = [];
  for (let off = 8; off < buf.length;) {
    if (off + 4 > buf.length) throw damaged(dir, `${path.basename(file)} ends inside a record`);
    const len = buf.readUInt32LE(off);
    if (off + 4 + len > buf.length) throw damaged(dir, `${path.basename(file)} ends inside a record`);
    messages.push(buf.subarray(off + 4, off + 4 + len));
    off += 4 + len;
  }
  if (!messages.length) throw damaged(dir, `${path.basename(file)} has no header`);
  const decode = <T>(what: () => T): T => {
    try {
      return what();
    } catch (e) {
      throw damaged(dir, `${path.basename(file)} has a record that does not decode (${(e as Error).message})`);
    }
  };
  const head = decode(() => PagemapHead.toObject(PagemapHead.decode(messages[0]!)) as { pages_id: number });
  let end = 0;
  const entries = messages.slice(1).map((m) => {
    const o = decode(
      () =>
        PagemapEntryType.toObject(PagemapEntryType.decode(m), { longs: Number }) as {
          vaddr: number;
          compat_nr_pages: number;
          nr_pages?: number;
          in_parent?: boolean;
          flags?: number;
        },
    );
    // Older CRIU: the count in field 2, and no flags (in_parent, else present); as criu/pagemap.c reads them.
    const nrPages = o.nr_pages ?? o.compat_nr_pages;
    const flags = o.flags ?? (o.in_parent ? PE_PARENT : PE_PRESENT);
    if (o.vaddr % PAGE_SIZE || nrPages < 1 || o.vaddr < end || !Number.isSafeInteger(o.vaddr + nrPages * PAGE_SIZE))
      throw damaged(dir, `${path.basename(file)} has entries out of order`);
    if (flags & PE_PARENT && flags & PE_PRESENT)
      throw damaged(dir, `${path.basename(file)} has an entry both present and in the parent`);
    end = o.vaddr + nrPages * PAGE_SIZE;
    return { vaddr: o.vaddr, nrPages, flags };
  });
  return { magic: Buffer.from(buf.subarray(0, 8)), pagesId: head.pages_id, entries };
}

/** Writes a pagemap image as CRIU does (tests build images with it). */
export function writePagemap(file: string, pm: Pagemap): void {
  writeAtomically(file, encodePagemap(pm), false);
}

/** Every page an image restores, by address, read through its chain (for checks; it holds them all in memory). */
export async function resolvedPages(dir: string, name: string): Promise<Map<number, Buffer>> {
  const out = new Map<number, Buffer>();
  const files = new Files();
  try {
    for (const x of resolveExtents(dir, name) ?? []) {
      const data = await files.read(x.file, x.offset, x.nrPages * PAGE_SIZE, Buffer.alloc(x.nrPages * PAGE_SIZE));
      for (let i = 0; i < x.nrPages; i++)
        out.set(x.vaddr + i * PAGE_SIZE, data.subarray(i * PAGE_SIZE, (i + 1) * PAGE_SIZE));
    }
  } finally {
    await files.close();
  }
  return out;
}

function encodePagemap(pm: Pagemap): Buffer {
  const parts: Buffer[] = [pm.magic];
  const record = (bytes: Uint8Array) => {
    const len = Buffer.alloc(4);
    len.writeUInt32LE(bytes.length);
    parts.push(len, Buffer.from(bytes));
  };
  record(PagemapHead.encode(PagemapHead.fromObject({ pages_id: pm.pagesId })).finish());
  for (const e of pm.entries)
    record(
      PagemapEntryType.encode(
        PagemapEntryType.fromObject({ vaddr: e.vaddr, compat_nr_pages: 0, nr_pages: e.nrPages, flags: e.flags }),
      ).finish(),
    );
  return Buffer.concat(parts);
}

/** Writes a file under a temporary name and renames it into place; `durable` fsyncs it first. */
function writeAtomically(file: string, data: Buffer, durable: boolean): void {
  const tmp = `${file}.tmp`;
  const fd = fs.openSync(tmp, 'w', 0o600);
  try {
    fs.writeSync(fd, data);
    if (durable) fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, file);
}

function fsyncDir(dir: string): void {
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

const pagesFile = (dir: string, id: number) => path.join(dir, `pages-${id}.img`);

/** The checkpoint id an image links to, or null. Only a sibling folder ("../<id>") is accepted. */
export function parentOf(dir: string): string | null {
  let target: string;
  try {
    target = fs.readlinkSync(path.join(dir, PARENT_LINK));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
  const m = /^\.\.\/([A-Za-z0-9_-]+)$/.exec(target);
  if (!m) throw damaged(dir, `its parent link points outside the store (${JSON.stringify(target)})`);
  return m[1]!;
}

/**
 * Removes the `parent` link of an image none of whose pages are in the
 * parent (CRIU makes the link whenever it is given a parent, and dumps
 * whole when the processes' tracking does not date from it), so that the
 * chain, and what deleting the parent must do first, stay as short as the
 * pages really need.
 */
export function dropUnusedParentLink(dir: string): void {
  for (const name of fs.readdirSync(dir)) {
    if (!PAGEMAP_FILE.test(name)) continue;
    if (readPagemap(path.join(dir, name)).entries.some((e) => e.flags & PE_PARENT)) return;
  }
  fs.rmSync(path.join(dir, PARENT_LINK), { force: true });
}

/** How many images a restore of this one reads beyond itself. */
export function chainDepth(dir: string): number {
  let depth = 0;
  for (let d = dir, p = parentOf(d); p; d = path.join(path.dirname(d), p), p = parentOf(d)) {
    if (++depth > MAX_CHAIN_DEPTH + 1) throw damaged(dir, 'its chain of parents is longer than the bound');
  }
  return depth;
}

/** A run of pages whose bytes are at `offset` in `file`. */
interface Extent {
  vaddr: number;
  nrPages: number;
  file: string;
  offset: number;
}

/**
 * Where each page of a pagemap really is, following PE_PARENT entries down
 * the chain: sorted extents of present pages. Null when this image has no
 * such pagemap (CRIU then restores the process without a parent for it).
 */
function resolveExtents(dir: string, name: string, depthLeft = MAX_CHAIN_DEPTH + 1): Extent[] | null {
  const file = path.join(dir, name);
  if (!fs.existsSync(file)) return null;
  const pm = readPagemap(file);
  const pages = pagesFile(dir, pm.pagesId);
  let parent: Extent[] | null | undefined;
  const out: Extent[] = [];
  let offset = 0;
  for (const e of pm.entries) {
    if (e.flags & PE_PRESENT) {
      out.push({ vaddr: e.vaddr, nrPages: e.nrPages, file: pages, offset });
      offset += e.nrPages * PAGE_SIZE;
    } else if (e.flags & PE_PARENT) {
      if (parent === undefined) {
        const p = parentOf(dir);
        if (!p || depthLeft <= 1) throw damaged(dir, `${name} takes pages from a parent it cannot reach`);
        parent = resolveExtents(path.join(path.dirname(dir), p), name, depthLeft - 1);
      }
      const covered = slice(parent ?? [], e.vaddr, e.nrPages);
      if (covered.reduce((n, x) => n + x.nrPages, 0) !== e.nrPages)
        throw damaged(dir, `${name} takes pages its parent does not have`);
      out.push(...covered);
    }
  }
  if (offset > fileSize(pages)) throw damaged(dir, `${path.basename(pages)} is shorter than its pagemap says`);
  return out;
}

function fileSize(file: string): number {
  try {
    return fs.statSync(file).size;
  } catch {
    return 0;
  }
}

/** The parts of sorted extents that fall in [vaddr, vaddr + nrPages pages). */
function slice(extents: Extent[], vaddr: number, nrPages: number): Extent[] {
  const end = vaddr + nrPages * PAGE_SIZE;
  const out: Extent[] = [];
  // Binary search for the first extent that ends after vaddr.
  let lo = 0;
  let hi = extents.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    const x = extents[mid]!;
    if (x.vaddr + x.nrPages * PAGE_SIZE <= vaddr) lo = mid + 1;
    else hi = mid;
  }
  for (let i = lo; i < extents.length && extents[i]!.vaddr < end; i++) {
    const x = extents[i]!;
    const from = Math.max(x.vaddr, vaddr);
    const to = Math.min(x.vaddr + x.nrPages * PAGE_SIZE, end);
    out.push({ vaddr: from, nrPages: (to - from) / PAGE_SIZE, file: x.file, offset: x.offset + (from - x.vaddr) });
  }
  return out;
}

/**
 * Open files by path, closed together. Reads are asynchronous (libuv's
 * pool), so that comparing a large image leaves the manager's event loop
 * free between chunks for the other sandboxes' calls.
 */
class Files {
  private readonly handles = new Map<string, Promise<FileHandle>>();
  private handle(file: string): Promise<FileHandle> {
    let h = this.handles.get(file);
    if (!h) this.handles.set(file, (h = fs.promises.open(file, 'r')));
    return h;
  }
  async read(file: string, offset: number, length: number, into: Buffer): Promise<Buffer> {
    const b = into.subarray(0, length);
    const h = await this.handle(file);
    for (let done = 0; done < length;) {
      const { bytesRead } = await h.read(b, done, length - done, offset + done);
      if (bytesRead === 0) throw damaged(path.dirname(file), `${path.basename(file)} is shorter than its pagemap says`);
      done += bytesRead;
    }
    return b;
  }
  async close(): Promise<void> {
    const all = [...this.handles.values()];
    this.handles.clear();
    await Promise.all(all.map(async (h) => (await h.catch(() => null))?.close()));
  }
}

/** Appends entries (merging with the last one when contiguous and alike) and their page bytes. */
class PagemapWriter {
  readonly entries: PagemapEntry[] = [];
  pagesWritten = 0;
  private constructor(
    readonly file: string,
    private readonly fh: FileHandle,
  ) {}
  static async create(file: string): Promise<PagemapWriter> {
    return new PagemapWriter(file, await fs.promises.open(file, 'w', 0o600));
  }
  async add(vaddr: number, nrPages: number, flags: number, data?: Buffer): Promise<void> {
    const last = this.entries.at(-1);
    if (last && last.flags === flags && last.vaddr + last.nrPages * PAGE_SIZE === vaddr) last.nrPages += nrPages;
    else this.entries.push({ vaddr, nrPages, flags });
    if (data) {
      for (let done = 0; done < data.length;)
        done += (await this.fh.write(data, done, data.length - done)).bytesWritten;
      this.pagesWritten += nrPages;
    }
  }
  async finish(durable: boolean): Promise<void> {
    try {
      if (durable) await this.fh.sync();
    } finally {
      await this.fh.close();
    }
  }
}

/**
 * Rewrites a fresh dump in `dir` to store only the pages that differ from
 * `parentDir`'s, linking the rest. Call it before the checkpoint is
 * committed: until then nothing reads the folder. The link is made first,
 * so a failure part way leaves some pagemaps whole and the others linked,
 * both readable. Returns what was stored; the image is kept whole when the
 * parent's chain is already MAX_CHAIN_DEPTH deep.
 */
export async function storeChangedPages(
  dir: string,
  parentDir: string,
  onParentUnusable: (err: unknown) => void = () => undefined,
): Promise<DeltaStats> {
  const names = fs.readdirSync(dir).filter((n) => PAGEMAP_FILE.test(n));
  const maps = names.map((n) => ({ name: n, pm: readPagemap(path.join(dir, n)) }));
  const pagesDumped = maps.reduce(
    (s, m) => s + m.pm.entries.reduce((t, e) => t + (e.flags & PE_PRESENT ? e.nrPages : 0), 0),
    0,
  );
  const whole = { pagesDumped, pagesStored: pagesDumped, parentId: null };
  if (!fs.existsSync(parentDir)) return whole;
  // The parent is read in full before anything here changes: a damaged
  // parent costs this checkpoint its savings, never its correctness.
  let bases: (Extent[] | null)[];
  try {
    if (chainDepth(parentDir) >= MAX_CHAIN_DEPTH) return whole;
    bases = maps.map((m) => resolveExtents(parentDir, m.name));
  } catch (e) {
    onParentUnusable(e);
    return whole;
  }
  const parentId = path.basename(parentDir);
  fs.symlinkSync(`../${parentId}`, path.join(dir, PARENT_LINK));

  const files = new Files();
  const a = Buffer.allocUnsafe(CHUNK_PAGES * PAGE_SIZE);
  const b = Buffer.allocUnsafe(CHUNK_PAGES * PAGE_SIZE);
  let pagesStored = 0;
  try {
    for (const [k, { name, pm }] of maps.entries()) {
      const base = bases[k];
      const src = pagesFile(dir, pm.pagesId);
      if (!base?.length || pm.entries.some((e) => !(e.flags & PE_PRESENT))) {
        pagesStored += pm.entries.reduce((t, e) => t + (e.flags & PE_PRESENT ? e.nrPages : 0), 0);
        continue;
      }
      // A new pages file, switched to by the pagemap's rename: the image reads whole or delta, never a mix.
      const id = unusedPagesId(dir);
      const out = await PagemapWriter.create(pagesFile(dir, id));
      try {
        let offset = 0;
        for (const e of pm.entries) {
          for (let done = 0; done < e.nrPages;) {
            const n = Math.min(CHUNK_PAGES, e.nrPages - done);
            const vaddr = e.vaddr + done * PAGE_SIZE;
            const fresh = await files.read(src, offset + done * PAGE_SIZE, n * PAGE_SIZE, a);
            // Per page: is it byte-for-byte what the parent restores at that address?
            const same = new Uint8Array(n);
            for (const x of slice(base, vaddr, n)) {
              const old = await files.read(x.file, x.offset, x.nrPages * PAGE_SIZE, b);
              const first = (x.vaddr - vaddr) / PAGE_SIZE;
              for (let i = 0; i < x.nrPages; i++) {
                const p = (first + i) * PAGE_SIZE;
                if (fresh.compare(old, i * PAGE_SIZE, (i + 1) * PAGE_SIZE, p, p + PAGE_SIZE) === 0) same[first + i] = 1;
              }
            }
            for (let i = 0; i < n;) {
              let j = i;
              while (j < n && same[j] === same[i]) j++;
              const at = vaddr + i * PAGE_SIZE;
              if (same[i]) await out.add(at, j - i, PE_PARENT);
              else await out.add(at, j - i, e.flags, fresh.subarray(i * PAGE_SIZE, j * PAGE_SIZE));
              i = j;
            }
            done += n;
          }
          offset += e.nrPages * PAGE_SIZE;
        }
      } finally {
        // Durability comes from the checkpoint's one filesystem commit.
        await out.finish(false);
      }
      writeAtomically(path.join(dir, name), encodePagemap({ ...pm, pagesId: id, entries: out.entries }), false);
      fs.rmSync(src);
      pagesStored += out.pagesWritten;
    }
  } finally {
    await files.close();
  }
  return { pagesDumped, pagesStored, parentId };
}

/**
 * Makes the image in `dir` independent of its parent P before P is deleted:
 * every page it took from P is copied in, and pages P itself took from its
 * parent G stay linked, now to G. Each pagemap is rewritten under a new
 * pages file and renamed into place (fsynced), then the link is moved to G
 * (or removed); every state in between restores the same bytes, so a
 * crash loses nothing. Idempotent: an image that does not link to P is left alone.
 * Returns whether the image linked to P (and so was rewritten).
 */
export async function flattenOnto(dir: string, parentId: string): Promise<boolean> {
  if (parentOf(dir) !== parentId) return false;
  const parentDir = path.join(path.dirname(dir), parentId);
  const grandparent = parentOf(parentDir);
  const files = new Files();
  const buf = Buffer.allocUnsafe(CHUNK_PAGES * PAGE_SIZE);
  const obsolete: string[] = [];
  try {
    for (const name of fs.readdirSync(dir).filter((n) => PAGEMAP_FILE.test(n))) {
      const pm = readPagemap(path.join(dir, name));
      if (!pm.entries.some((e) => e.flags & PE_PARENT)) continue;
      if (!fs.existsSync(path.join(parentDir, name)))
        throw damaged(dir, `${name} takes pages from a parent that has none`);
      const ppm = readPagemap(path.join(parentDir, name));
      // The parent's own entries, with where their bytes are (present) or that they go one level further.
      const own: (Extent & { flags: number })[] = [];
      let poff = 0;
      for (const e of ppm.entries) {
        own.push({
          vaddr: e.vaddr,
          nrPages: e.nrPages,
          file: pagesFile(parentDir, ppm.pagesId),
          offset: poff,
          flags: e.flags,
        });
        if (e.flags & PE_PRESENT) poff += e.nrPages * PAGE_SIZE;
      }
      const id = unusedPagesId(dir);
      const out = await PagemapWriter.create(pagesFile(dir, id));
      try {
        let off = 0;
        const copy = async (file: string, offset: number, vaddr: number, nrPages: number, flags: number) => {
          for (let done = 0; done < nrPages;) {
            const n = Math.min(CHUNK_PAGES, nrPages - done);
            await out.add(
              vaddr + done * PAGE_SIZE,
              n,
              flags,
              await files.read(file, offset + done * PAGE_SIZE, n * PAGE_SIZE, buf),
            );
            done += n;
          }
        };
        for (const e of pm.entries) {
          if (e.flags & PE_PRESENT) {
            await copy(pagesFile(dir, pm.pagesId), off, e.vaddr, e.nrPages, e.flags);
            off += e.nrPages * PAGE_SIZE;
          } else if (e.flags & PE_PARENT) {
            const parts = slice(own, e.vaddr, e.nrPages) as (Extent & { flags?: number })[];
            if (parts.reduce((n, x) => n + x.nrPages, 0) !== e.nrPages)
              throw damaged(dir, `${name} takes pages its parent does not have`);
            for (const x of parts) {
              const flags = own.find((o) => o.vaddr <= x.vaddr && x.vaddr < o.vaddr + o.nrPages * PAGE_SIZE)!.flags;
              if (flags & PE_PRESENT) await copy(x.file, x.offset, x.vaddr, x.nrPages, flags);
              else if (flags & PE_PARENT && grandparent) await out.add(x.vaddr, x.nrPages, PE_PARENT);
              else throw damaged(dir, `${name} takes pages its parent does not have`);
            }
          }
        }
      } finally {
        await out.finish(true);
      }
      writeAtomically(path.join(dir, name), encodePagemap({ ...pm, pagesId: id, entries: out.entries }), true);
      obsolete.push(pagesFile(dir, pm.pagesId));
    }
  } finally {
    await files.close();
  }
  const link = path.join(dir, PARENT_LINK);
  if (grandparent) {
    fs.rmSync(`${link}.tmp`, { force: true });
    fs.symlinkSync(`../${grandparent}`, `${link}.tmp`);
    fs.renameSync(`${link}.tmp`, link);
  } else {
    fs.rmSync(link, { force: true });
  }
  fsyncDir(dir);
  for (const f of obsolete) fs.rmSync(f, { force: true });
  return true;
}

function unusedPagesId(dir: string): number {
  let max = 0;
  for (const n of fs.readdirSync(dir)) {
    const m = /^pages-(\d+)\.img/.exec(n);
    if (m) max = Math.max(max, Number(m[1]));
  }
  return max + 1;
}
