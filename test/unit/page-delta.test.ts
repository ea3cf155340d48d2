/**
 * The page-delta format logic on synthetic CRIU images (no root, no CRIU):
 * a delta restores exactly the bytes of the dump it replaced, through its
 * chain; flattening before a delete keeps every byte at every step; a
 * damaged parent costs the savings, never the image; bad pagemaps and
 * links are refused with CHECKPOINT_DAMAGED.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import {
  PAGE_SIZE,
  PAGEMAP_MAGIC,
  PE_PRESENT,
  chainDepth,
  flattenOnto,
  parentOf,
  readPagemap,
  resolvedPages,
  storeChangedPages,
  writePagemap,
  type PagemapEntry,
} from '../../src/checkpoints/page-delta.js';

const MAGIC = Buffer.alloc(8);
MAGIC.writeUInt32LE(0x54564319, 0);
MAGIC.writeUInt32LE(PAGEMAP_MAGIC, 4);
const MAP = 'pagemap-1.img';

function store(t: ExecutionContext): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'page-delta-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A dump as CRIU writes it: every page present, in runs of consecutive addresses. */
function dump(root: string, id: string, pages: Map<number, Buffer>): string {
  const dir = path.join(root, id);
  fs.mkdirSync(dir);
  const addrs = [...pages.keys()].sort((a, b) => a - b);
  const entries: PagemapEntry[] = [];
  for (const a of addrs) {
    const last = entries.at(-1);
    if (last && last.vaddr + last.nrPages * PAGE_SIZE === a) last.nrPages++;
    else entries.push({ vaddr: a, nrPages: 1, flags: PE_PRESENT });
  }
  fs.writeFileSync(path.join(dir, 'pages-1.img'), Buffer.concat(addrs.map((a) => pages.get(a)!)));
  writePagemap(path.join(dir, MAP), { magic: MAGIC, pagesId: 1, entries });
  fs.writeFileSync(path.join(dir, 'core-1.img'), 'not pages');
  return dir;
}

/** 64 pages in two runs, random bytes. */
function memoryOf(): Map<number, Buffer> {
  const m = new Map<number, Buffer>();
  for (let i = 0; i < 32; i++) m.set(0x10000 + i * PAGE_SIZE, randomBytes(PAGE_SIZE));
  for (let i = 0; i < 32; i++) m.set(0x800000 + i * PAGE_SIZE, randomBytes(PAGE_SIZE));
  return m;
}

function changed(m: Map<number, Buffer>, addrs: number[]): Map<number, Buffer> {
  const next = new Map(m);
  for (const a of addrs) next.set(a, randomBytes(PAGE_SIZE));
  return next;
}

async function assertPages(t: ExecutionContext, dir: string, want: Map<number, Buffer>, what: string) {
  const got = await resolvedPages(dir, MAP);
  t.deepEqual(
    [...got.keys()].sort((a, b) => a - b),
    [...want.keys()].sort((a, b) => a - b),
    `${what}: addresses`,
  );
  for (const [a, b] of want) t.true(got.get(a)?.equals(b), `${what}: page ${a.toString(16)}`);
}

const pagesBytes = (dir: string) =>
  fs.statSync(path.join(dir, `pages-${readPagemap(path.join(dir, MAP)).pagesId}.img`)).size;

test('a delta stores only the changed pages and restores every byte through a chain', async (t) => {
  const root = store(t);
  const m1 = memoryOf();
  const m2 = changed(m1, [0x10000, 0x800000 + 5 * PAGE_SIZE]);
  // A page that disappeared (not dumped) and one that is new.
  m2.delete(0x10000 + 31 * PAGE_SIZE);
  m2.set(0x900000, randomBytes(PAGE_SIZE));
  const m3 = changed(m2, [0x800000 + 31 * PAGE_SIZE]);
  const a = dump(root, 'A', m1);
  const b = dump(root, 'B', m2);
  const c = dump(root, 'C', m3);

  t.like(await storeChangedPages(b, a), { pagesDumped: 64, pagesStored: 3, parentId: 'A' });
  t.like(await storeChangedPages(c, b), { pagesDumped: 64, pagesStored: 1, parentId: 'B' });
  t.is(pagesBytes(b), 3 * PAGE_SIZE);
  t.is(pagesBytes(c), PAGE_SIZE);
  t.is(parentOf(c), 'B');
  t.is(chainDepth(c), 2);
  await assertPages(t, a, m1, 'A');
  await assertPages(t, b, m2, 'B');
  await assertPages(t, c, m3, 'C');
  t.is(fs.readFileSync(path.join(c, 'core-1.img'), 'utf8'), 'not pages', 'other images untouched');
});

test('flattening before a delete keeps every byte: middle first, then the root', async (t) => {
  const root = store(t);
  const m1 = memoryOf();
  const m2 = changed(m1, [0x10000 + PAGE_SIZE]);
  const m3 = changed(m2, [0x800000]);
  const a = dump(root, 'A', m1);
  const b = dump(root, 'B', m2);
  const c = dump(root, 'C', m3);
  await storeChangedPages(b, a);
  await storeChangedPages(c, b);

  await flattenOnto(c, 'B');
  t.is(parentOf(c), 'A', 'C now links to its grandparent');
  t.is(pagesBytes(c), 2 * PAGE_SIZE, "C took B's one page");
  fs.rmSync(b, { recursive: true });
  await assertPages(t, c, m3, 'C without B');

  await flattenOnto(c, 'B'); // again, as after a crash: nothing to do
  t.is(parentOf(c), 'A');
  await flattenOnto(c, 'A');
  t.is(parentOf(c), null);
  fs.rmSync(a, { recursive: true });
  await assertPages(t, c, m3, 'C alone');
  t.deepEqual(
    fs.readdirSync(c).filter((n) => n.startsWith('pages-')),
    [`pages-${readPagemap(path.join(c, MAP)).pagesId}.img`],
    'the old pages file is gone',
  );
});

test('a parent that cannot be read leaves the new image whole and unlinked', async (t) => {
  const root = store(t);
  const m1 = memoryOf();
  const a = dump(root, 'A', m1);
  const b = dump(root, 'B', changed(m1, [0x10000]));
  fs.truncateSync(path.join(a, 'pages-1.img'), PAGE_SIZE);
  const errors: unknown[] = [];
  t.like(await storeChangedPages(b, a, (e) => errors.push(e)), { parentId: null, pagesStored: 64 });
  t.like(errors[0], { code: 'CHECKPOINT_DAMAGED' });
  t.is(parentOf(b), null);
  t.is(pagesBytes(b), 64 * PAGE_SIZE);
});

test('damaged pagemaps and links outside the store are refused', (t) => {
  const root = store(t);
  const a = dump(root, 'A', memoryOf());
  writePagemap(path.join(a, MAP), {
    magic: MAGIC,
    pagesId: 1,
    entries: [
      { vaddr: 0x20000, nrPages: 1, flags: PE_PRESENT },
      { vaddr: 0x10000, nrPages: 1, flags: PE_PRESENT },
    ],
  });
  t.throws(() => readPagemap(path.join(a, MAP)), { code: 'CHECKPOINT_DAMAGED', message: /out of order/ });
  fs.writeFileSync(path.join(a, 'pagemap-2.img'), 'garbage!');
  t.throws(() => readPagemap(path.join(a, 'pagemap-2.img')), { code: 'CHECKPOINT_DAMAGED', message: /not a pagemap/ });
  fs.symlinkSync('/etc', path.join(a, 'parent'));
  t.throws(() => parentOf(a), { code: 'CHECKPOINT_DAMAGED', message: /outside the store/ });
});
