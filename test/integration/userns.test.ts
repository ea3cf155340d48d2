/**
 * User namespaces on real sandboxes: root inside is an unprivileged host id
 * range of the sandbox's own (recorded in the catalog, disjoint from every
 * other sandbox's, freed on remove); files it writes carry those ids on the
 * host while the image stays untouched; files only a host id owns are out
 * of its reach; and checkpoint, rollback (both paths) and fork keep the
 * tree in a user namespace with the right map and its state intact.
 */
import fs from 'node:fs';
import path from 'node:path';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { FIRST_ID_BASE, ID_RANGE_SIZE } from '../../src/instances/id-ranges.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { counterInLayer, hostPath, startCounter, waitCounter } from '../fixtures/stub-workloads.js';

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    // Explicitly on, whatever LOCKSTEP_USERNS says.
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { images: ['base'], open: { userNamespaces: true } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext): Promise<Sandbox> {
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  const idBase = (id: string) => ls.engine.catalog.sandbox(id)!.id_base!;
  const mapLine = (base: number) => `0 ${base} ${ID_RANGE_SIZE}`;
  const squash = (s: string) => s.trim().split(/\s+/).join(' ');

  /** Who the sandbox's processes are inside, and how their namespace maps ids. */
  async function identity(sb: Sandbox, pid = 'self') {
    const r = await sb.commands.run(`id -u; id -g; cat /proc/${pid}/uid_map; cat /proc/${pid}/gid_map`);
    mustSucceed(r.exitCode, r.stderr);
    const [uid, gid, uidMap, gidMap] = r.stdout.trim().split('\n');
    return { uid, gid, uidMap: squash(uidMap!), gidMap: squash(gidMap!) };
  }
  function mustSucceed(code: number, stderr: string) {
    if (code !== 0) throw new Error(`command failed (${code}): ${stderr}`);
  }

  /** Host uid of a process, from /proc/PID/status ("Uid: real effective saved fs"). */
  function hostUid(pid: number): number {
    const line = fs
      .readFileSync(`/proc/${pid}/status`, 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Uid:'))!;
    return Number(line.split(/\s+/)[1]);
  }

  const upperPath = (sb: Sandbox, p: string) =>
    path.join(ls.engine.layers.upperDir(ls.engine.catalog.sandbox(sb.id)!.instance).upper, p);

  test.serial('root inside is root of a user namespace mapped onto the sandbox’s own host id range', async (t) => {
    const sb = await sandbox(t);
    const base = idBase(sb.id);
    t.true(base >= FIRST_ID_BASE && (base - FIRST_ID_BASE) % ID_RANGE_SIZE === 0, `range base ${base}`);
    t.deepEqual(await identity(sb), { uid: '0', gid: '0', uidMap: mapLine(base), gidMap: mapLine(base) });
    // Seen from the host, the sandbox's init is the unprivileged base id.
    t.is(hostUid(sb.info().pid!), base);
    // Its own cgroup namespace: the sandbox's cgroup is its root.
    const cg = await sb.commands.run('cat /proc/self/cgroup');
    t.true(
      cg.stdout
        .trim()
        .split('\n')
        .every((l) => l.endsWith(':/')),
      cg.stdout,
    );
  });

  test.serial(
    'files written inside are root-owned inside and owned by the mapped ids on the host; the image stays as it was',
    async (t) => {
      const sb = await sandbox(t);
      const base = idBase(sb.id);
      const image = ls.images.get('base').rootfs;
      const imagePasswd = fs.readFileSync(path.join(image, 'etc/passwd'), 'utf8');
      const r = await sb.commands.run(
        'echo made-inside > /workspace/new.txt && touch /workspace/user.txt && chown 1000:1001 /workspace/user.txt && echo extra >> /etc/passwd && stat -c "%u %g" /workspace/new.txt /etc/passwd /bin/busybox /workspace/user.txt',
      );
      t.is(r.exitCode, 0, r.stderr);
      t.deepEqual(r.stdout.trim().split('\n'), ['0 0', '0 0', '0 0', '1000 1001']);
      for (const [p, uid, gid] of [
        ['workspace/new.txt', base, base],
        ['etc/passwd', base, base],
        ['workspace/user.txt', base + 1000, base + 1001],
      ] as const) {
        const st = fs.statSync(upperPath(sb, p));
        t.deepEqual([st.uid, st.gid], [uid, gid], p);
      }
      t.is(fs.readFileSync(upperPath(sb, 'workspace/new.txt'), 'utf8'), 'made-inside\n');
      // The shared image layer is neither written nor chowned.
      const st = fs.statSync(path.join(image, 'etc/passwd'));
      t.deepEqual([st.uid, st.gid], [0, 0]);
      t.is(fs.readFileSync(path.join(image, 'etc/passwd'), 'utf8'), imagePasswd);
    },
  );

  test.serial('two sandboxes get disjoint ranges, a removed sandbox’s range is reused', async (t) => {
    const a = await sandbox(t);
    const b = await sandbox(t);
    const [ba, bb] = [idBase(a.id), idBase(b.id)];
    t.true(Math.abs(ba - bb) >= ID_RANGE_SIZE, `${ba} and ${bb} overlap`);
    t.is((await identity(b)).uidMap, mapLine(bb));
    // a's warm standby (another instance of a) lives in a's range, not b's.
    await a.checkpoint();
    await a.settled();
    const standbyPid = ls.engine.catalog.standby(a.id)!.pid!;
    t.truthy(standbyPid);
    t.is(squash(fs.readFileSync(`/proc/${standbyPid}/uid_map`, 'utf8')), mapLine(ba));
    await ls.remove(a.id);
    t.false(ls.engine.catalog.idBases().includes(ba));
    const c = await sandbox(t);
    t.is(idBase(c.id), Math.min(ba, ...ls.engine.catalog.idBases()));
  });

  test.serial(
    'files only a host id owns are not writable from inside; files the API writes are the sandbox root’s',
    async (t) => {
      const sb = await sandbox(t);
      // Written by host root through the sandbox root: owned by host uid 0,
      // which the sandbox's namespace does not map.
      const file = hostPath(ls, sb.id, '/workspace/host-owned.txt');
      fs.writeFileSync(file, 'host data\n', { mode: 0o644 });
      const r = await sb.commands.run(
        'stat -c %u /workspace/host-owned.txt; echo tampered >> /workspace/host-owned.txt',
      );
      t.not(r.exitCode, 0);
      t.regex(r.stderr, /Permission denied/);
      t.is(r.stdout.trim(), '65534'); // the overflow id: unmapped
      t.is(fs.readFileSync(file, 'utf8'), 'host data\n');
      // What the files API writes is the sandbox root's, as if made inside.
      await sb.files.write('/workspace/api/made-by-api.txt', 'api\n');
      const api = await sb.commands.run(
        'stat -c "%u %g" /workspace/api /workspace/api/made-by-api.txt && echo inside >> /workspace/api/made-by-api.txt',
      );
      t.is(api.exitCode, 0, api.stderr);
      t.is(api.stdout, '0 0\n0 0\n');
      t.is(fs.readFileSync(hostPath(ls, sb.id, '/workspace/api/made-by-api.txt'), 'utf8'), 'api\ninside\n');
      // /dev is a host folder, mounted read-only: root inside cannot add to it.
      const dev = await sb.commands.run('touch /dev/planted');
      t.not(dev.exitCode, 0);
      t.regex(dev.stderr, /Read-only file system/);
      t.false(
        fs.existsSync(path.join(ls.engine.paths.sandboxDev(ls.engine.catalog.sandbox(sb.id)!.instance), 'planted')),
      );
    },
  );

  const rollbackKeepsNamespace = test.macro({
    async exec(t, via: 'standby' | 'restore') {
      const sb = await sandbox(t);
      const base = idBase(sb.id);
      await sb.commands.run('echo kept > /root/marker');
      await startCounter(sb, ls);
      await waitCounter(ls, sb.id, (v) => v >= 5);
      const ckpt = await sb.checkpoint();
      const atCheckpoint = await counterInLayer(ls, ckpt);
      await sb.settled();
      if (via === 'restore') await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      const before = await waitCounter(ls, sb.id, (v) => v >= atCheckpoint + 20);
      await sb.commands.run('rm /root/marker');

      const report = await sb.rollback(ckpt.id);
      t.is(report.path, via);
      const after = await waitCounter(ls, sb.id, (v) => v > atCheckpoint);
      t.true(after < before, `restored from ${atCheckpoint}, not ${before} (got ${after})`);
      // The restored init (pid 1) is in a user namespace with the same map.
      t.deepEqual(await identity(sb, '1'), { uid: '0', gid: '0', uidMap: mapLine(base), gidMap: mapLine(base) });
      t.is(hostUid(report.pid), base);
      const marker = await sb.commands.run('cat /root/marker; stat -c %u /root/marker');
      t.is(marker.stdout, 'kept\n0\n');
      t.is(fs.statSync(upperPath(sb, 'root/marker')).uid, base);
    },
    title: (_, via) => `checkpoint and rollback (${via}) keep the user namespace, its map, the counter and files`,
  });
  test.serial(rollbackKeepsNamespace, 'standby');
  test.serial(rollbackKeepsNamespace, 'restore');

  test.serial('a fork gets a range of its own, with the checkpoint’s files and processes', async (t) => {
    const parent = await sandbox(t);
    const parentBase = idBase(parent.id);
    await parent.commands.run(
      'echo from-parent > /root/note && touch /workspace/u && chown 1000:1000 /workspace/u && cp /bin/busybox /workspace/suid && chmod 4755 /workspace/suid',
    );
    await startCounter(parent, ls);
    await waitCounter(ls, parent.id, (v) => v >= 5);
    const ckpt = await parent.checkpoint();
    const atCheckpoint = await counterInLayer(ls, ckpt);

    const [result] = await parent.fork(ckpt.id, { count: 1 });
    t.true(result!.ok, JSON.stringify(result));
    const fork = ls.get((result as { id: string }).id);
    t.teardown(() => ls.remove(fork.id).catch(() => undefined));
    const forkBase = idBase(fork.id);
    t.true(Math.abs(forkBase - parentBase) >= ID_RANGE_SIZE);
    t.deepEqual(await identity(fork, '1'), {
      uid: '0',
      gid: '0',
      uidMap: mapLine(forkBase),
      gidMap: mapLine(forkBase),
    });
    t.is(hostUid(result!.ok ? result.pid : 0), forkBase);
    // The counter carries on from the checkpoint in the fork.
    const v = await waitCounter(ls, fork.id, (x) => x > atCheckpoint);
    t.true(v > atCheckpoint);
    // Same files, same ids inside; the fork's range on the host; set-uid bit kept.
    const r = await fork.commands.run(
      'cat /root/note; stat -c "%u %g %a" /root/note /workspace/u /workspace/suid; echo fork-write > /root/note',
    );
    t.is(r.exitCode, 0, r.stderr);
    t.is(r.stdout, 'from-parent\n0 0 644\n1000 1000 644\n0 0 4755\n');
    t.is(fs.statSync(upperPath(fork, 'root/note')).uid, forkBase);
    t.is(fs.statSync(upperPath(fork, 'workspace/u')).uid, forkBase + 1000);
    // The parent and its checkpoint are untouched by the fork.
    t.is(fs.statSync(upperPath(parent, 'root/note')).uid, parentBase);
    t.is(fs.readFileSync(upperPath(parent, 'root/note'), 'utf8'), 'from-parent\n');
  });
});
