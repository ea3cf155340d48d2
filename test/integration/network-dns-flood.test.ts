/**
 * Issue 23 (2, 3, gateway) on the real kernel: a sandbox floods its
 * resolver, against an upstream (on loopback, the test's own) that never
 * answers the flood's names or answers each with an address of its own.
 * The manager's descriptors, the resolver's queries in flight, the allow
 * set and the nft processes stay bounded, and another sandbox still gets
 * exact answers. The flood runs in the sandbox's network namespace
 * (nsenter into its init's), so its packets are the sandbox's own, at a
 * rate busybox's nslookup could not reach. TCP 53 to a gateway is refused,
 * and UDP 53 when its resolver is closed, even with a socket on the
 * gateway address.
 */
import fs from 'node:fs';
import net from 'node:net';
import dgram from 'node:dgram';
import path from 'node:path';
import { execFileSync, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import * as dnsPacket from 'dns-packet';
import { integration, openTestLockstep } from '../helpers/harness.js';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { parseAllowSet } from '../../src/host/network/nftables.js';
import { DNS_LIMITS } from '../../src/network/dns.js';
import { LEARNED_LIMITS } from '../../src/host/network/learned.js';

const RANGE = '10.234.0.0/24';
const OK_ADDRESS = '172.30.71.2';
const flooder = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/dns-flood.mjs');

let ls: Lockstep;
const teardowns: (() => Promise<void>)[] = [];
/** The fake upstream: what it received, by kind. */
const upstream = { slow: 0, many: 0, ok: 0 };
let upstreamSocket: dgram.Socket;

integration(test, () => {
  test.before(async () => {
    upstreamSocket = dgram.createSocket('udp4');
    let next = 0;
    upstreamSocket.on('message', (b, rinfo) => {
      let q: dnsPacket.DecodedPacket;
      try {
        q = dnsPacket.decode(b);
      } catch {
        return;
      }
      const name = q.questions?.[0]?.name ?? '';
      const reply = (data: string) =>
        upstreamSocket.send(
          dnsPacket.encode({
            id: q.id,
            type: 'response',
            flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE,
            questions: q.questions ?? [],
            answers: [{ type: 'A', name, ttl: 300, data }],
          }),
          rinfo.port,
          rinfo.address,
        );
      if (name.endsWith('.slow.test'))
        upstream.slow++; // never answered
      else if (name.endsWith('.many.test')) {
        upstream.many++;
        const n = next++;
        reply(`198.18.${(n >> 8) & 255}.${n & 255}`); // an address of its own for each name
      } else if (name === 'www.ok.test') {
        upstream.ok++;
        reply(OK_ADDRESS);
      }
    });
    await new Promise<void>((r) => upstreamSocket.bind(0, '127.0.0.1', r));
    const port = upstreamSocket.address().port;
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { open: { config: { networkRange: RANGE, dnsUpstream: `127.0.0.1:${port}` } } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
    upstreamSocket?.close();
  });

  function initPid(sb: Sandbox): number {
    const pid = ls.engine.catalog.sandbox(sb.info().id)?.init_pid;
    if (!pid) throw new Error(`sandbox ${sb.info().id} has no init`);
    return pid;
  }

  /** Runs the flooder in the sandbox's network namespace; bounded by a kill. */
  function flood(
    sb: Sandbox,
    count: number,
    suffix: string,
    perSecond: number,
  ): Promise<{ sent: number; rcodes: Record<string, number> }> {
    const gw = sb.info().network.gateway!;
    const child = spawn(
      '/usr/bin/nsenter',
      [
        `--net=/proc/${initPid(sb)}/ns/net`,
        process.execPath,
        flooder,
        gw,
        String(count),
        suffix,
        String(perSecond),
        '4000',
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    const limit = setTimeout(() => child.kill('SIGKILL'), 90_000);
    return new Promise((resolve, reject) => {
      child.once('close', (code) => {
        clearTimeout(limit);
        if (code !== 0) return reject(new Error(`flooder exited ${code}: ${err.trim()}`));
        resolve(JSON.parse(out) as { sent: number; rcodes: Record<string, number> });
      });
    });
  }

  /** nft processes that are children of this (the manager's) process, by pid. */
  async function nftChildren(): Promise<number[]> {
    const out: number[] = [];
    for (const d of await fs.promises.readdir('/proc')) {
      if (!/^\d+$/.test(d)) continue;
      const stat = await fs.promises.readFile(`/proc/${d}/stat`, 'utf8').catch(() => '');
      const m = /^\d+ \((.*)\) \S+ (\d+)/.exec(stat);
      if (m && m[1] === 'nft' && Number(m[2]) === process.pid) out.push(Number(d));
    }
    return out;
  }

  /** Samples the manager's descriptors, nft children and queries in flight until stopped. */
  function sampler(address: string) {
    const seen = { maxFds: 0, nftPids: new Set<number>(), maxNftAtOnce: 0, maxInFlight: 0, maxInFlightTotal: 0 };
    let stop = false;
    const done = (async () => {
      while (!stop) {
        seen.maxFds = Math.max(seen.maxFds, (await fs.promises.readdir('/proc/self/fd')).length);
        const nft = await nftChildren();
        for (const p of nft) seen.nftPids.add(p);
        seen.maxNftAtOnce = Math.max(seen.maxNftAtOnce, nft.length);
        seen.maxInFlight = Math.max(seen.maxInFlight, ls.engine.dns.inFlightCount(address));
        seen.maxInFlightTotal = Math.max(seen.maxInFlightTotal, ls.engine.dns.inFlightCount());
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    return {
      seen,
      stop: async () => {
        stop = true;
        await done;
        return seen;
      },
    };
  }

  function learnedOf(address: string): number {
    const json = execFileSync('/usr/sbin/nft', ['-j', 'list', 'set', 'inet', ls.engine.network.table, 'allow4']);
    return parseAllowSet(json.toString()).filter((e) => e.sandbox === address).length;
  }

  test.serial(
    'a flood against a silent upstream holds no descriptors per query, and another sandbox still resolves',
    async (t) => {
      const attacker = await ls.create({ network: 'egress', allowOut: ['slow.test:443'] });
      const other = await ls.create({ network: 'egress', allowOut: ['ok.test:443'] });
      t.teardown(() => attacker.kill().catch(() => undefined));
      t.teardown(() => other.kill().catch(() => undefined));
      const address = attacker.info().network.address!;
      const baseline = (await fs.promises.readdir('/proc/self/fd')).length;
      const spawnedBefore = ls.engine.network.session.spawned;
      const s = sampler(address);
      const attack = flood(attacker, 8000, 'slow.test', 4000);
      // While it floods: the other sandbox's name and command answer exactly.
      await new Promise((r) => setTimeout(r, 500));
      const started = Date.now();
      const look = await other.commands.run(['nslookup', 'www.ok.test', other.info().network.gateway!], {
        timeoutMs: 20_000,
      });
      const lookMs = Date.now() - started;
      const echo = await other.commands.run(['echo', 'still here'], { timeoutMs: 20_000 });
      const result = await attack;
      const seen = await s.stop();
      t.log(
        `flood: sent ${result.sent}, answers by rcode ${JSON.stringify(result.rcodes)}, upstream got ${upstream.slow}; ` +
          `fds ${baseline} -> max ${seen.maxFds}; in flight max ${seen.maxInFlight} (total ${seen.maxInFlightTotal}); ` +
          `nft at once max ${seen.maxNftAtOnce}, pids ${seen.nftPids.size}; other's lookup ${lookMs} ms`,
      );
      t.regex(look.stdout, new RegExp(`Address:? (1: )?${OK_ADDRESS.replace(/\./g, '\\.')}`));
      t.is(look.exitCode, 0);
      t.is(echo.stdout, 'still here\n');
      t.is(result.sent, 8000);
      t.true((result.rcodes['REFUSED'] ?? 0) > 0, 'the flood was refused past its bounds');
      t.true(seen.maxInFlight <= DNS_LIMITS.inFlightPerSandbox, `in flight ${seen.maxInFlight}`);
      t.true(upstream.slow < result.sent, `upstream got ${upstream.slow} of ${result.sent}`);
      // The pool's sockets, the flooder's pipes, the command's: a few dozen at most, never one per query.
      t.true(seen.maxFds - baseline <= 64, `descriptors grew from ${baseline} to ${seen.maxFds}`);
      t.true(ls.engine.network.session.spawned - spawnedBefore <= 1);
      t.true(seen.maxNftAtOnce <= 1, `${seen.maxNftAtOnce} nft at once`);
    },
  );

  test.serial(
    'a flood of names with an address each adds at most the cap of learned addresses, through one nft',
    async (t) => {
      const attacker = await ls.create({ network: 'egress', allowOut: ['many.test:443'] });
      t.teardown(() => attacker.kill().catch(() => undefined));
      const address = attacker.info().network.address!;
      const spawnedBefore = ls.engine.network.session.spawned;
      const s = sampler(address);
      const result = await flood(attacker, 3000, 'many.test', 600);
      const seen = await s.stop();
      const elements = learnedOf(address);
      t.log(
        `flood: sent ${result.sent}, answers by rcode ${JSON.stringify(result.rcodes)}, upstream answered ${upstream.many}; ` +
          `allow4 elements of the sandbox ${elements}; nft at once max ${seen.maxNftAtOnce}, pids ${seen.nftPids.size}, ` +
          `session processes started ${ls.engine.network.session.spawned - spawnedBefore}`,
      );
      t.true(upstream.many > LEARNED_LIMITS.maxPerSandbox, 'the flood got past the cap upstream');
      // Two elements (tcp, udp) per learned address.
      t.true(elements <= 2 * LEARNED_LIMITS.maxPerSandbox, `${elements} elements`);
      t.true(elements >= 2, 'learned addresses were added');
      t.true(ls.engine.network.session.spawned - spawnedBefore <= 1);
      t.true(seen.nftPids.size <= 1, `${seen.nftPids.size} nft processes seen`);
      t.true(seen.maxNftAtOnce <= 1);
      // An answer past the cap still answers (NOERROR); its address is simply not reachable.
      t.true((result.rcodes['NOERROR'] ?? 0) > LEARNED_LIMITS.maxPerSandbox);
    },
  );

  test.serial('TCP 53 to the gateway is refused; UDP 53 too once the resolver is closed', async (t) => {
    const sb = await ls.create({ network: 'egress', allowOut: ['ok.test:443'] });
    t.teardown(() => sb.kill().catch(() => undefined));
    const gw = sb.info().network.gateway!;
    // A TCP server on the gateway address itself: the firewall must not let the sandbox reach it.
    let accepted = 0;
    const server = net.createServer((c) => {
      accepted++;
      c.end('host\n');
    });
    await new Promise<void>((r, j) => server.once('error', j).listen(53, gw, r));
    t.teardown(() => new Promise<void>((r) => server.close(() => r())));
    const tcp = await sb.commands.run(['sh', '-c', `echo | nc -w 2 ${gw} 53`], { timeoutMs: 10_000 });
    t.is(tcp.stdout, '');
    t.not(tcp.exitCode, 0);
    t.is(accepted, 0);
    // The resolver answers while open.
    const served = await sb.commands.run(['nslookup', '-timeout=2', 'www.ok.test', gw], { timeoutMs: 15_000 });
    t.regex(served.stdout, /172\.30\.71\.2/);
    // Closed, with a stranger's socket bound on the gateway's port 53: nothing reaches it.
    await ls.engine.dns.close(sb.info().id);
    let received = 0;
    const stranger = dgram.createSocket('udp4');
    stranger.on('message', () => received++);
    await new Promise<void>((r, j) => {
      stranger.once('error', j);
      stranger.bind(53, gw, () => r());
    });
    const closed = await sb.commands.run(['nslookup', '-timeout=2', 'www.ok.test', gw], { timeoutMs: 15_000 });
    stranger.close();
    t.notRegex(closed.stdout, /172\.30\.71\.2/);
    t.not(closed.exitCode, 0);
    t.is(received, 0);
    // Open again: it answers again.
    await ls.engine.dns.open(ls.engine.catalog.sandbox(sb.info().id)!);
    const again = await sb.commands.run(['nslookup', '-timeout=2', 'www.ok.test', gw], { timeoutMs: 15_000 });
    t.regex(again.stdout, /172\.30\.71\.2/);
  });
});
