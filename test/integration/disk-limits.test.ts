/**
 * Issue 23, findings 9-12: resources outside every limit, disk. Each test
 * performs the attack the review found against a real btrfs store (and a
 * real HTTP server on loopback where the finding is HTTP) and checks that it
 * is refused or bounded; the store's host disk use is measured before and
 * after and logged, and another tenant's write still succeeds, byte for byte.
 */
import test from 'ava';
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantId, tenantToken } from '../fixtures/http-client.js';
import type { Lockstep } from '../../src/api/lockstep.js';

const MiB = 1024 * 1024;

/** Bytes the store's image file holds on the host's disk (its allocated blocks). */
function storeDiskBytes(ls: Lockstep): number {
  return fs.statSync(ls.engine.paths.storeImage).blocks * 512;
}

/** The catalog's bytes on disk (the database and its write-ahead log). */
function catalogBytes(ls: Lockstep): number {
  const db = ls.engine.catalog.db.name;
  return [db, `${db}-wal`].reduce((n, f) => n + (fs.existsSync(f) ? fs.statSync(f).size : 0), 0);
}

/** Another tenant writes a file and reads it back: the store still has room for it. */
async function neighbourWrites(t: import('ava').ExecutionContext, ls: Lockstep, tenant: string): Promise<void> {
  const sb = await ls.create({ image: 'base', memoryMb: 64, tenant });
  t.teardown(() => ls.remove(sb.id).catch(() => undefined));
  const data = randomBytes(MiB);
  await sb.files.write('/workspace/neighbour.bin', data);
  t.true((await sb.files.read('/workspace/neighbour.bin')).content.equals(data), "the neighbour's bytes, exactly");
  const ck = await sb.checkpoint();
  t.truthy(ck.id, 'and its checkpoint is taken');
}

integration(test, () => {
  test.serial(
    'finding 9: a sandbox that names no diskMb gets the default limit, so filling its layer stops there; maxDiskMb refuses the next create over HTTP; a neighbour still writes',
    async (t) => {
      const ls = await openTestLockstep(t, { open: { config: { defaultDiskMb: 64 } } });
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'filler', { maxDiskMb: 100 }));
      tenantToken(ls, 'neighbour');
      const before = storeDiskBytes(ls);
      const r = await api.post('/v1/sandboxes', { memoryMb: 64 });
      t.is(r.status, 201, r.text);
      t.is(r.body.diskMb, 64, 'the default disk limit');
      const id: string = r.body.id;
      t.teardown(() => ls.remove(id).catch(() => undefined));
      const fill = await api.post(`/v1/sandboxes/${id}/commands`, {
        cmd: 'dd if=/dev/urandom of=/workspace/fill bs=1M count=300; echo "dd=$?"; wc -c < /workspace/fill',
        timeoutMs: 120_000,
      });
      t.is(fill.status, 200, fill.text);
      t.regex(fill.body.stderr, /Disk quota exceeded/);
      const written = Number(String(fill.body.stdout).trim().split('\n').pop());
      t.true(written <= 64 * MiB, `dd wrote ${written} bytes, within the 64 MiB default`);
      await ls.engine.layers.sync();
      const after = storeDiskBytes(ls);
      t.log(`store on the host's disk: ${(before / MiB).toFixed(1)} MiB before, ${(after / MiB).toFixed(1)} MiB after`);
      t.true(after - before < 100 * MiB, `the store grew by ${((after - before) / MiB).toFixed(1)} MiB`);
      // 64 of 100 MiB are the first layer's: a second default layer does not fit.
      const second = await api.post('/v1/sandboxes', { memoryMb: 64 });
      t.is(second.status, 429, second.text);
      t.is(second.body.error.code, 'QUOTA_EXCEEDED');
      t.regex(second.body.error.message, /at most 100 MiB of disk .*it has 64 and asked for 64 more/);
      t.is(ls.list(tenantId(ls, 'filler')).length, 1, 'nothing was made for the refused create');
      await neighbourWrites(t, ls, tenantId(ls, 'neighbour'));
    },
  );

  test.serial(
    'finding 10: checkpoints count the layer bytes they pin: a tenant capped at 50 MiB cannot pin more with checkpoints, and its usage says what they hold',
    async (t) => {
      const ls = await openTestLockstep(t);
      tenantToken(ls, 'pinner', { maxCheckpointMb: 50 });
      tenantToken(ls, 'neighbour');
      const tenant = tenantId(ls, 'pinner');
      const sb = await ls.create({ image: 'base', memoryMb: 64, tenant });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const before = storeDiskBytes(ls);
      const results: string[] = [];
      let refused: unknown;
      for (let i = 0; i < 4 && !refused; i++) {
        // 20 MiB of new data each time: the layer (and each checkpoint of it) references more.
        const w = await sb.commands.run(['sh', '-c', `dd if=/dev/urandom of=/workspace/f${i} bs=1M count=20 2>&1`], {
          timeoutMs: 60_000,
        });
        t.is(w.exitCode, 0, w.stdout);
        try {
          results.push((await sb.checkpoint()).id);
        } catch (e) {
          refused = e;
        }
      }
      const usage = ls.tenants.usage(tenant);
      await ls.engine.layers.sync();
      const after = storeDiskBytes(ls);
      t.log(
        `${results.length} checkpoint(s) taken; usage checkpointMb ${usage.checkpointMb}; store on the host's disk ` +
          `${(before / MiB).toFixed(1)} -> ${(after / MiB).toFixed(1)} MiB`,
      );
      t.is((refused as { code?: string })?.code, 'QUOTA_EXCEEDED', 'a checkpoint past 50 MiB is refused');
      t.like((refused as { details?: object }).details, { quota: 'maxCheckpointMb', limit: 50 });
      t.true(results.length >= 1 && results.length <= 2, `${results.length} checkpoints of 20, 40 MiB fit in 50`);
      t.true(usage.checkpointMb >= 20 * results.length, `checkpointMb ${usage.checkpointMb} counts the layer bytes`);
      t.true(usage.checkpointMb <= 50);
      t.is(ls.engine.catalog.checkpointsOf(sb.id).length, results.length, 'the refused checkpoint left no row');
      await neighbourWrites(t, ls, tenantId(ls, 'neighbour'));
    },
  );

  test.serial(
    'finding 11: replies too large to keep are not stored, so the catalog stops growing; a retry of such a key is refused (not run again); small replies still replay',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'replayer'));
      const sb = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id as string;
      t.teardown(() => ls.remove(sb).catch(() => undefined));
      // 8 MB of stdout and 8 MB of stderr per reply.
      const cmd =
        'head -c 8000000 /dev/zero | tr "\\0" a; head -c 8000000 /dev/zero | tr "\\0" b >&2; echo >> /workspace/runs';
      const before = catalogBytes(ls);
      for (let i = 0; i < 8; i++) {
        const r = await api.post(
          `/v1/sandboxes/${sb}/commands`,
          { cmd, timeoutMs: 60_000 },
          {
            headers: { 'idempotency-key': `big-${i}` },
          },
        );
        t.is(r.status, 200, r.text.slice(0, 300));
        t.is(String(r.body.stdout).length, 8_000_000, 'the request itself answers in full');
      }
      const after = catalogBytes(ls);
      t.log(
        `catalog: ${(before / MiB).toFixed(2)} MiB before, ${(after / MiB).toFixed(2)} MiB after 8 replies of 16 MB`,
      );
      t.true(after - before < 4 * MiB, `the catalog grew by ${((after - before) / MiB).toFixed(2)} MiB`);
      // A retry of one: refused, and the command is not run again.
      const retry = await api.post(
        `/v1/sandboxes/${sb}/commands`,
        { cmd, timeoutMs: 60_000 },
        {
          headers: { 'idempotency-key': 'big-3' },
        },
      );
      t.is(retry.status, 409, retry.text.slice(0, 300));
      t.is(retry.body.error.code, 'IDEMPOTENCY_KEY_CONFLICT');
      t.regex(retry.body.error.message, /not kept/);
      const runs = await api.post(`/v1/sandboxes/${sb}/commands`, { cmd: 'wc -l < /workspace/runs' });
      t.is(String(runs.body.stdout).trim(), '8', 'eight runs, not nine');
      // A small reply is kept and replayed.
      const small = await api.post(
        `/v1/sandboxes/${sb}/commands`,
        { cmd: 'echo small' },
        {
          headers: { 'idempotency-key': 'small' },
        },
      );
      const again = await api.post(
        `/v1/sandboxes/${sb}/commands`,
        { cmd: 'echo small' },
        {
          headers: { 'idempotency-key': 'small' },
        },
      );
      t.is(again.status, 200);
      t.is(again.headers.get('idempotent-replayed'), 'true');
      t.deepEqual(again.body, small.body);
    },
  );

  test.serial(
    'finding 12: eight concurrent slow imports for a tenant capped at 50 MiB together hold at most 50 MiB while they spool; the rest are refused; all reservations go',
    async (t) => {
      const ls = await openTestLockstep(t);
      tenantToken(ls, 'importer', { maxCheckpointMb: 50 });
      tenantToken(ls, 'neighbour');
      const tenant = tenantId(ls, 'importer');
      // A bundle of about 12 MiB (10 MiB of workspace, the process image), made without a tenant.
      const src = await ls.create({ image: 'base', memoryMb: 64 });
      t.teardown(() => ls.remove(src.id).catch(() => undefined));
      await src.commands.run(['sh', '-c', 'dd if=/dev/urandom of=/workspace/data bs=1M count=10 2>/dev/null']);
      const ck = await src.checkpoint();
      await src.durable(ck.id);
      const snap = await ls.snapshots.create(ck.id, { name: 'src' });
      const parts: Buffer[] = [];
      for await (const c of ls.snapshots.export(snap.id)) parts.push(c as Buffer);
      const bundle = Buffer.concat(parts);
      t.log(`bundle: ${(bundle.length / MiB).toFixed(1)} MiB`);
      // Each upload sends all but its last MiB, then waits (bounded) until every one has sent or failed.
      let open!: () => void;
      const gate = new Promise<void>((r) => (open = r));
      const timer = setTimeout(() => open(), 60_000);
      let waiting = 0;
      let settled = 0;
      async function* slow(): AsyncGenerator<Buffer> {
        const last = bundle.length - MiB;
        for (let i = 0; i < last; i += MiB) yield bundle.subarray(i, Math.min(i + MiB, last));
        waiting++;
        await gate;
        yield bundle.subarray(last);
      }
      const before = storeDiskBytes(ls);
      const imports = Array.from({ length: 8 }, (_, i) =>
        ls.snapshots
          .import(slow(), { tenant, name: `imp-${i}` })
          .then(
            (row) => ({ ok: true as const, id: row.id }),
            (e: { code?: string; details?: { quota?: string } }) => ({
              ok: false as const,
              code: e.code,
              quota: e.details?.quota,
            }),
          )
          .finally(() => settled++),
      );
      // Until every upload is either refused or parked at the gate, holding what it sent.
      const deadline = Date.now() + 60_000;
      let peakReserved = 0;
      while (waiting + settled < 8 && Date.now() < deadline) {
        peakReserved = Math.max(peakReserved, ls.tenants.usage(tenant).importingMb);
        await new Promise((r) => setTimeout(r, 50));
      }
      t.is(
        waiting + settled,
        8,
        `within 60 s every upload was parked or refused (${waiting} parked, ${settled} refused)`,
      );
      peakReserved = Math.max(peakReserved, ls.tenants.usage(tenant).importingMb);
      const held = ls.tenants.usage(tenant).importingMb;
      const spooling = storeDiskBytes(ls);
      t.log(
        `while spooling: ${held} MiB reserved (peak ${peakReserved}); store on disk ${(before / MiB).toFixed(1)} -> ${(spooling / MiB).toFixed(1)} MiB`,
      );
      t.true(peakReserved <= 50, `reserved ${peakReserved} MiB at most`);
      clearTimeout(timer);
      open();
      const results = await Promise.all(imports);
      const ok = results.filter((r) => r.ok);
      const refused = results.filter((r) => !r.ok);
      t.log(`${ok.length} imported, ${refused.length} refused: ${JSON.stringify(refused)}`);
      for (const r of ok) t.teardown(() => ls.snapshots.delete(r.id!).catch(() => undefined));
      t.true(ok.length >= 1 && ok.length <= Math.floor((50 * MiB) / bundle.length), `${ok.length} of 8 fit`);
      for (const r of refused) t.like(r, { code: 'QUOTA_EXCEEDED', quota: 'maxCheckpointMb' });
      const usage = ls.tenants.usage(tenant);
      t.is(usage.importingMb, 0, 'every reservation was released');
      t.true(usage.snapshotMb <= 50, `the tenant holds ${usage.snapshotMb} MiB of snapshots`);
      t.deepEqual(
        fs.readdirSync(ls.engine.paths.scratch).filter((f) => f.startsWith('import-')),
        [],
        'no spool or scratch left',
      );
      await neighbourWrites(t, ls, tenantId(ls, 'neighbour'));
    },
  );

  test.serial(
    'an SDK caller (no HTTP) is refused past maxDiskMb: create, fork and checkpoint, each naming the quota, leaving nothing behind',
    async (t) => {
      const ls = await openTestLockstep(t);
      tenantToken(ls, 'sdk', { maxDiskMb: 100 });
      const tenant = tenantId(ls, 'sdk');
      const a = await ls.create({ image: 'base', memoryMb: 64, diskMb: 40, tenant });
      t.teardown(() => ls.remove(a.id).catch(() => undefined));
      const e = await t.throwsAsync(ls.create({ image: 'base', memoryMb: 64, diskMb: 61, tenant }), {
        code: 'QUOTA_EXCEEDED',
      });
      t.like((e as unknown as { details: object }).details, {
        quota: 'maxDiskMb',
        limit: 100,
        used: 40,
        requested: 61,
      });
      t.is(ls.list(tenant).length, 1, 'the refused create left no sandbox');
      t.is(ls.tenants.usage(tenant).diskMb, 40, 'the layer counts its limit');
      const ck = await a.checkpoint();
      const used = ls.tenants.usage(tenant).diskMb;
      t.log(`after a checkpoint: ${used} MiB of 100 counted`);
      // Forks of 40 MiB each: only as many as fit are made.
      const forks = await a.fork(ck.id, { count: 2 });
      t.teardown(async () => {
        for (const f of forks) if (f.ok) await ls.remove(f.id).catch(() => undefined);
      });
      const made = forks.filter((f) => f.ok).length;
      t.is(made, used + 40 <= 100 ? 1 : 0, `${made} fork(s) fit`);
      const refused = forks.filter((f) => !f.ok);
      t.true(refused.length >= 1);
      for (const f of refused) t.like(f, { ok: false, error: { code: 'QUOTA_EXCEEDED' } });
      t.regex((refused[0] as { error: { message: string } }).error.message, /MiB of disk/);
      t.is(ls.list(tenant).length, 1 + made, 'refused forks left nothing');
    },
  );

  test.serial(
    'a tenant capped below the default disk limit still creates: its sandbox gets the cap; its CPU weight default applies',
    async (t) => {
      const ls = await openTestLockstep(t, { open: { config: { defaultDiskMb: 64 } } });
      tenantToken(ls, 'small', { maxDiskMb: 32, cpuWeight: 300 });
      const tenant = tenantId(ls, 'small');
      const sb = await ls.create({ image: 'base', memoryMb: 64, tenant });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const info = sb.info();
      t.is(info.diskMb, 32, 'the default is clamped to the tenant cap');
      t.is(info.cpuWeight, 300, "the tenant's default CPU weight");
      const fill = await sb.commands.run(
        'dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; wc -c < /workspace/fill',
      );
      const written = Number(fill.stdout.trim().split('\n').pop());
      t.true(written <= 32 * MiB, `dd wrote ${written} bytes, within the 32 MiB cap`);
      await t.throwsAsync(ls.create({ image: 'base', memoryMb: 64, tenant }), { code: 'QUOTA_EXCEEDED' });
    },
  );
});
