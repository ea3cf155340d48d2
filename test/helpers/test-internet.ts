/**
 * The network tests' own "internet": hosts in network namespaces the test
 * creates (`ip netns add`), each joined to the root namespace by a veth pair
 * of the test's own, with private addresses of the test's choosing, running
 * test/fixtures/net-host.mjs (HTTP on :8080, DNS on :53). Nothing leaves this
 * machine. `close()` removes every namespace, veth and process it made.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';

const fixture = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/net-host.mjs');

export interface TestHost {
  netns: string;
  /** The host's address (inside its namespace). */
  address: string;
  /** Lines the host printed (e.g. "closed ADDRESS" when a held connection closes). */
  output: string[];
}

export interface TestInternet {
  hosts: TestHost[];
  /** The root-namespace ends of the test's veths. */
  links: string[];
  close(): Promise<void>;
}

function ip(args: string[]): void {
  execFileSync('/usr/sbin/ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/**
 * Makes one host per /30 given (e.g. "172.30.1.0"): root side .1, host .2.
 * `zone` maps names to addresses for every host's DNS server.
 */
export async function makeTestInternet(subnets: string[], zone: Record<string, string> = {}): Promise<TestInternet> {
  const tag = randomBytes(3).toString('hex');
  const hosts: TestHost[] = [];
  const links: string[] = [];
  const procs: ChildProcess[] = [];
  const internet: TestInternet = {
    hosts,
    links,
    async close() {
      for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
      await Promise.all(procs.map((p) => (p.exitCode === null ? new Promise((r) => p.once('exit', r)) : undefined)));
      for (const h of hosts) {
        try {
          ip(['netns', 'del', h.netns]);
        } catch {
          /* gone */
        }
      }
      for (const l of links) {
        if (fs.existsSync(`/sys/class/net/${l}`))
          try {
            ip(['link', 'del', l]);
          } catch {
            /* gone with its namespace */
          }
      }
    },
  };
  try {
    for (const [i, subnet] of subnets.entries()) {
      const base = subnet.split('.').map(Number);
      const at = (n: number) => [...base.slice(0, 3), base[3]! + n].join('.');
      const netns = `lsxt-${tag}-${i}`;
      const link = `lsxt${tag}${i}`;
      ip(['netns', 'add', netns]);
      hosts.push({ netns, address: at(2), output: [] });
      links.push(link);
      ip(['link', 'add', link, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns]);
      ip(['addr', 'add', `${at(1)}/30`, 'dev', link]);
      ip(['link', 'set', link, 'up']);
      ip(['-n', netns, 'addr', 'add', `${at(2)}/30`, 'dev', 'eth0']);
      ip(['-n', netns, 'link', 'set', 'eth0', 'up']);
      ip(['-n', netns, 'link', 'set', 'lo', 'up']);
      // Replies go back the way they came: to the root side only.
      ip(['-n', netns, 'route', 'add', 'default', 'via', at(1)]);
      const child = spawn(
        '/usr/sbin/ip',
        ['netns', 'exec', netns, process.execPath, fixture, at(2), JSON.stringify(zone)],
        {
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      procs.push(child);
      const host = hosts[hosts.length - 1]!;
      await new Promise<void>((resolve, reject) => {
        let buf = '';
        child.stdout!.on('data', (b: Buffer) => {
          buf += b.toString();
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            host.output.push(line);
            if (line === 'ready') resolve();
          }
        });
        child.once('exit', (code) => reject(new Error(`test host ${netns} exited (${code})`)));
      });
    }
  } catch (e) {
    await internet.close();
    throw e;
  }
  return internet;
}

/** Network namespaces, veths (of the given prefixes) and nft tables left on the host, for the "nothing left" checks. */
export function hostNetworkLeftovers(prefixes: string[], table: string): string[] {
  const left: string[] = [];
  for (const n of fs.readdirSync('/sys/class/net')) if (prefixes.some((p) => n.startsWith(p))) left.push(`link:${n}`);
  try {
    for (const n of fs.readdirSync('/run/netns')) if (prefixes.some((p) => n.startsWith(p))) left.push(`netns:${n}`);
  } catch {
    /* no named namespaces */
  }
  try {
    const out = execFileSync('/usr/sbin/nft', ['-j', 'list', 'set', 'inet', table, 'allow4'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    }).toString();
    const doc = JSON.parse(out) as { nftables: { set?: { elem?: unknown[] } }[] };
    for (const i of doc.nftables) for (const e of i.set?.elem ?? []) left.push(`nft:${JSON.stringify(e)}`);
  } catch {
    /* no table */
  }
  return left;
}
