/**
 * Lockstep's own nftables table (Debian's `nft`, driven with script batches
 * on stdin: one `nft -f -` is one atomic transaction). One table per state
 * directory, `inet lockstep_<homeTag>`, holding:
 * - `deny4`: what no sandbox reaches whatever its allow list says:
 *   loopback, link-local (169.254.0.0/16, where cloud metadata lives),
 *   other metadata addresses, multicast and reserved space, the sandbox
 *   range itself (every other sandbox), and LOCKSTEP_NETWORK_DENY;
 * - `allow4`: one element per allowed (sandbox address, destination CIDR,
 *   protocol, port range); the resolver adds the addresses it answers,
 *   with a timeout;
 * - chains that, for packets entering from a sandbox's host-side veth, drop
 *   IPv6, drop spoofed sources (reverse-path lookup: a source address must
 *   route back out of the interface it came in on, and may not be one of
 *   the host's), refuse everything addressed to the host itself except
 *   UDP DNS to the sandbox's own gateway while a resolver serves it (see
 *   `dns4`), then let through only `allow4` after
 *   `deny4`; new connections into a sandbox are dropped (exposed ports are
 *   proxied by the manager from the host, whose output only root may send);
 *   sandbox traffic leaving for the outside is masqueraded;
 * - `dns4`: sandbox addresses whose resolver is open (dns.ts adds one when
 *   it binds the sandbox's gateway:53, removes it when it closes). UDP 53 to
 *   the gateway is accepted only for those, and only when the socket it
 *   reaches is bound to the gateway address itself (`socket wildcard 0`):
 *   a host resolver on all addresses is never reachable, nor one left
 *   bound after a manager died, and TCP 53 is refused always (the
 *   resolver speaks UDP only);
 * - `uplimit`: sandbox address → a named `limit` object (`up_<address>`),
 *   the cap on what a sandbox with `bandwidthMbit` sends, to the outside
 *   and to its gateway (DNS) alike (tc's ingress policer needs a
 *   classifier, which kernels without cls_* modules lack; what it receives
 *   is capped by tbf on the host side, a qdisc).
 * The ruleset text is pure (unit-tested); applying it is HostNetwork's job.
 */
import { parseCidr } from './policy.js';

/** Always denied, whatever the allow list: the addresses no sandbox has business with. */
export const ALWAYS_DENIED = [
  '0.0.0.0/8',
  '127.0.0.0/8',
  '169.254.0.0/16', // link-local: 169.254.169.254 is AWS/GCP/Azure/OpenStack metadata
  '100.100.100.200/32', // Alibaba Cloud metadata
  '168.63.129.16/32', // Azure wire server
  '192.0.0.0/24', // IETF protocol assignments (incl. Oracle Cloud's 192.0.0.192)
  '224.0.0.0/3', // multicast and reserved
] as const;

export interface RulesetInput {
  table: string;
  /** Interface-name prefix of this state directory's host-side veths (nft wildcard: prefix*). */
  ifPrefix: string;
  range: string;
  deny: readonly string[];
}

/**
 * The whole table as an idempotent script: objects are added (a no-op when
 * they exist), the chains and the deny set are flushed and filled again, and
 * `allow4` is left as it is (it holds the running sandboxes' policies).
 */
export function rulesetScript(r: RulesetInput): string {
  const t = `inet ${r.table}`;
  const ifs = `"${r.ifPrefix}*"`;
  const deny = [...ALWAYS_DENIED, r.range, ...r.deny].map((c) => parseCidr(c)!.text);
  return `add table ${t}
add set ${t} deny4 { type ipv4_addr; flags interval; auto-merge; }
add set ${t} allow4 { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval, timeout; }
add map ${t} uplimit { type ipv4_addr : limit; }
add set ${t} dns4 { type ipv4_addr; }
add chain ${t} forward { type filter hook forward priority filter - 5; policy accept; }
add chain ${t} input { type filter hook input priority filter - 5; policy accept; }
add chain ${t} output { type filter hook output priority filter - 5; policy accept; }
add chain ${t} postrouting { type nat hook postrouting priority srcnat - 5; policy accept; }
add chain ${t} from_sandbox
add chain ${t} to_sandbox
add chain ${t} sandbox_to_host
add chain ${t} antispoof
flush chain ${t} forward
flush chain ${t} input
flush chain ${t} output
flush chain ${t} postrouting
flush chain ${t} from_sandbox
flush chain ${t} to_sandbox
flush chain ${t} sandbox_to_host
flush chain ${t} antispoof
flush set ${t} deny4
add element ${t} deny4 { ${deny.join(', ')} }
add rule ${t} antispoof meta nfproto ipv6 drop
add rule ${t} antispoof fib saddr . iif oif missing drop
add rule ${t} antispoof fib saddr type local drop
add rule ${t} antispoof ip saddr != ${parseCidr(r.range)!.text} drop
add rule ${t} forward iifname ${ifs} jump from_sandbox
add rule ${t} forward oifname ${ifs} jump to_sandbox
add rule ${t} from_sandbox jump antispoof
add rule ${t} from_sandbox limit name ip saddr map @uplimit drop
add rule ${t} from_sandbox ct state established,related accept
add rule ${t} from_sandbox ip daddr @deny4 reject with icmpx admin-prohibited
add rule ${t} from_sandbox ip saddr . ip daddr . meta l4proto . th dport @allow4 accept
add rule ${t} from_sandbox reject with icmpx admin-prohibited
add rule ${t} to_sandbox ct state established,related accept
add rule ${t} to_sandbox drop
add rule ${t} input iifname ${ifs} jump sandbox_to_host
add rule ${t} sandbox_to_host jump antispoof
add rule ${t} sandbox_to_host limit name ip saddr map @uplimit drop
add rule ${t} sandbox_to_host ct state established,related accept
add rule ${t} sandbox_to_host ip saddr @dns4 udp dport 53 fib daddr . iif type local socket wildcard 0 accept
add rule ${t} sandbox_to_host reject with icmpx admin-prohibited
add rule ${t} output oifname ${ifs} meta skuid != 0 reject with icmpx admin-prohibited
add rule ${t} postrouting ip saddr ${parseCidr(r.range)!.text} oifname != ${ifs} masquerade
`;
}

/** One element of allow4. */
export interface AllowElement {
  sandbox: string;
  cidr: string;
  proto: 'tcp' | 'udp';
  ports: [number, number];
  /** Seconds; absent: permanent (the sandbox's own allow list). */
  timeoutS?: number | undefined;
}

function elementText(e: AllowElement, withTimeout: boolean): string {
  const ports = e.ports[0] === e.ports[1] ? `${e.ports[0]}` : `${e.ports[0]}-${e.ports[1]}`;
  const timeout = withTimeout && e.timeoutS ? ` timeout ${e.timeoutS}s` : '';
  return `${e.sandbox} . ${parseCidr(e.cidr)!.text} . ${e.proto} . ${ports}${timeout}`;
}

/** `add element` lines; the command carries every element so the batch stays one transaction. */
export function addElementsScript(table: string, elements: readonly AllowElement[]): string {
  if (elements.length === 0) return '';
  return `add element inet ${table} allow4 { ${elements.map((e) => elementText(e, true)).join(', ')} }\n`;
}

/**
 * Opens (or closes) UDP 53 on the gateway for a sandbox address. The close
 * adds before it deletes, in the same transaction, so it succeeds whether
 * or not the element was there (nft 1.0.6 has no `destroy`).
 */
export function resolverElementScript(table: string, address: string, open: boolean): string {
  const add = `add element inet ${table} dns4 { ${address} }`;
  return open ? `${add}\n` : `${add}\ndelete element inet ${table} dns4 { ${address} }\n`;
}

export function deleteElementsScript(table: string, elements: readonly AllowElement[]): string {
  if (elements.length === 0) return '';
  return `delete element inet ${table} allow4 { ${elements.map((e) => elementText(e, false)).join(', ')} }\n`;
}

/** Name of the limit object capping what the sandbox at `address` sends. */
export function uploadLimitName(address: string): string {
  return `up_${address.replace(/\./g, '_')}`;
}

/**
 * The upload cap of a sandbox: a limit object and its uplimit element, in
 * one batch. The bucket holds ~10 ms at the rate (at least 32 KiB).
 */
export function addUploadLimitScript(table: string, address: string, mbit: number): string {
  const kbytesPerS = Math.round((mbit * 1e6) / 8 / 1000);
  const burst = Math.max(32, Math.ceil(kbytesPerS / 100));
  const name = uploadLimitName(address);
  return (
    `add limit inet ${table} ${name} { rate over ${kbytesPerS} kbytes/second burst ${burst} kbytes }\n` +
    `add element inet ${table} uplimit { ${address} : "${name}" }\n`
  );
}

export function deleteUploadLimitsScript(table: string, addresses: readonly string[]): string {
  return addresses
    .map((a) => `delete element inet ${table} uplimit { ${a} }\ndelete limit inet ${table} ${uploadLimitName(a)}\n`)
    .join('');
}

/** Addresses in uplimit, from `nft -j list map`. */
export function parseUploadLimits(json: string): string[] {
  const doc = JSON.parse(json) as { nftables: { map?: { elem?: unknown[] } }[] };
  const out: string[] = [];
  for (const item of doc.nftables)
    for (const e of item.map?.elem ?? []) if (Array.isArray(e) && typeof e[0] === 'string') out.push(e[0]);
  return out;
}

type NftValue = string | number | { prefix: { addr: string; len: number } } | { range: [number, number] };

/** Elements of allow4 as `nft -j list set` prints them. */
export function parseAllowSet(json: string): AllowElement[] {
  const doc = JSON.parse(json) as { nftables: { set?: { elem?: unknown[] } }[] };
  const out: AllowElement[] = [];
  for (const item of doc.nftables) {
    for (const raw of item.set?.elem ?? []) {
      const el = raw as { concat?: NftValue[]; elem?: { val: { concat: NftValue[] } } };
      const concat = el.concat ?? el.elem?.val.concat;
      if (!concat || concat.length !== 4) continue;
      const [sandbox, dest, proto, port] = concat;
      const cidr =
        typeof dest === 'string'
          ? `${dest}/32`
          : typeof dest === 'object' && 'prefix' in dest
            ? `${dest.prefix.addr}/${dest.prefix.len}`
            : undefined;
      const ports: [number, number] | undefined =
        typeof port === 'number' ? [port, port] : typeof port === 'object' && 'range' in port ? port.range : undefined;
      if (typeof sandbox !== 'string' || !cidr || (proto !== 'tcp' && proto !== 'udp') || !ports) continue;
      out.push({ sandbox, cidr, proto, ports });
    }
  }
  return out;
}
