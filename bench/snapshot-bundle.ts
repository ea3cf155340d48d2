/**
 * What moving a snapshot costs: export, transfer and import times and the
 * bundle's size, for (a) a Python process holding 64 MiB (the `dev` image)
 * and (b) a workspace of N MiB of random bytes (default 1024).
 * Export: the bundle stream into a file. Transfer: `GET
 * /v1/snapshots/:id/bundle` from a server on loopback into a file (the
 * export runs on the server side meanwhile, as in a pull). Import: the file
 * into a second state directory, verified (digest and signature: the second
 * state directory trusts the first one's key). Push and pull: the same
 * snapshot through a folder snapshot store (on /var/tmp), pushed from the
 * first state directory (then pushed again: nothing sent) and pulled into
 * the second. The load average is printed with each run (the machine is
 * shared). Not part of `npm test`.
 * Run: node dist/bench/snapshot-bundle.js [--workspace-mib N] [--skip-python]
 */
import fs from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { Lockstep, type Sandbox } from '../src/index.js';
import { createServer } from '../src/http/server.js';
import { DirSnapshotStore } from '../src/snapshots/dir-store.js';
import { addTenant, migrateTenants } from '../src/tenants/tenants.js';

const { values } = parseArgs({
  options: { 'workspace-mib': { type: 'string' }, 'skip-python': { type: 'boolean' } },
});
const workspaceMib = Number(values['workspace-mib'] ?? 1024);
const MiB = 1024 * 1024;
process.env.LOCKSTEP_STANDBY = 'off'; // no second copy of the memory in the background

async function measure(label: string, src: Lockstep, dst: Lockstep, tenant: string, token: string, sb: Sandbox) {
  const ckpt = await sb.checkpoint();
  const snap = await src.snapshots.create(ckpt.id, { tenant });
  const file = `/var/tmp/lockstep-bench-bundle-${process.pid}`;
  try {
    const load0 = os.loadavg()[0]!;
    let t = performance.now();
    await pipeline(src.snapshots.export(snap.id), fs.createWriteStream(file));
    const exportMs = performance.now() - t;
    const bytes = fs.statSync(file).size;

    const app = createServer({ lockstep: src, sweepIntervalMs: 0 });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const addr = app.server.address() as { port: number };
    t = performance.now();
    const res = await fetch(`http://127.0.0.1:${addr.port}/v1/snapshots/${snap.id}/bundle`, {
      headers: { authorization: `Bearer ${token}`, accept: 'application/octet-stream' },
    });
    await pipeline(Readable.fromWeb(res.body! as WebReadableStream<Uint8Array>), fs.createWriteStream(file));
    const transferMs = performance.now() - t;
    await app.shutdown({ graceMs: 1000 });

    t = performance.now();
    const imported = await dst.snapshots.import(fs.createReadStream(file, { highWaterMark: MiB }));
    const importMs = performance.now() - t;
    t = performance.now();
    const started = await dst.create({ fromSnapshot: imported.id });
    const startMs = performance.now() - t;
    await dst.remove(started.id);
    await dst.snapshots.delete(imported.id);

    // Through a folder snapshot store: push, push again, pull.
    const storeDir = `/var/tmp/lockstep-bench-store-${process.pid}`;
    const store = new DirSnapshotStore(storeDir);
    let push: { ms: number; uploadedChunks: number; chunks: number };
    let pushAgain: { ms: number; uploadedChunks: number };
    let pullMs: number;
    try {
      push = await src.snapshots.push(snap.id, { store, key: 'bench', tenant });
      pushAgain = await src.snapshots.push(snap.id, { store, key: 'bench', tenant });
      t = performance.now();
      const pulled = await dst.snapshots.pull('bench', { store, tenant });
      pullMs = performance.now() - t;
      await dst.snapshots.delete(pulled.snapshot.id);
    } finally {
      fs.rmSync(storeDir, { recursive: true, force: true });
    }
    console.log(
      JSON.stringify({
        label,
        bundleMiB: +(bytes / MiB).toFixed(1),
        snapshotSizeMiB: +(snap.sizeBytes / MiB).toFixed(1),
        exportMs: Math.round(exportMs),
        transferMs: Math.round(transferMs),
        importMs: Math.round(importMs),
        startFromImportMs: Math.round(startMs),
        pushMs: Math.round(push.ms),
        pushChunks: `${push.uploadedChunks}/${push.chunks}`,
        pushAgainMs: Math.round(pushAgain.ms),
        pushAgainSent: pushAgain.uploadedChunks,
        pullMs: Math.round(pullMs),
        load1: [load0, os.loadavg()[0]!].map((l) => +l.toFixed(1)),
      }),
    );
  } finally {
    fs.rmSync(file, { force: true });
    await src.snapshots.delete(snap.id).catch(() => undefined);
  }
}

const homes = [`/var/tmp/lockstep-bench-snap-a-${process.pid}`, `/var/tmp/lockstep-bench-snap-b-${process.pid}`];
const src = await Lockstep.open({ home: homes[0] });
// The second host imports what the first one signed.
const dst = await Lockstep.open({ home: homes[1], config: { trustedBundleKeys: [src.snapshots.signingKey()] } });
try {
  for (const ls of [src, dst]) {
    await ls.images.ensure('base');
    if (!values['skip-python']) await ls.images.ensure('dev');
  }
  migrateTenants(src.engine.catalog.db);
  const { tenant, token } = addTenant(src.engine.catalog.db, 'bench');
  if (!values['skip-python']) {
    const sb = await src.create({ image: 'dev', memoryMb: 256, tenant: tenant.id });
    await sb.commands.spawn([
      'python3',
      '-c',
      'import os, time\nb = bytearray(os.urandom(64 << 20))\nwhile True: time.sleep(0.1)',
    ]);
    await new Promise((r) => setTimeout(r, 3000));
    await measure('python 64 MiB', src, dst, tenant.id, token, sb);
    await src.remove(sb.id);
  }
  if (workspaceMib > 0) {
    const sb = await src.create({ image: 'base', tenant: tenant.id });
    await sb.commands.run(['sh', '-c', `head -c ${workspaceMib * MiB} /dev/urandom > /workspace/big`], {
      timeoutMs: 1_800_000,
    });
    await measure(`workspace ${workspaceMib} MiB`, src, dst, tenant.id, token, sb);
    await src.remove(sb.id);
  }
} finally {
  await src.destroyAll({ deleteFiles: true });
  await dst.destroyAll({ deleteFiles: true });
}
