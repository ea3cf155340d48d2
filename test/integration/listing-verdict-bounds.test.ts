/**
 * What a sandbox can make the manager hold or compute through two APIs that
 * used to scale with it (security review, issue 23):
 *
 * - a listing of a folder with 100k entries answers in pages of at most
 *   LIST_MAX_LIMIT, sorted by name; paging through returns every name exactly
 *   once; listings in flight are bounded per tenant (RATE_LIMITED past
 *   them) while another tenant is answered exactly;
 * - a verdict on a 40 GB sparse file is bound to the file's identity, not to
 *   a hash of 40 GB: recording it and every rollback cost a stat; a write
 *   makes it stale, a restore of the unchanged file keeps it.
 *
 * Time, memory and event-loop delay are logged, never asserted.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createHash } from 'node:crypto';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';
import { LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT, VERDICT_HASH_MAX_BYTES } from '../../src/instances/files.js';
import { LISTING_LIMITS } from '../../src/api/observed-files.js';
import { Sandbox } from '../../src/client/index.js';

const MiB = 1024 * 1024;
const ENTRIES = 100_000;
const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
const rssMiB = () => Math.round(process.memoryUsage().rss / MiB);

integration(test, () => {
  test.serial(
    'a folder of 100k entries is listed in bounded, sorted pages that return every name once; listings in flight are capped per tenant',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const acme = client.as(tenantToken(ls, 'acme'));
      const other = client.as(tenantToken(ls, 'other'));
      // 256 MiB: busybox `ls` of 100k names holds them all, and the 100k new inodes and
      // dentries are charged to the sandbox too; at 64 MiB the set-up was OOM-killed now and then.
      const a = (await acme.post('/v1/sandboxes', { memoryMb: 256 })).body.id as string;
      const o = (await other.post('/v1/sandboxes', { memoryMb: 64 })).body.id as string;
      t.truthy(a && o);
      const mk = await acme.post(`/v1/sandboxes/${a}/commands`, {
        cmd: `mkdir /workspace/many && cd /workspace/many && seq -w 1 ${ENTRIES} | xargs touch && ls | wc -l`,
        timeoutMs: 120_000,
      });
      t.is(mk.status, 200, mk.text);
      t.is(mk.body.stdout.trim(), String(ENTRIES), mk.body.stderr);
      const w = await other.put(`/v1/sandboxes/${o}/files?path=/workspace/mine/note.txt`, { content: 'exactly this' });
      t.is(w.status, 200, w.text);
      const many = `/v1/sandboxes/${a}/files/list?path=/workspace/many`;

      // The default page: LIST_DEFAULT_LIMIT entries, the first names in order.
      const first = await acme.get(many);
      t.is(first.status, 200, first.text);
      t.is(first.body.entries.length, LIST_DEFAULT_LIMIT);
      t.is(first.body.entries[0].name, '000001');
      t.is(first.body.nextCursor, String(LIST_DEFAULT_LIMIT).padStart(6, '0'));
      t.true(typeof first.body.observationId === 'string');

      // Past the largest page: refused, naming the field.
      const tooMany = await acme.get(`${many}&limit=${LIST_MAX_LIMIT + 1}`);
      t.is(tooMany.status, 400, tooMany.text);
      t.regex(tooMany.text, /limit/);

      // Paging through at the largest page, while the other tenant is answered exactly.
      const rss0 = rssMiB();
      let peak = rss0;
      const sampler = setInterval(() => (peak = Math.max(peak, rssMiB())), 20);
      t.teardown(() => clearInterval(sampler));
      const seen = new Set<string>();
      let prev = '';
      let cursor: string | null = null;
      let pages = 0;
      let largestBody = 0;
      let otherAnswers = 0;
      const t0 = performance.now();
      do {
        const url: string = `${many}&limit=${LIST_MAX_LIMIT}${cursor === null ? '' : `&cursor=${encodeURIComponent(cursor)}`}`;
        const [page, mine] = await Promise.all([
          acme.get(url),
          other.get(`/v1/sandboxes/${o}/files?path=/workspace/mine/note.txt`),
        ]);
        t.is(page.status, 200, page.text);
        t.is(mine.status, 200, mine.text);
        t.is(mine.body.content, 'exactly this');
        otherAnswers++;
        t.true(page.body.entries.length <= LIST_MAX_LIMIT);
        largestBody = Math.max(largestBody, page.text.length);
        for (const e of page.body.entries as { name: string; type: string }[]) {
          t.false(seen.has(e.name), `${e.name} returned twice`);
          if (e.name <= prev) t.fail(`${e.name} after ${prev}: not sorted`);
          prev = e.name;
          seen.add(e.name);
        }
        cursor = page.body.nextCursor;
        if (++pages > ENTRIES / LIST_MAX_LIMIT + 1) t.fail(`more pages than ${ENTRIES} names need`);
      } while (cursor !== null && pages <= ENTRIES / LIST_MAX_LIMIT + 1);
      clearInterval(sampler);
      t.is(pages, ENTRIES / LIST_MAX_LIMIT);
      t.is(seen.size, ENTRIES, 'every name exactly once');
      t.true(seen.has('000001') && seen.has(String(ENTRIES)));
      // An answer holds one page: about 100 bytes of JSON an entry.
      t.true(largestBody < LIST_MAX_LIMIT * 200, `a page answered ${largestBody} bytes`);
      t.log(
        `${pages} pages of ${LIST_MAX_LIMIT} in ${Math.round(performance.now() - t0)} ms; ` +
          `largest answer ${(largestBody / MiB).toFixed(1)} MiB; manager RSS ${rss0} -> peak ${peak} MiB ` +
          `(+${peak - rss0}); ${otherAnswers} answers to the other tenant meanwhile`,
      );

      // Listings in flight: the tenant's slots held, its next listing is refused
      // at once with Retry-After; another tenant is not affected.
      const acmeId = tenantId(ls, 'acme');
      const held = Array.from({ length: LISTING_LIMITS.perKey }, () => ls.engine.listings.enter(acmeId));
      try {
        const refused = await acme.get(many);
        t.is(refused.status, 429, refused.text);
        t.is(refused.body.error.code, 'RATE_LIMITED');
        t.truthy(refused.headers.get('retry-after'));
        const theirs = await other.get(`/v1/sandboxes/${o}/files/list?path=/workspace/mine`);
        t.is(theirs.status, 200, theirs.text);
        t.deepEqual(
          theirs.body.entries.map((e: { name: string }) => e.name),
          ['note.txt'],
        );
        t.is(theirs.body.nextCursor, null);
      } finally {
        for (const release of held) release();
      }
      t.is(ls.engine.listings.inFlight(), 0, 'every listing released its slot');
      t.is((await acme.get(`${many}&limit=1`)).body.entries.length, 1, 'served again once the slots are free');

      // The TS client: listPage is one bounded page; list pages through for the caller.
      const remote = await Sandbox.connect(a, { apiUrl: client.base, apiKey: acme.token! });
      const p1 = await remote.files.listPage('/workspace/many', { limit: 3, cursor: '000100' });
      t.deepEqual(
        p1.entries.map((e) => e.name),
        ['000101', '000102', '000103'],
      );
      t.is(p1.nextCursor, '000103');
      const all = await remote.files.list('/workspace/many');
      t.is(all.length, ENTRIES);
      t.is(new Set(all.map((e) => e.name)).size, ENTRIES);

      // Many at once, for real: some may be refused, none holds more than a page.
      const burst = await Promise.all(Array.from({ length: 8 }, () => acme.get(`${many}&limit=${LIST_MAX_LIMIT}`)));
      for (const r of burst) t.true(r.status === 200 || r.status === 429, r.text);
      t.log(`8 listings at once: ${burst.filter((r) => r.status === 429).length} refused with 429`);
      t.is(ls.engine.listings.inFlight(), 0);
    },
  );

  test.serial(
    'a verdict on a 40 GB sparse file is bound to its identity: rollbacks stat it instead of hashing 40 GB, and a write makes it stale',
    async (t) => {
      const ls = await openTestLockstep(t);
      const sb = await ls.create({ memoryMb: 64 });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const big = '/workspace/disk.img';
      const small = '/workspace/small.txt';
      const mk = await sb.commands.run(`truncate -s 40G ${big} && printf v1 > ${small}`);
      t.is(mk.exitCode, 0, mk.stderr);

      let t0 = performance.now();
      const onBig = await sb.verdicts.record({ path: big, verdict: 'scan:clean' });
      t.log(`verdict on the 40 GB file recorded in ${Math.round(performance.now() - t0)} ms`);
      t.true(onBig.contentHash.startsWith('identity:size=42949672960,'), onBig.contentHash);
      const onSmall = await sb.verdicts.record({ path: small, verdict: 'scan:clean' });
      t.is(onSmall.contentHash, sha256('v1'), 'a file under the bound is still bound to its content');
      t.true(VERDICT_HASH_MAX_BYTES < 40 * 1024 * MiB);
      const c1 = await sb.checkpoint({ label: 'both scanned' });

      // A write into the big file (same size) and into the small one; verdicts on the new bytes.
      const w = await sb.commands.run(
        `printf x | dd of=${big} bs=1 seek=1000000 conv=notrunc 2>/dev/null && printf v2 > ${small}`,
      );
      t.is(w.exitCode, 0, w.stderr);
      const staleNow = (await sb.verdicts.stale()).map((v) => v.id).sort();
      t.deepEqual(staleNow, [onBig.id, onSmall.id].sort(), 'written: both verdicts are stale before any rollback');
      const onBig2 = await sb.verdicts.record({ path: big, verdict: 'scan:clean' });
      t.not(onBig2.contentHash, onBig.contentHash, 'the write changed the identity');
      const onSmall2 = await sb.verdicts.record({ path: small, verdict: 'scan:clean' });

      // Roll back to the checkpoint, watching the event loop.
      const h = monitorEventLoopDelay({ resolution: 10 });
      h.enable();
      t0 = performance.now();
      const report = await sb.rollback(c1.id);
      const rollbackMs = Math.round(performance.now() - t0);
      h.disable();
      t.log(
        `rollback with a verdict on a 40 GB file: ${rollbackMs} ms; event loop delay max ` +
          `${Math.round(h.max / 1e6)} ms, p99 ${Math.round(h.percentile(99) / 1e6)} ms`,
      );
      // The restored files are the checkpoint's: the verdicts made on them hold,
      // the ones made on the written bytes are stale (identity for the big file).
      const byId = new Map(report.staleVerdicts.map((v) => [v.id, v]));
      t.deepEqual([...byId.keys()].sort(), [onBig2.id, onSmall2.id].sort(), JSON.stringify(report.staleVerdicts));
      t.is(byId.get(onBig2.id)!.currentHash, onBig.contentHash, 'the restored big file has its checkpoint identity');
      t.is(byId.get(onSmall2.id)!.currentHash, sha256('v1'));
      t.true(
        report.recoverySummary.text.includes(
          `verdict "scan:clean" on ${big} no longer applies: the file was written or replaced since ` +
            '(over 64 MiB: compared by size, times and inode, not by content)',
        ),
        report.recoverySummary.text,
      );
      t.deepEqual(
        (await sb.verdicts.stale()).map((v) => v.id).sort(),
        [onBig2.id, onSmall2.id].sort(),
        'asked directly, the sandbox agrees',
      );
      const size = await sb.commands.run(`stat -c %s ${big}`);
      t.is(size.stdout.trim(), '42949672960');
    },
  );
});
