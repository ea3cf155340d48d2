/**
 * Egress sandboxes on the real kernel, against the suite's own "internet"
 * (hosts in network namespaces this file makes; see test-internet.ts):
 * allowed hosts answer with exact bytes; a denied host, the manager's host
 * addresses and another sandbox are refused; the resolver answers allowed
 * names only; everything the tests made is gone afterwards.
 */
import fs from 'node:fs';
import net from 'node:net';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { hostNetworkLeftovers, makeTestInternet, type TestInternet } from '../helpers/test-internet.js';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { addTenant } from '../../src/tenants/tenants.js';

// Addresses of this file's own choosing: the sandbox range and two test hosts.
const RANGE = '10.231.0.0/24';
const ALLOWED = '172.30.41.0';
const DENIED = '172.30.42.0';

let internet: TestInternet | undefined;
let ls: Lockstep;
const teardowns: (() => Promise<void>)[] = [];

integration(test, () => {
  test.before(async () => {
    internet = await makeTestInternet([ALLOWED, DENIED], {
      'www.allowed.test': '172.30.41.2',
      'www.denied.test': '172.30.42.2',
    });
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { open: { config: { networkRange: RANGE, dnsUpstream: '172.30.41.2' } } },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
    await internet?.close();
  });

  /** GET over plain TCP with busybox nc (its wget needs NSS, which the static build lacks): the body, or exitCode != 0. */
  async function fetchIn(sb: Sandbox, url: string): Promise<{ exitCode: number; stdout: string }> {
    const m = /^http:\/\/([^:/]+):(\d+)(\/.*)$/.exec(url)!;
    const r = await sb.commands.run(
      ['sh', '-c', `printf 'GET ${m[3]} HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${m[1]} ${m[2]}`],
      { timeoutMs: 10_000 },
    );
    const body = r.stdout.includes('\r\n\r\n') ? r.stdout.slice(r.stdout.indexOf('\r\n\r\n') + 4) : '';
    return { exitCode: r.stdout.startsWith('HTTP/1.1 200 ') ? 0 : 1, stdout: body };
  }

  test.serial('an allowed host answers with its exact bytes; a denied one is refused', async (t) => {
    const sb = await ls.create({ network: 'egress', allowOut: ['172.30.41.2:8080', 'allowed.test:8080'] });
    t.teardown(() => sb.kill().catch(() => undefined));
    const ok = await fetchIn(sb, 'http://172.30.41.2:8080/');
    t.is(ok.stdout, 'hello from 172.30.41.2\n');
    t.is(ok.exitCode, 0);
    const denied = await fetchIn(sb, 'http://172.30.42.2:8080/');
    t.not(denied.exitCode, 0);
    t.is(denied.stdout, '');
    // A port the entry does not name: the host's own DNS server (so the resolver cannot be bypassed either).
    const otherPort = await sb.commands.run(['nslookup', '-timeout=2', 'www.allowed.test', '172.30.41.2']);
    t.notRegex(otherPort.stdout, /172\.30\.41\.2$/m);
    t.not(otherPort.exitCode, 0);
  });

  test.serial('the manager host and another sandbox are refused', async (t) => {
    const a = await ls.create({ network: 'egress' });
    const b = await ls.create({ network: 'egress' });
    t.teardown(() => a.kill().catch(() => undefined));
    t.teardown(() => b.kill().catch(() => undefined));
    // A server on the host, on every address: the sandbox must not reach it.
    let accepted = 0;
    const server = net.createServer((s) => {
      accepted++;
      s.end('host\n');
    });
    await new Promise<void>((r) => server.listen(0, '0.0.0.0', r));
    t.teardown(() => new Promise<void>((r) => server.close(() => r())));
    const port = (server.address() as net.AddressInfo).port;
    const infoA = a.info();
    const infoB = b.info();
    t.truthy(infoA.network?.address);
    for (const target of [infoA.network.gateway!, '172.30.41.1', infoB.network.gateway!]) {
      const r = await fetchIn(a, `http://${target}:${port}/`);
      t.not(r.exitCode, 0, `reached the host at ${target}`);
    }
    // b listens; a cannot connect to it.
    await b.commands.run(['sh', '-c', 'echo reached | nc -l -p 7000'], { background: true });
    // b reaches its own listener (so it is listening), a does not.
    const r = await a.commands.run(['sh', '-c', `echo | nc -w 2 ${infoB.network.address!} 7000`], {
      timeoutMs: 10_000,
    });
    t.is(r.stdout, '');
    t.not(r.exitCode, 0);
    t.is(accepted, 0);
    // The public internet is allowed with an empty list, the test host included.
    t.is((await fetchIn(a, 'http://172.30.42.2:8080/')).stdout, 'hello from 172.30.42.2\n');
  });

  test.serial('DNS answers allowed names only, and an answered address becomes reachable', async (t) => {
    const sb = await ls.create({ network: 'egress', allowOut: ['allowed.test:8080'] });
    t.teardown(() => sb.kill().catch(() => undefined));
    const gw = sb.info().network.gateway!;
    const yes = await sb.commands.run(['nslookup', 'www.allowed.test', gw]);
    t.regex(yes.stdout, /172\.30\.41\.2/);
    const no = await sb.commands.run(['nslookup', 'www.denied.test', gw]);
    t.notRegex(no.stdout, /172\.30\.42\.2/);
    t.not(no.exitCode, 0);
    t.is((await fetchIn(sb, 'http://172.30.41.2:8080/')).stdout, 'hello from 172.30.41.2\n');
    // Not resolved, not allowed.
    t.not((await fetchIn(sb, 'http://172.30.42.2:8080/')).exitCode, 0);
  });

  test.serial("a tenant's default mode applies, and its limit refuses egress before anything is made", async (t) => {
    const open = addTenant(ls.engine.catalog.db, `net-open-${process.pid}`, { network: 'egress' }).tenant;
    const closed = addTenant(ls.engine.catalog.db, `net-closed-${process.pid}`, { maxNetwork: 'none' }).tenant;
    const sb = await ls.create({ tenant: open.id });
    t.teardown(() => sb.kill().catch(() => undefined));
    t.is(sb.info().network.mode, 'egress');
    const before = ls.list().length;
    await t.throwsAsync(ls.create({ tenant: closed.id, network: 'egress' }), { code: 'NETWORK_NOT_ALLOWED' });
    t.is(ls.list().length, before);
    t.is((await ls.create({ tenant: closed.id })).info().network.mode, 'none');
    t.throws(() => addTenant(ls.engine.catalog.db, `net-bad-${process.pid}`, { network: 'wide' as never }), {
      code: 'INVALID_ARGUMENT',
    });
  });

  test.serial('nothing is left on the host after the sandboxes are removed', async (t) => {
    const sb = await ls.create({ network: 'egress', allowOut: ['172.30.41.0/30'] });
    const { host } = ls.engine.network.linkNames(sb.info().id);
    t.true(fs.existsSync(`/sys/class/net/${host}`));
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
