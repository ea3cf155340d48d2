/**
 * The host side of egress sandboxes: Lockstep's nftables table, one veth pair
 * per sandbox instance (host side in the root namespace, sandbox side moved
 * into the sandbox's network namespace as eth0), the /31 routed between them,
 * the policy's elements in the allow set, and the optional bandwidth cap.
 * Everything is done with Debian's tools (`ip -batch -`, `nft -f -`,
 * `tc -batch -`) except what has to happen at CRIU's setup-namespaces
 * notification, which the addon does (native/addon/netns.cc).
 *
 * Names carry what they belong to, for the reaper: the host side of an
 * instance's pair is `lh` + 3 hex of the state directory's tag + 10 hex of
 * a hash of the instance key (IFNAMSIZ allows 15), the not-yet-moved sandbox
 * side `lp` + the same; the interface alias holds the instance key.
 * Nothing here runs for a sandbox without a network: `none` costs nothing.
 */
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { HostError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { slotAddresses, type SlotAddresses } from './addresses.js';
import {
  addElementsScript,
  addUploadLimitScript,
  deleteElementsScript,
  deleteUploadLimitsScript,
  parseAllowSet,
  parseUploadLimits,
  resolverElementScript,
  rulesetScript,
  type AllowElement,
} from './nftables.js';
import { ElementBatcher } from './learned.js';
import { NftSession, TOOLS } from './nft-session.js';
import type { NetworkPolicy } from './policy.js';

export interface NetworkSettings {
  /** Private IPv4 range cut into one /31 per egress sandbox. */
  range: string;
  /** CIDRs no sandbox may reach, beyond the built-in deny list. */
  deny: readonly string[];
}

/**
 * The host tools, by absolute path: a bare `nft` on PATH can be another
 * program (npm scripts put node_modules/.bin first, where @vercel/nft
 * installs an `nft` of its own).
 */

/** Runs a host tool with a script on stdin; resolves with its stdout. */
export type ToolRunner = (cmd: string, args: string[], input: string) => Promise<string>;

export const runTool: ToolRunner = (cmd, args, input) =>
  new Promise((resolve, reject) => {
    const child = spawn(TOOLS[cmd as keyof typeof TOOLS] ?? cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(
        new HostError(
          'NETWORK_SETUP_FAILED',
          `Cannot run ${cmd}: ${e.message} (is ${cmd === 'nft' ? 'nftables' : 'iproute2'} installed?)`,
          {
            cause: e,
          },
        ),
      );
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (code === 0) return resolve(Buffer.concat(out).toString());
      const detail = Buffer.concat(err).toString().trim().split('\n').slice(-5).join('; ');
      reject(
        new HostError('NETWORK_SETUP_FAILED', `${cmd} ${args.join(' ')} failed (exit ${code}): ${detail}`, {
          details: { command: cmd, stderr: detail, script: input.slice(0, 2000) },
        }),
      );
    });
    child.stdin.on('error', () => undefined); // a tool that reads no stdin closes it: its exit code tells
    child.stdin.end(input);
  });

/** What the addon needs at CRIU's setup-namespaces notification to give a restored tree its eth0. */
export interface RestoreNetwork {
  /** The sandbox side of the pair, still in the root namespace. */
  peer: string;
  address: string;
  gateway: string;
  prefixLength: number;
}

export class HostNetwork {
  private ready: Promise<void> | undefined;
  readonly table: string;
  readonly ifPrefix: string;
  /** The one nft the resolver's changes go through (started on first use). */
  readonly session: NftSession;
  private readonly learnedBatches: ElementBatcher;

  constructor(
    readonly settings: NetworkSettings,
    readonly homeTag: string,
    private readonly log: Logger,
    /** Written when the table is first made: the reaper and destroyAll run nft only when it exists. */
    readonly markerFile: string,
    private readonly run: ToolRunner = runTool,
    session?: NftSession,
  ) {
    this.table = `lockstep_${homeTag}`;
    this.ifPrefix = `lh${homeTag.slice(0, 3)}`;
    this.session = session ?? new NftSession();
    this.learnedBatches = new ElementBatcher((elements) => this.session.apply(addElementsScript(this.table, elements)));
  }

  /** Ends the long-lived nft (manager close); changes still pending fail. */
  close(): void {
    this.session.close();
  }

  /** Host and sandbox side names of an instance's veth pair. */
  linkNames(instance: string): { host: string; peer: string } {
    const h = createHash('sha256').update(`${this.homeTag}/${instance}`).digest('hex').slice(0, 10);
    return { host: `${this.ifPrefix}${h}`, peer: `lp${this.homeTag.slice(0, 3)}${h}` };
  }

  addresses(slot: number): SlotAddresses {
    return slotAddresses(this.settings.range, slot);
  }

  /**
   * Forwarding on, and the table in place (idempotent; once per manager, on
   * the first egress sandbox). Running sandboxes' allow elements survive it.
   */
  ensureHost(): Promise<void> {
    this.ready ??= (async () => {
      fs.writeFileSync(this.markerFile, '');
      fs.writeFileSync('/proc/sys/net/ipv4/ip_forward', '1');
      await this.run(
        'nft',
        ['-f', '-'],
        rulesetScript({
          table: this.table,
          ifPrefix: this.ifPrefix,
          range: this.settings.range,
          deny: this.settings.deny,
        }),
      );
    })().catch((e) => {
      this.ready = undefined;
      throw e;
    });
    return this.ready;
  }

  /**
   * Makes an instance's veth pair in the root namespace: the host side gets
   * the gateway address (and is brought up unless `up` is false: a warm
   * standby's stays down until its swap), the sandbox side keeps its
   * temporary name until it is moved. With `pid`, the sandbox side is moved
   * into that process's network namespace at once (create); otherwise the
   * addon moves it at CRIU's notification (restore).
   */
  async addLinks(
    instance: string,
    slot: number,
    policy: NetworkPolicy,
    opts: { up: boolean; pid?: number },
  ): Promise<RestoreNetwork> {
    await this.ensureHost();
    const { host, peer } = this.linkNames(instance);
    const a = this.addresses(slot);
    await this.removeLinks(instance);
    const script = [
      `link add ${host} type veth peer name ${peer}`,
      `link set dev ${host} alias ${instance}`,
      `link set dev ${host} addrgenmode none`,
      `link set dev ${peer} addrgenmode none`,
      `addr add ${a.gateway}/${a.prefixLength} dev ${host}`,
      ...(opts.up ? [`link set dev ${host} up`] : []),
    ];
    try {
      await this.run('ip', ['-batch', '-'], script.join('\n') + '\n');
      if (policy.bandwidthMbit !== null) await this.limitBandwidth(host, policy.bandwidthMbit);
    } catch (e) {
      await this.removeLinks(instance).catch(() => undefined);
      throw e;
    }
    return { peer, address: a.address, gateway: a.gateway, prefixLength: a.prefixLength };
  }

  /**
   * tbf on the host side caps what reaches the sandbox (downloads); what it
   * sends is capped in nftables (addPolicy): tc's ingress policer needs a
   * classifier (cls_matchall, cls_u32), which kernels built without those
   * modules lack ("TC classifier not found").
   */
  private async limitBandwidth(host: string, mbit: number): Promise<void> {
    const burst = Math.max(32, Math.ceil((mbit * 1000) / 8 / 100)); // KiB: ~10 ms at the rate, at least 32 KiB
    await this.run(
      'tc',
      ['-batch', '-'],
      `qdisc add dev ${host} root tbf rate ${mbit}mbit burst ${burst}kb latency 50ms\n`,
    );
  }

  /** Deletes an instance's pair if it exists (deleting either side deletes both); cheap when it does not. */
  async removeLinks(instance: string): Promise<void> {
    const { host, peer } = this.linkNames(instance);
    for (const name of [host, peer]) {
      if (!fs.existsSync(`/sys/class/net/${name}`)) continue;
      await this.run('ip', ['-batch', '-'], `link del dev ${name}\n`).catch((e) => {
        if (fs.existsSync(`/sys/class/net/${name}`)) throw e; // gone meanwhile (its namespace died): fine
      });
    }
  }

  /** The policy's own (permanent) allow elements for a sandbox address. */
  policyElements(slot: number, policy: NetworkPolicy): AllowElement[] {
    const sandbox = this.addresses(slot).address;
    return policy.cidrs.flatMap((c) =>
      (['tcp', 'udp'] as const).map((proto) => ({ sandbox, cidr: c.cidr, proto, ports: c.ports })),
    );
  }

  /** Adds the sandbox's allow elements (create, fork). */
  async addPolicy(slot: number, policy: NetworkPolicy): Promise<void> {
    await this.ensureHost();
    const address = this.addresses(slot).address;
    const script =
      addElementsScript(this.table, this.policyElements(slot, policy)) +
      (policy.bandwidthMbit !== null ? addUploadLimitScript(this.table, address, policy.bandwidthMbit) : '');
    if (script) await this.run('nft', ['-f', '-'], script);
  }

  /** Addresses that have an upload cap. */
  private async uploadLimited(): Promise<string[]> {
    const out = await this.run('nft', ['-j', 'list', 'map', 'inet', this.table, 'uplimit'], '');
    return parseUploadLimits(out);
  }

  /**
   * Adds elements the resolver learned (with their timeouts): gathered with
   * the other answers of the same few ms into one transaction of the
   * long-lived nft. Resolves when they are in.
   */
  addLearned(elements: readonly AllowElement[]): Promise<void> {
    return this.learnedBatches.add(elements);
  }

  /** Opens or closes UDP 53 on the gateway of the sandbox at `address` (its resolver bound or closed). */
  async setResolver(address: string, open: boolean): Promise<void> {
    await this.ensureHost();
    await this.session.apply(resolverElementScript(this.table, address, open));
  }

  /** Every allow element of the table. */
  async listAllow(): Promise<AllowElement[]> {
    const out = await this.run('nft', ['-j', 'list', 'set', 'inet', this.table, 'allow4'], '');
    return parseAllowSet(out);
  }

  /** Removes every allow element of the given sandbox addresses (remove, failed create, the reaper). */
  async removePolicies(addresses: ReadonlySet<string>): Promise<number> {
    if (addresses.size === 0 || !(await this.tableExists())) return 0;
    await this.ensureHost(); // a table an older manager made may lack dns4
    const mine = (await this.listAllow()).filter((e) => addresses.has(e.sandbox));
    const capped = (await this.uploadLimited().catch(() => [] as string[])).filter((a) => addresses.has(a));
    const script =
      deleteElementsScript(this.table, mine) +
      deleteUploadLimitsScript(this.table, capped) +
      [...addresses].map((a) => resolverElementScript(this.table, a, false)).join('');
    await this.run('nft', ['-f', '-'], script);
    return mine.length;
  }

  /** Deletes this state directory's table (destroyAll with its files). */
  async removeTable(): Promise<void> {
    if (await this.tableExists()) await this.run('nft', ['delete', 'table', 'inet', this.table], '');
    this.ready = undefined;
  }

  async tableExists(): Promise<boolean> {
    try {
      await this.run('nft', ['list', 'table', 'inet', this.table], '');
      return true;
    } catch {
      return false;
    }
  }

  /** Host-side veths of this state directory (name and alias = instance key), from sysfs. */
  listLinks(): { name: string; instance: string | null }[] {
    let names: string[] = [];
    try {
      names = fs.readdirSync('/sys/class/net');
    } catch {
      return [];
    }
    const lp = `lp${this.homeTag.slice(0, 3)}`;
    return names
      .filter((n) => n.startsWith(this.ifPrefix) || n.startsWith(lp))
      .map((name) => {
        let alias: string | null = null;
        try {
          alias = fs.readFileSync(`/sys/class/net/${name}/ifalias`, 'utf8').trim() || null;
        } catch {
          /* gone */
        }
        return { name, instance: alias };
      });
  }

  /**
   * What a crashed manager may have left: pairs of instances the catalog
   * does not know (a restore that failed before its move, a create cut
   * short) and allow elements of addresses no sandbox holds. Returns what
   * was removed.
   */
  async reap(knownInstances: ReadonlySet<string>, knownAddresses: ReadonlySet<string>): Promise<string[]> {
    const removed: string[] = [];
    for (const link of this.listLinks()) {
      const known = link.instance !== null && knownInstances.has(link.instance) && this.linkNames(link.instance);
      if (known && (known.host === link.name || known.peer === link.name)) continue;
      await this.run('ip', ['-batch', '-'], `link del dev ${link.name}\n`).catch(() => undefined);
      removed.push(`veth:${link.name}`);
    }
    if (await this.tableExists()) {
      const stale = (await this.listAllow()).filter((e) => !knownAddresses.has(e.sandbox));
      const staleCaps = await this.uploadLimited()
        .then((all) => all.filter((a) => !knownAddresses.has(a)))
        .catch(() => [] as string[]); // a table made before uplimit existed
      const script = deleteElementsScript(this.table, stale) + deleteUploadLimitsScript(this.table, staleCaps);
      if (script) await this.run('nft', ['-f', '-'], script).catch((err) => this.log.warn({ err }, 'nft reap'));
      for (const a of new Set(stale.map((e) => e.sandbox))) removed.push(`nft:${a}`);
    }
    return removed;
  }
}
