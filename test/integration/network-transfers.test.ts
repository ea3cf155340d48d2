/**
 * Egress sandboxes moving real bytes against the suite's own "internet"
 * (test-internet.ts): a download cut by a rollback leaves the restored files
 * byte-exact as at the checkpoint; the bandwidth cap holds (a download
 * through it takes at least size / rate); /etc/resolv.conf names the
 * sandbox's own resolver, and ordinary tools resolve through it.
 */
import { execFileSync } from 'node:child_process';
import test from 'ava';
import { eventually, integration, openTestLockstep, sleep } from '../helpers/harness.js';
import { hostNetworkLeftovers, makeTestInternet, type TestInternet } from '../helpers/test-internet.js';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { parseUploadLimits } from '../../src/host/network/nftables.js';

const RANGE = '10.233.0.0/24';
const WWW = '172.30.61.0';
const HOST = '172.30.61.2';
let internet: TestInternet | undefined;
let ls: Lockstep;
const teardowns: (() => Promise<void>)[] = [];

/** `sha256sum` of every file under /workspace, as "hash  path" lines sorted by path. */
async function workspaceDigest(sb: Sandbox): Promise<string> {
  const r = await sb.commands.run(['sh', '-c', 'find /workspace -type f | sort | xargs -r sha256sum']);
  return r.stdout;
}

async function sizeOf(sb: Sandbox, path: string): Promise<number> {
  const r = await sb.commands.run(['sh', '-c', `wc -c < ${path} 2>/dev/null || echo -1`]);
  return Number(r.stdout.trim());
}

/** The shell line that GETs /bytes/N from the test host into a file (busybox wget: the body only). */
const download = (n: number, to: string) => `wget -q -O ${to} http://${HOST}:8080/bytes/${n}`;

integration(test, () => {
  test.before(async () => {
    internet = await makeTestInternet([WWW], { 'www.transfers.test': HOST });
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { open: { config: { networkRange: RANGE, dnsUpstream: HOST } } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
    await internet?.close();
  });

  test.serial(
    'a download interrupted by a rollback leaves nothing half-written: the restored files are byte-exact as at the checkpoint',
    async (t) => {
      // 8 Mbit/s: the 8 MB download below takes ~8 s, long enough to be caught in the middle.
      const sb = await ls.create({ network: 'egress', allowOut: [`${HOST}:8080`], bandwidthMbit: 8 });
      t.teardown(() => sb.kill().catch(() => undefined));
      await sb.files.write('/workspace/notes.txt', 'written before the checkpoint\n');
      // A whole download before the checkpoint; the interrupted one rewrites the same file.
      const whole = await sb.commands.run(['sh', '-c', download(300_000, '/workspace/data.bin')], {
        timeoutMs: 60_000,
      });
      t.is(whole.exitCode, 0, whole.stderr);
      t.is(await sizeOf(sb, '/workspace/data.bin'), 300_000);
      const atCheckpoint = await workspaceDigest(sb);
      t.regex(atCheckpoint, /data\.bin/);
      const ckpt = await sb.checkpoint();
      await sb.settled();

      await sb.commands.run(['sh', '-c', download(8_000_000, '/workspace/data.bin')], { background: true });
      await sb.commands.run(['sh', '-c', download(8_000_000, '/workspace/second.bin')], { background: true });
      // Mid-download: both files partly written (the first truncated and being rewritten).
      await eventually(
        async () => {
          const a = await sizeOf(sb, '/workspace/data.bin');
          const b = await sizeOf(sb, '/workspace/second.bin');
          return a > 400_000 && a < 8_000_000 && b > 100_000 && b < 8_000_000;
        },
        30_000,
        100,
      );
      t.not(await workspaceDigest(sb), atCheckpoint);

      const report = await sb.rollback(ckpt.id);
      t.true(
        report.connectionsReset.some((c) => c.remote === `${HOST}:8080`),
        `the cut downloads are reported: ${JSON.stringify(report.connectionsReset)}`,
      );
      t.is(await workspaceDigest(sb), atCheckpoint);
      // And it stays so: nothing of the cut downloads goes on writing.
      await sleep(1500);
      t.is(await workspaceDigest(sb), atCheckpoint);
      t.is(await sizeOf(sb, '/workspace/second.bin'), -1);
      // The restored sandbox downloads again, whole.
      const again = await sb.commands.run(['sh', '-c', download(300_000, '/workspace/again.bin')], {
        timeoutMs: 60_000,
      });
      t.is(again.exitCode, 0);
      t.is(await sizeOf(sb, '/workspace/again.bin'), await sizeOf(sb, '/workspace/data.bin'));
    },
  );

  test.serial(
    'the bandwidth limit holds both ways: a download and an upload through it take at least size / rate',
    async (t) => {
      const mbit = 4;
      const bytes = 1_500_000;
      const sb = await ls.create({ network: 'egress', allowOut: [`${HOST}:8080`], bandwidthMbit: mbit });
      t.teardown(() => sb.kill().catch(() => undefined));
      const started = performance.now();
      const r = await sb.commands.run(['sh', '-c', `${download(bytes, '-')} | wc -c`], {
        timeoutMs: 120_000,
      });
      const elapsedS = (performance.now() - started) / 1000;
      const received = Number(r.stdout.trim());
      t.is(received, bytes);
      // size / rate, with a margin for the token bucket's burst (32 KiB) and rounding: a lower bound only.
      const floorS = ((bytes - 64 * 1024) * 8) / (mbit * 1e6);
      t.log(`${bytes} B at ${mbit} Mbit/s: ${elapsedS.toFixed(2)} s (at least ${floorS.toFixed(2)} s expected)`);
      t.true(elapsedS >= floorS, `took ${elapsedS.toFixed(2)} s, less than ${floorS.toFixed(2)} s`);
      // What it sends is capped too (an nftables limit object of its address): an upload to the test host.
      // The request as a file (busybox wget's --post-file sent no body here); nc gets the answer once the last byte arrived.
      await sb.commands.run([
        'sh',
        '-c',
        `printf 'POST /sink HTTP/1.0\\r\\nContent-Length: ${bytes}\\r\\n\\r\\n' > /workspace/up.req && head -c ${bytes} /dev/zero >> /workspace/up.req`,
      ]);
      const upStarted = performance.now();
      const up = await sb.commands.run(['sh', '-c', `nc ${HOST} 8080 < /workspace/up.req`], { timeoutMs: 120_000 });
      const upS = (performance.now() - upStarted) / 1000;
      t.is(up.stdout.trim().split('\n').pop(), String(bytes), up.stderr);
      // nftables' byte limit starts with a full bucket: one second at the rate plus the burst pass at once.
      const upFloorS = ((bytes - (mbit * 1e6) / 8 - 64 * 1024) * 8) / (mbit * 1e6);
      t.log(`${bytes} B uploaded at ${mbit} Mbit/s: ${upS.toFixed(2)} s (at least ${upFloorS.toFixed(2)} s expected)`);
      t.true(upS >= upFloorS, `upload took ${upS.toFixed(2)} s, less than ${upFloorS.toFixed(2)} s`);
      // Removing the sandbox removes its limit object.
      const address = sb.info().network.address!;
      const caps = () =>
        parseUploadLimits(
          execFileSync('/usr/sbin/nft', ['-j', 'list', 'map', 'inet', ls.engine.network.table, 'uplimit']).toString(),
        );
      t.true(caps().includes(address));
      await sb.kill();
      t.false(caps().includes(address));
    },
  );

  test.serial(
    "/etc/resolv.conf names the sandbox's own resolver, and a name resolves through it with ordinary tools; a fork's names its own",
    async (t) => {
      const sb = await ls.create({ network: 'egress', allowOut: ['transfers.test:8080'] });
      t.teardown(() => sb.kill().catch(() => undefined));
      const gw = sb.info().network.gateway!;
      const conf = await sb.commands.run(['cat', '/etc/resolv.conf']);
      t.regex(conf.stdout, new RegExp(`^nameserver ${gw.replace(/\./g, '\\.')}$`, 'm'));
      // No server named: nslookup reads /etc/resolv.conf.
      const looked = await sb.commands.run(['nslookup', 'www.transfers.test']);
      t.regex(looked.stdout, new RegExp(HOST.replace(/\./g, '\\.')));
      // And the answered address is then reachable by name's address.
      const got = await sb.commands.run(['sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${HOST} 8080`]);
      t.regex(got.stdout, /hello from 172\.30\.61\.2/);

      const ckpt = await sb.checkpoint();
      const [res] = await sb.fork(ckpt.id);
      t.true(res!.ok, JSON.stringify(res));
      const child = ls.get((res as { id: string }).id);
      t.teardown(() => child.kill().catch(() => undefined));
      const childGw = child.info().network.gateway!;
      t.not(childGw, gw);
      t.regex(
        (await child.commands.run(['cat', '/etc/resolv.conf'])).stdout,
        new RegExp(`^nameserver ${childGw}$`, 'm'),
      );
      t.regex((await child.commands.run(['nslookup', 'www.transfers.test'])).stdout, /172\.30\.61\.2/);
      await child.kill();
      await sb.kill();
      t.deepEqual(
        hostNetworkLeftovers(
          [ls.engine.network.ifPrefix, `lp${ls.engine.network.homeTag.slice(0, 3)}`],
          ls.engine.network.table,
        ),
        [],
      );
    },
  );
});
