/**
 * readDirPage: pages in name order, every name exactly once across pages,
 * whatever the limit, for names readdir returns in its own order.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'ava';
import { readDirPage } from '../../src/instances/dir-page.js';

test('pages through a directory in name order; every name once, for any limit', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dir-page-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const names = ['b', 'a', 'Z', '10', '9', 'é', 'e', 'ünïcode', 'x y', '.hidden'];
  for (let i = 0; i < 200; i++) names.push(`f${(i * 7919) % 1000}`);
  for (const n of names) fs.writeFileSync(path.join(dir, n), '');
  const want = [...names].sort();

  t.deepEqual(await readDirPage(dir, Infinity), { names: want, more: false });
  for (const limit of [1, 3, 64, want.length - 1, want.length, want.length + 5]) {
    const got: string[] = [];
    let after: string | undefined;
    for (let pages = 0; ; pages++) {
      if (pages > want.length) return t.fail(`limit ${limit}: does not end`);
      const page = await readDirPage(dir, limit, after);
      t.true(page.names.length <= limit);
      got.push(...page.names);
      if (!page.more) break;
      after = page.names.at(-1);
    }
    t.deepEqual(got, want, `limit ${limit}`);
  }
  t.deepEqual(await readDirPage(dir, 5, want.at(-1)), { names: [], more: false });
});
