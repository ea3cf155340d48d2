/** The resolver's bounds without root: the gateway rules, learned-address dedup and cap, batching, the nft session's protocol, the query rate. */
import { PassThrough } from 'node:stream';
import { EventEmitter } from 'node:events';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import test from 'ava';
import { rulesetScript, resolverElementScript, type AllowElement } from '../../src/host/network/nftables.js';
import { ElementBatcher, LearnedAddresses } from '../../src/host/network/learned.js';
import { NftSession } from '../../src/host/network/nft-session.js';
import { TokenBuckets } from '../../src/token-bucket.js';

const el = (sandbox: string, ip: string, timeoutS: number, proto: 'tcp' | 'udp' = 'tcp'): AllowElement => ({
  sandbox,
  cidr: `${ip}/32`,
  proto,
  ports: [443, 443],
  timeoutS,
});

test('the gateway: UDP 53 only for a served sandbox on a socket bound to the gateway, no TCP 53, DNS under the upload cap', (t) => {
  const rs = rulesetScript({ table: 'lockstep_x', ifPrefix: 'lhabc', range: '10.9.0.0/24', deny: [] });
  const host = rs.split('\n').filter((l) => l.startsWith('add rule inet lockstep_x sandbox_to_host'));
  t.deepEqual(host, [
    'add rule inet lockstep_x sandbox_to_host jump antispoof',
    'add rule inet lockstep_x sandbox_to_host limit name ip saddr map @uplimit drop',
    'add rule inet lockstep_x sandbox_to_host ct state established,related accept',
    'add rule inet lockstep_x sandbox_to_host ip saddr @dns4 udp dport 53 fib daddr . iif type local socket wildcard 0 accept',
    'add rule inet lockstep_x sandbox_to_host reject with icmpx admin-prohibited',
  ]);
  t.notRegex(rs, /tcp dport 53/);
  t.regex(rs, /add set inet lockstep_x dns4 \{ type ipv4_addr; \}/);
  t.is(resolverElementScript('lockstep_x', '10.9.0.3', true), 'add element inet lockstep_x dns4 { 10.9.0.3 }\n');
  t.is(
    resolverElementScript('lockstep_x', '10.9.0.3', false),
    'add element inet lockstep_x dns4 { 10.9.0.3 }\ndelete element inet lockstep_x dns4 { 10.9.0.3 }\n',
  );
});

test('learned addresses: an equal or earlier expiry adds nothing, a later one re-adds, and a batch in flight is waited for', (t) => {
  const l = new LearnedAddresses(4);
  const first = l.admit([el('10.9.0.3', '1.2.3.4', 60), el('10.9.0.3', '1.2.3.4', 60, 'udp')], 0);
  t.is(first.add.length, 2);
  const batch = new Promise<void>(() => undefined);
  l.adding(first.add, batch);
  const again = l.admit([el('10.9.0.3', '1.2.3.4', 60)], 0);
  t.deepEqual(again.add, []);
  t.deepEqual(again.waitFor, [batch]);
  t.deepEqual(l.admit([el('10.9.0.3', '1.2.3.4', 30)], 1000).add, []);
  t.is(l.admit([el('10.9.0.3', '1.2.3.4', 120)], 1000).add.length, 1);
  // Another sandbox learns the same address on its own.
  t.is(l.admit([el('10.9.0.5', '1.2.3.4', 60)], 0).add.length, 1);
  t.is(l.count('10.9.0.3', 0), 1);
});

test('learned addresses: at most the cap per sandbox; expired ones make room; a failed batch is forgotten', async (t) => {
  const l = new LearnedAddresses(3);
  for (let i = 0; i < 3; i++) t.is(l.admit([el('s', `1.1.1.${i}`, 60)], 0).add.length, 1);
  const over = l.admit([el('s', '1.1.1.9', 60), el('s', '1.1.1.9', 60, 'udp')], 0);
  t.deepEqual(over.add, []);
  t.is(over.refused, 1);
  t.is(l.count('s', 0), 3);
  // A known address still renews past the cap.
  t.is(l.admit([el('s', '1.1.1.0', 120)], 0).add.length, 1);
  // After 60 s, three have expired (one was renewed): room for two.
  const later = l.admit([el('s', '1.1.1.7', 60), el('s', '1.1.1.8', 60), el('s', '1.1.1.9', 60)], 61_000);
  t.is(later.add.length, 2);
  t.is(later.refused, 1);
  const failing = l.admit([el('t', '2.2.2.2', 60)], 0);
  const batch = Promise.reject(new Error('nft said no'));
  l.adding(failing.add, batch);
  await batch.catch(() => undefined);
  await Promise.resolve();
  t.is(l.count('t', 0), 0);
  t.is(l.admit([el('t', '2.2.2.2', 60)], 0).add.length, 1);
});

test('batching: answers within the window are one apply; a failure rejects every answer of its batch', async (t) => {
  const applied: AllowElement[][] = [];
  let fail = false;
  const b = new ElementBatcher(
    async (elements) => {
      applied.push(elements);
      await new Promise((r) => setTimeout(r, 5));
      if (fail) throw new Error('nft refused');
    },
    5,
    10,
  );
  await Promise.all(Array.from({ length: 8 }, (_, i) => b.add([el('s', `1.1.1.${i}`, 60)])));
  t.is(applied.length, 1);
  t.is(applied[0]!.length, 8);
  // Past maxElements: split, never more than 10 in one.
  await Promise.all(Array.from({ length: 25 }, (_, i) => b.add([el('s', `1.1.2.${i}`, 60)])));
  t.deepEqual(
    applied.slice(1).map((a) => a.length),
    [10, 10, 5],
  );
  fail = true;
  const results = await Promise.allSettled([b.add([el('s', '9.9.9.1', 60)]), b.add([el('s', '9.9.9.2', 60)])]);
  t.deepEqual(
    results.map((r) => r.status),
    ['rejected', 'rejected'],
  );
  t.is(applied.length, 5);
});

/** A fake nft: answers each line with the marker (never for a line containing "hang"), an error first for "bad", and can die. */
function fakeNft(): { spawner: () => ChildProcessWithoutNullStreams; lines: string[]; kill: () => void } {
  const lines: string[] = [];
  let current: (EventEmitter & { stdout: PassThrough }) | undefined;
  const spawner = () => {
    const stdin = new PassThrough();
    const stdout = new PassThrough();
    const child = Object.assign(new EventEmitter(), {
      stdin,
      stdout,
      stderr: new PassThrough(),
      unref() {},
      kill() {
        setImmediate(() => child.emit('close', null, 'SIGKILL'));
        return true;
      },
    });
    let buf = '';
    stdin.on('data', (b: Buffer) => {
      buf += b.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) !== -1) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line === 'describe meta length') {
          if (!lines[lines.length - 1]?.includes('hang'))
            stdout.write('meta expression, datatype integer (integer), 32 bits\n');
        } else {
          lines.push(line);
          if (line.includes('bad')) stdout.write(`Error: syntax error\n${line}\n   ^^^\n`);
        }
      }
    });
    current = child;
    return child as unknown as ChildProcessWithoutNullStreams;
  };
  return { spawner, lines, kill: () => current?.emit('close', null, 'SIGKILL') };
}

test('the nft session: one process for many lines, errors go to their line, its death fails what is pending and it restarts', async (t) => {
  const nft = fakeNft();
  const s = new NftSession(nft.spawner);
  await Promise.all([s.apply('add element a\nadd element b\n'), s.apply('add element c')]);
  t.deepEqual(nft.lines, ['add element a; add element b', 'add element c']);
  const bad = s.apply('add bad element');
  const good = s.apply('add element d');
  await t.throwsAsync(bad, { code: 'NETWORK_SETUP_FAILED', message: /nft refused a change: Error: syntax error/ });
  await t.notThrowsAsync(good);
  t.is(s.spawned, 1);
  // Dies with a line pending: that line fails naming why; the next one starts a new nft.
  const pending = new Promise<void>((resolve, reject) => {
    s.apply('add element hang').then(resolve, reject);
  });
  nft.kill();
  await t.throwsAsync(pending, { code: 'NETWORK_SETUP_FAILED', message: /ended before applying a change: nft exited/ });
  await s.apply('add element f');
  t.is(s.spawned, 2);
  s.close();
  await t.throwsAsync(s.apply('add element g'), { code: 'NETWORK_SETUP_FAILED', message: /closed/ });
});

test('query rate: a burst, then the rate; keys are separate', (t) => {
  let now = 0;
  const r = new TokenBuckets({ ratePerS: 10, burst: 5 }, () => now);
  const burst = Array.from({ length: 8 }, () => r.take('a'));
  t.deepEqual(burst, [true, true, true, true, true, false, false, false]);
  t.true(r.take('b'));
  now = 250; // 2.5 tokens back
  t.deepEqual([r.take('a'), r.take('a'), r.take('a')], [true, true, false]);
});
