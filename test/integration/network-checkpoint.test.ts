/**
 * Checkpoint, rollback and fork of egress sandboxes (docs/network.md,
 * "Network"): listening sockets come back, connections to the outside are
 * left open by a checkpoint and reset by a rollback (which reports them; the outside peer sees the end), a restored
 * sandbox keeps its address and policy, a fork gets an address and policy
 * of its own, and the warm standby still serves the rollback.
 */
import net from 'node:net';
import test from 'ava';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { hostNetworkLeftovers, makeTestInternet, type TestInternet } from '../helpers/test-internet.js';
import type { Lockstep, Sandbox } from '../../src/index.js';

const RANGE = '10.232.0.0/24';
const WWW = '172.30.51.0';
let internet: TestInternet | undefined;
let ls: Lockstep;
const teardowns: (() => Promise<void>)[] = [];

/** GET through busybox nc; the body, or '' when the request did not get a 200. */
async function get(sb: Sandbox, host: string, path = '/'): Promise<string> {
  const r = await sb.commands.run(['sh', '-c', `printf 'GET ${path} HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${host} 8080`], {
    timeoutMs: 15_000,
  });
  return r.stdout.startsWith('HTTP/1.1 200 ') ? r.stdout.slice(r.stdout.indexOf('\r\n\r\n') + 4) : '';
}

/** Connects from the host (as root, which the policy lets through) and reads the greeting. */
function greet(address: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host: address, port, timeout: 3000 });
    let buf = '';
    s.on('data', (b) => (buf += b.toString()));
    s.on('end', () => resolve(buf));
    s.on('error', () => resolve(''));
    s.on('timeout', () => {
      s.destroy();
      resolve(buf);
    });
  });
}

integration(test, () => {
  test.before(async () => {
    internet = await makeTestInternet([WWW]);
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { open: { config: { networkRange: RANGE } } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
    await internet?.close();
  });

  test.serial(
    'rollback with an open outside connection: the listener comes back, address and policy hold (standby and CRIU paths)',
    async (t) => {
      const sb = await ls.create({ network: 'egress', allowOut: ['172.30.51.2:8080'] });
      t.teardown(() => sb.kill().catch(() => undefined));
      const { address } = sb.info().network;
      // A server inside that greets every connection.
      await sb.commands.run(['sh', '-c', 'while true; do echo greeting | nc -l -p 9000; done'], { background: true });
      await eventually(async () => (await greet(address!, 9000)) === 'greeting\n', 5000, 100);
      // A connection to the outside, held open.
      await sb.commands.run(
        ['sh', '-c', `(printf 'GET /hold HTTP/1.0\\r\\n\\r\\n'; sleep 600) | nc 172.30.51.2 8080 > /tmp/held`],
        {
          background: true,
        },
      );
      await eventually(() => internet!.hosts[0]!.output.length >= 1, 5000, 50);
      const ckpt = await sb.checkpoint();
      await sb.settled(); // the warm standby of the checkpoint
      const report = await sb.rollback(ckpt.id);
      t.is(report.path, 'standby');
      // Same address, listener back, policy the same.
      t.is(sb.info().network.address, address);
      t.is(await eventually(async () => greet(address!, 9000), 5000, 100), 'greeting\n');
      t.is(await get(sb, '172.30.51.2'), 'hello from 172.30.51.2\n');
      t.is(await get(sb, '172.30.51.1'), '');

      // The CRIU path: no standby for an older checkpoint once another was taken.
      const second = await sb.checkpoint();
      await sb.settled();
      t.truthy(second.id);
      const viaCriu = await sb.rollback(ckpt.id);
      t.is(viaCriu.path, 'restore');
      t.is(sb.info().network.address, address);
      t.is(await eventually(async () => greet(address!, 9000), 5000, 100), 'greeting\n');
      t.is(await get(sb, '172.30.51.2'), 'hello from 172.30.51.2\n');
    },
  );

  test.serial('a fork gets its own address and a copy of the policy; the parent keeps its own', async (t) => {
    const sb = await ls.create({ network: 'egress', allowOut: ['172.30.51.2:8080'] });
    t.teardown(() => sb.kill().catch(() => undefined));
    await sb.commands.run(['sh', '-c', 'while true; do echo greeting | nc -l -p 9000; done'], { background: true });
    const ckpt = await sb.checkpoint();
    const [res] = await sb.fork(ckpt.id);
    t.true(res!.ok, JSON.stringify(res));
    const child = ls.get((res as { id: string }).id);
    t.teardown(() => child.kill().catch(() => undefined));
    const parentAddr = sb.info().network.address!;
    const childAddr = child.info().network.address!;
    t.not(childAddr, parentAddr);
    t.deepEqual(child.info().network.allowOut, sb.info().network.allowOut);
    t.is(await get(child, '172.30.51.2'), 'hello from 172.30.51.2\n');
    t.is(await get(sb, '172.30.51.2'), 'hello from 172.30.51.2\n');
    t.is(await eventually(async () => greet(childAddr, 9000), 5000, 100), 'greeting\n');
    // The fork cannot reach its parent, nor the parent the fork.
    const r = await child.commands.run(['sh', '-c', `echo | nc -w 2 ${parentAddr} 9000`], { timeoutMs: 10_000 });
    t.is(r.stdout, '');
    await child.kill();
    await sb.kill();
    t.deepEqual(
      hostNetworkLeftovers(
        [ls.engine.network.ifPrefix, `lp${ls.engine.network.homeTag.slice(0, 3)}`],
        ls.engine.network.table,
      ),
      [],
    );
  });
});
