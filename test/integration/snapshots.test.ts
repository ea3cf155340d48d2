/**
 * Named snapshots and their bundles on real sandboxes (issue 14, items 1-2):
 * a snapshot outlives its checkpoint and its sandbox and starts sandboxes
 * whose processes, files, context and lineage carry on; its layer and
 * process image are the checkpoint's own files, freed with their last
 * holder; tenants see only their own; a bundle exported from one state
 * directory imports into another and starts the same sandbox there; a bad
 * byte, an unknown image or an incompatible host is a typed error that
 * leaves nothing behind; export and import stream a 256 MiB workspace in
 * bounded memory.
 */
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { integration, openTestLockstep, TEST_ROOT } from '../helpers/harness.js';
import { listDir } from '../fixtures/host-state.js';
import { counterValue, setTag, startCounter, startMemo, tagInMemory, waitCounter } from '../fixtures/stub-workloads.js';
import { BundleWriter, readBundle } from '../../src/snapshots/bundle-format.js';
import { addTenant, migrateTenants } from '../../src/tenants/tenants.js';
import { purgeTenant } from '../../src/api/tenants-entry.js';
import { Sandbox as RemoteSandbox, Snapshots as RemoteSnapshots } from '../../src/client/index.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

const MiB = 1024 * 1024;

integration(test, () => {
  let ls: Lockstep;
  let other: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];
  const files: string[] = [];

  test.before(async () => {
    const t = { teardown: (fn: () => Promise<void>) => teardowns.push(fn) };
    ls = await openTestLockstep(t, { images: ['base'] });
    // The second state directory imports what the first one signed.
    other = await openTestLockstep(t, {
      images: ['base'],
      open: { config: { trustedBundleKeys: [ls.snapshots.signingKey()] } },
    });
  });
  test.after.always(async () => {
    if (!process.env.KEEP_BUNDLES) for (const f of files) fs.rmSync(f, { force: true });
    for (const fn of teardowns.reverse()) await fn();
  });

  const bundleFile = (label: string) => {
    const f = path.join(TEST_ROOT, `bundle-${process.pid}-${label}-${Date.now()}`);
    files.push(f);
    return f;
  };

  /** A sandbox with a counter and a tag in memory, a file, and an effect recorded before its checkpoint. */
  async function prepared(t: ExecutionContext, m: Lockstep, tenant?: string) {
    const sb = await m.create({ image: 'base', ...(tenant ? { tenant } : {}) });
    t.teardown(() => m.remove(sb.id).catch(() => undefined));
    await startCounter(sb, m);
    await startMemo(sb, m);
    await setTag(m, sb.id, 'at-snapshot');
    await sb.files.write('/workspace/notes.txt', 'written before the snapshot\n');
    let ran = 0;
    await sb.effects.run({ kind: 'mail.send', input: { to: 'a@example.test' }, reversibility: 'irreversible' }, () => {
      ran++;
      return { messageId: 'm-1' };
    });
    await waitCounter(m, sb.id, (v) => v >= 5);
    const ckpt = await sb.checkpoint({
      label: 'snap me',
      context: { format: 'openai-chat', messages: [{ role: 'user', content: 'carry on' }] },
    });
    return { sb, ckpt, ran: () => ran };
  }

  /** Checks a sandbox started from the snapshot: memory, files, counter, lineage. */
  async function assertResumed(t: ExecutionContext, m: Lockstep, started: Sandbox, lineageId: string) {
    t.is(await tagInMemory(m, started.id), 'at-snapshot', 'the processes hold what they held at the checkpoint');
    t.is(
      (await started.files.read('/workspace/notes.txt')).content.toString(),
      'written before the snapshot\n',
      'the files are the checkpoint\u2019s',
    );
    const c = await counterValue(m, started.id);
    t.true((await waitCounter(m, started.id, (v) => v > c)) > c, 'the counter carries on');
    t.is(started.info().lineageId, lineageId, 'same lineage');
    let ranAgain = 0;
    const out = await started.effects.run(
      { kind: 'mail.send', input: { to: 'a@example.test' }, reversibility: 'irreversible' },
      () => {
        ranAgain++;
        return { messageId: 'm-2' };
      },
    );
    t.deepEqual(out, { messageId: 'm-1' }, 'the lineage-scoped effect replays its first output');
    t.is(ranAgain, 0, 'and does not run again');
  }

  test.serial(
    'a snapshot outlives its checkpoint and its sandbox, shares their files, and starts sandboxes',
    async (t) => {
      const { sb, ckpt } = await prepared(t, ls);
      const lineage = sb.info().lineageId;
      const snap = await ls.snapshots.create(ckpt.id, { name: 'nightly', metadata: { purpose: 'test' } });
      t.regex(snap.id, /^snap_/);
      t.like(snap, { name: 'nightly', metadata: { purpose: 'test' }, sourceCheckpointId: ckpt.id, lineageId: lineage });
      // Its size counts what it holds: the process image and the layer's files (shared, not copied).
      t.true(snap.sizeBytes >= ckpt.sizes.processImageBytes + 'written before the snapshot\n'.length);
      const row = ls.engine.catalog.db.prepare('SELECT * FROM snapshots WHERE id = ?').get(snap.id) as {
        layer_id: string;
        process_image: string;
      };
      t.is(row.layer_id, ckpt.layerId, 'the layer is shared, not copied');
      t.is(row.process_image, ckpt.id, 'the process image is shared, not copied');
      t.deepEqual(ls.snapshots.get('nightly'), snap, 'found by name');
      t.deepEqual(
        ls.snapshots.list().map((s) => s.id),
        [snap.id],
      );
      await t.throwsAsync(ls.snapshots.create(ckpt.id, { name: 'nightly' }), { code: 'SNAPSHOT_EXISTS' });
      await t.throwsAsync(ls.snapshots.create(ckpt.id, { name: 'Bad Name' }), { code: 'INVALID_ARGUMENT' });

      await sb.deleteCheckpoint(ckpt.id);
      await ls.remove(sb.id);
      const { paths } = ls.engine;
      t.true(fs.existsSync(paths.layer(ckpt.layerId)), 'the layer stays while the snapshot holds it');
      t.true(fs.existsSync(paths.processImage(ckpt.id)), 'the process image stays while the snapshot holds it');

      const started = await ls.create({ fromSnapshot: 'nightly' });
      t.teardown(() => ls.remove(started.id).catch(() => undefined));
      await assertResumed(t, ls, started, lineage);
      t.deepEqual(ls.snapshots.context(snap.id), {
        format: 'openai-chat',
        messages: [{ role: 'user', content: 'carry on' }],
      });
      const more = await ls.snapshots.start(snap.id, { count: 2 });
      t.is(more.filter((r) => r.ok).length, 2);
      for (const r of more) if (r.ok) await ls.remove(r.id);
      await t.throwsAsync(ls.create({ fromSnapshot: snap.id, memoryMb: 64 }), { code: 'INVALID_ARGUMENT' });

      await ls.snapshots.delete(snap.id);
      t.false(fs.existsSync(paths.layer(ckpt.layerId)), 'the last holder gone, the layer goes');
      t.false(fs.existsSync(paths.processImage(ckpt.id)), 'and the process image');
      t.throws(() => ls.snapshots.get(snap.id), { code: 'SNAPSHOT_NOT_FOUND' });
      // The sandbox started from it does not depend on it.
      t.is(await tagInMemory(ls, started.id), 'at-snapshot');
    },
  );

  test.serial('deleting the snapshot first keeps the files the checkpoint still holds', async (t) => {
    const { sb, ckpt } = await prepared(t, ls);
    const snap = await ls.snapshots.create(ckpt.id);
    await ls.snapshots.delete(snap.id);
    const { paths } = ls.engine;
    t.true(fs.existsSync(paths.layer(ckpt.layerId)));
    t.true(fs.existsSync(paths.processImage(ckpt.id)));
    await sb.deleteCheckpoint(ckpt.id);
    t.false(fs.existsSync(paths.layer(ckpt.layerId)));
    t.false(fs.existsSync(paths.processImage(ckpt.id)));
  });

  test.serial("a tenant never sees another tenant's snapshot", async (t) => {
    migrateTenants(ls.engine.catalog.db);
    const a = addTenant(ls.engine.catalog.db, `snap-a-${Date.now()}`).tenant;
    const b = addTenant(ls.engine.catalog.db, `snap-b-${Date.now()}`).tenant;
    const { ckpt } = await prepared(t, ls, a.id);
    await t.throwsAsync(ls.snapshots.create(ckpt.id, { tenant: b.id }), { code: 'CHECKPOINT_NOT_FOUND' });
    const snap = await ls.snapshots.create(ckpt.id, { tenant: a.id, name: 'mine' });
    t.teardown(() => ls.snapshots.delete(snap.id).catch(() => undefined));
    t.is(snap.tenant, a.id);
    for (const ref of [snap.id, 'mine']) {
      t.throws(() => ls.snapshots.get(ref, { tenant: b.id }), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(ls.snapshots.delete(ref, { tenant: b.id }), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(ls.snapshots.start(ref, { tenant: b.id }), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(ls.create({ fromSnapshot: ref, tenant: b.id }), { code: 'SNAPSHOT_NOT_FOUND' });
    }
    await t.throwsAsync(pipeline(ls.snapshots.export(snap.id, { tenant: b.id }), fs.createWriteStream('/dev/null')), {
      code: 'SNAPSHOT_NOT_FOUND',
    });
    t.deepEqual(ls.snapshots.list({ tenant: b.id }), []);
    t.deepEqual(
      ls.snapshots.list({ tenant: a.id }).map((s) => s.id),
      [snap.id],
    );
    // Removing the tenant removes its snapshots, and their files with their last holder.
    await purgeTenant(ls, a.name);
    t.throws(() => ls.snapshots.get(snap.id), { code: 'SNAPSHOT_NOT_FOUND' });
    t.false(fs.existsSync(ls.engine.paths.layer(ckpt.layerId)));
    t.false(fs.existsSync(ls.engine.paths.processImage(ckpt.id)));
  });

  /** Nothing an import makes is left in a state directory: no row, layer, image, scratch or journal entry. */
  function assertNothingImported(t: ExecutionContext, m: Lockstep, before: { layers: string[]; images: string[] }) {
    const { paths, catalog } = m.engine;
    t.deepEqual(listDir(paths.layers), before.layers, 'no layer');
    t.deepEqual(listDir(paths.processImages), before.images, 'no process image');
    t.deepEqual(listDir(paths.scratch), [], 'nothing in scratch');
    t.deepEqual(catalog.operations(), [], 'no journal entry');
    t.deepEqual(m.snapshots.list(), []);
  }

  /** Rewrites a bundle's header (and so its checksums and digest), as a different producer would have written it. */
  async function reframe(source: string, dest: string, edit: (h: Record<string, unknown>) => void): Promise<void> {
    const parts: { name: string; chunks: Buffer[] }[] = [];
    let header: Record<string, unknown> = {};
    for await (const ev of readBundle(fs.createReadStream(source))) {
      if (ev.type === 'header') header = ev.header as Record<string, unknown>;
      else if (ev.type === 'part') parts.push({ name: ev.name, chunks: [] });
      else if (ev.type === 'data') parts.at(-1)!.chunks.push(ev.chunk);
    }
    edit(header);
    const w = new BundleWriter();
    async function* all() {
      yield w.header(header);
      for (const p of parts) yield* w.part(p.name, p.chunks);
      yield w.end().frame;
    }
    await pipeline(all(), fs.createWriteStream(dest));
  }

  test.serial('a bundle moves a snapshot to another state directory; bad bundles leave nothing', async (t) => {
    const { sb, ckpt, ran } = await prepared(t, ls);
    const lineage = sb.info().lineageId;
    const snap = await ls.snapshots.create(ckpt.id, { name: 'travelling', metadata: { from: 'home-1' } });
    t.teardown(() => ls.snapshots.delete(snap.id).catch(() => undefined));
    await ls.remove(sb.id); // the bundle needs nothing of the sandbox

    const file = bundleFile('good');
    await pipeline(ls.snapshots.export(snap.id), fs.createWriteStream(file));
    const digest = ls.snapshots.get(snap.id).digest;
    t.regex(digest ?? '', /^[0-9a-f]{64}$/, 'the export names the bundle by its SHA-256');
    const again = bundleFile('again');
    await pipeline(ls.snapshots.export(snap.id), fs.createWriteStream(again));
    t.is(ls.snapshots.get(snap.id).digest, digest, 'exporting again gives the same bytes (content-addressed)');

    const { paths } = other.engine;
    const before = { layers: listDir(paths.layers), images: listDir(paths.processImages) };
    // A flipped byte in the middle (the layer's or the image's data).
    const bad = bundleFile('bad');
    const bytes = fs.readFileSync(file);
    bytes[Math.floor(bytes.length / 2)]! ^= 0x40;
    fs.writeFileSync(bad, bytes);
    await t.throwsAsync(other.snapshots.import(fs.createReadStream(bad)), { code: 'BUNDLE_CORRUPT' });
    assertNothingImported(t, other, before);
    // Cut short.
    fs.writeFileSync(bad, fs.readFileSync(file).subarray(0, Math.floor(bytes.length * 0.8)));
    await t.throwsAsync(other.snapshots.import(fs.createReadStream(bad)), { code: 'BUNDLE_CORRUPT' });
    assertNothingImported(t, other, before);
    // Intact, but from another image, or a kernel newer than this one.
    await reframe(file, bad, (h) => ((h.image as { name: string }).name = 'no-such-image'));
    const e = await t.throwsAsync(other.snapshots.import(fs.createReadStream(bad)), { code: 'IMAGE_NOT_FOUND' });
    t.regex(e!.message, /no-such-image/);
    assertNothingImported(t, other, before);
    await reframe(file, bad, (h) => ((h.host as { kernelRelease: string }).kernelRelease = '99.1.0'));
    await t.throwsAsync(other.snapshots.import(fs.createReadStream(bad)), { code: 'SNAPSHOT_INCOMPATIBLE' });
    assertNothingImported(t, other, before);
    await reframe(file, bad, (h) => (h.host as { cpuFlags: string[] }).cpuFlags.push('amx_tile', 'avx512_fp16'));
    if (!fs.readFileSync('/proc/cpuinfo', 'utf8').includes(' amx_tile'))
      await t.throwsAsync(other.snapshots.import(fs.createReadStream(bad)), { code: 'SNAPSHOT_INCOMPATIBLE' });
    assertNothingImported(t, other, before);

    const imported = await other.snapshots.import(fs.createReadStream(file));
    t.teardown(() => other.snapshots.delete(imported.id).catch(() => undefined));
    t.like(imported, { name: 'travelling', metadata: { from: 'home-1' }, lineageId: lineage, digest });
    t.deepEqual(other.snapshots.context(imported.id), ls.snapshots.context(snap.id));
    const started = await other.create({ fromSnapshot: imported.id });
    t.teardown(() => other.remove(started.id).catch(() => undefined));
    t.not(started.info().pid, null);
    await assertResumed(t, other, started, lineage);
    t.is(ran(), 1, 'the effect ran once, on the first host');
  });

  test.serial('export and import stream: memory does not grow with a 256 MiB workspace', async (t) => {
    const sb = await ls.create({ image: 'base', memoryMb: 128 });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    const w = await sb.commands.run('head -c 268435456 /dev/urandom > /workspace/big && sha256sum /workspace/big', {
      timeoutMs: 300_000,
    });
    t.is(w.exitCode, 0, w.stderr);
    const sum = w.stdout.split(' ')[0]!;
    const ckpt = await sb.checkpoint();
    const snap = await ls.snapshots.create(ckpt.id);
    t.teardown(() => ls.snapshots.delete(snap.id).catch(() => undefined));
    t.true(snap.sizeBytes >= 256 * MiB, `its size counts the workspace (${snap.sizeBytes} bytes)`);
    const file = bundleFile('big');
    const base = process.memoryUsage().rss;
    let peak = base;
    const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
    try {
      await pipeline(ls.snapshots.export(snap.id), fs.createWriteStream(file));
      const size = fs.statSync(file).size;
      t.true(size > 256 * MiB, `the bundle holds the workspace (${size} bytes)`);
      const imported = await other.snapshots.import(fs.createReadStream(file, { highWaterMark: MiB }));
      t.teardown(() => other.snapshots.delete(imported.id).catch(() => undefined));
      clearInterval(timer);
      t.log(
        `RSS before ${(base / MiB).toFixed(0)} MiB, peak ${(peak / MiB).toFixed(0)} MiB, bundle ${(size / MiB).toFixed(0)} MiB`,
      );
      t.true(
        peak - base < 96 * MiB,
        `RSS grew by ${((peak - base) / MiB).toFixed(0)} MiB for a ${(size / MiB).toFixed(0)} MiB bundle`,
      );
      const started = await other.create({ fromSnapshot: imported.id });
      t.teardown(() => other.remove(started.id).catch(() => undefined));
      const r = await started.commands.run('sha256sum /workspace/big', { timeoutMs: 120_000 });
      t.is(r.stdout.split(' ')[0], sum, 'the 256 MiB file arrived intact');
    } finally {
      clearInterval(timer);
    }
  });

  test.serial(
    'over HTTP with the TS client: create, list, bundle out and in (streamed, idempotent), start, tenants apart',
    async (t) => {
      const { client } = await startServer(t, ls);
      const acme = { apiUrl: client.base, apiKey: tenantToken(ls, `acme-${Date.now()}`) };
      const rival = { apiUrl: client.base, apiKey: tenantToken(ls, `rival-${Date.now()}`) };
      const sbx = await RemoteSandbox.create({ ...acme, memoryMb: 64 });
      t.teardown(() => sbx.kill().catch(() => false));
      await sbx.files.write('/workspace/over-http.txt', 'remote bytes\n');
      const ckpt = await sbx.checkpoint({
        context: { format: 'openai-chat', messages: [{ role: 'user', content: 'hi' }] },
      });
      const snaps = new RemoteSnapshots(acme);
      const snap = await snaps.create(ckpt.id, { name: 'remote', metadata: { via: 'http' } });
      t.teardown(() => snaps.delete(snap.id).catch(() => undefined));
      t.like(snap, { name: 'remote', metadata: { via: 'http' } });
      t.deepEqual(
        (await snaps.list()).map((s) => s.id),
        [snap.id],
      );
      t.deepEqual(await snaps.context('remote'), {
        format: 'openai-chat',
        messages: [{ role: 'user', content: 'hi' }],
      });

      // Another tenant: exactly a missing snapshot, on every route.
      const theirs = new RemoteSnapshots(rival);
      await t.throwsAsync(theirs.get(snap.id), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(theirs.delete('remote'), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(theirs.start(snap.id), { code: 'SNAPSHOT_NOT_FOUND' });
      await t.throwsAsync(pipeline(theirs.export(snap.id), fs.createWriteStream('/dev/null')), {
        code: 'SNAPSHOT_NOT_FOUND',
      });
      await t.throwsAsync(theirs.create(ckpt.id), { code: 'CHECKPOINT_NOT_FOUND' });
      await t.throwsAsync(RemoteSandbox.create({ ...rival, fromSnapshot: snap.id }), { code: 'SNAPSHOT_NOT_FOUND' });

      const file = bundleFile('http');
      await pipeline(snaps.export(snap.id), fs.createWriteStream(file));
      const key = `import-${Date.now()}`;
      const imported = await snaps.import(fs.createReadStream(file), { name: 'remote-copy', idempotencyKey: key });
      t.teardown(() => snaps.delete(imported.id).catch(() => undefined));
      const replay = await snaps.import(fs.createReadStream(file), { name: 'remote-copy', idempotencyKey: key });
      t.is(replay.id, imported.id, 'a retried import under the same key answers the first import');
      t.is((await snaps.list()).length, 2);
      const bad = bundleFile('http-bad');
      fs.writeFileSync(bad, fs.readFileSync(file).subarray(0, 1000));
      await t.throwsAsync(snaps.import(fs.createReadStream(bad), { name: 'broken' }), { code: 'BUNDLE_CORRUPT' });

      const started = await RemoteSandbox.create({ ...acme, fromSnapshot: 'remote-copy' });
      t.teardown(() => started.kill().catch(() => false));
      t.is((await started.files.read('/workspace/over-http.txt')).content.toString(), 'remote bytes\n');
      const more = await snaps.start('remote', { count: 2 });
      t.is(more.filter((r) => r.ok).length, 2);
      for (const r of more) if (r.ok) await RemoteSandbox.kill(r.id, acme);
      const pulled = await t.throwsAsync(snaps.pull({ from: 'http://127.0.0.1:9', snapshot: snap.id, token: 'x' }), {
        code: 'PULL_SOURCE_NOT_ALLOWED',
      });
      t.regex(pulled!.message, /LOCKSTEP_PULL_SOURCES/);
    },
  );
});
