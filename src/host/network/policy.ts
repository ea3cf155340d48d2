/**
 * A sandbox's network policy: its mode and, for `egress`, the allow list
 * that sits on top of the deny list every egress sandbox has (the host, link-
 * local and metadata addresses, other sandboxes: see nftables.ts). Pure
 * parsing and matching, so it is unit-tested without root.
 *
 * An allow entry is one string:
 * - an IPv4 address or CIDR, optionally with a port or port range:
 *   `203.0.113.7`, `198.51.100.0/24:443`, `192.0.2.0/24:8000-8100`;
 * - a domain name, which allows it and every name below it, optionally with
 *   ports: `example.com`, `pypi.org:443`. Names are resolved by the
 *   sandbox's resolver (dns.ts), which answers only allowed names and adds
 *   the addresses it answers to the sandbox's allow set.
 * Ports apply to TCP and UDP. An egress sandbox with no allow entry may reach
 * any address outside the deny list, and its resolver answers every name.
 */
import { InvalidArgumentError } from '../../errors.js';

export type NetworkMode = 'none' | 'egress';
export const NETWORK_MODES: readonly NetworkMode[] = ['none', 'egress'];

/** Destination addresses (a CIDR) and ports a sandbox may open connections to. */
export interface CidrRule {
  cidr: string;
  ports: [number, number];
}

/** A name (and the names below it) the resolver answers, with the ports its addresses are allowed on. */
export interface DomainRule {
  domain: string;
  ports: [number, number];
}

/** What the catalog records for an egress sandbox (sandboxes.network, JSON). */
export interface NetworkPolicy {
  mode: 'egress';
  cidrs: CidrRule[];
  domains: DomainRule[];
  /** Egress bandwidth cap in Mbit/s (tc on the host side of the veth), or null for none. */
  bandwidthMbit: number | null;
}

export const MAX_ALLOW_ENTRIES = 256;
export const BANDWIDTH_LIMITS = { min: 1, max: 100_000 };
const ALL_PORTS: [number, number] = [0, 65535];

/** Parses dotted IPv4 into an unsigned 32-bit number; undefined when it is not one. */
export function ipv4ToInt(s: string): number | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(s);
  if (!m) return undefined;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255)) return undefined;
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0;
}

export function intToIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** A CIDR (or bare address, /32) in canonical form (host bits cleared); undefined when malformed. */
export function parseCidr(s: string): { base: number; bits: number; text: string } | undefined {
  const [addr, len, ...rest] = s.split('/');
  if (rest.length || addr === undefined) return undefined;
  const ip = ipv4ToInt(addr);
  const bits = len === undefined ? 32 : /^\d{1,2}$/.test(len) ? Number(len) : NaN;
  if (ip === undefined || !(bits >= 0 && bits <= 32)) return undefined;
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  const base = (ip & mask) >>> 0;
  return { base, bits, text: `${intToIpv4(base)}/${bits}` };
}

/** True when the address lies in the CIDR. */
export function cidrContains(cidr: string, ip: string): boolean {
  const c = parseCidr(cidr);
  const n = ipv4ToInt(ip);
  if (!c || n === undefined) return false;
  const mask = c.bits === 0 ? 0 : (0xffffffff << (32 - c.bits)) >>> 0;
  return (n & mask) >>> 0 === c.base;
}

const DOMAIN = /^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

function parsePorts(field: string, entry: string, s: string | undefined): [number, number] {
  if (s === undefined) return ALL_PORTS;
  const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(s);
  const lo = m ? Number(m[1]) : NaN;
  const hi = m ? Number(m[2] ?? m[1]) : NaN;
  if (!m || lo < 1 || hi > 65535 || lo > hi)
    throw new InvalidArgumentError(field, 'a port (1-65535) or a range LOW-HIGH after ":"', entry);
  return [lo, hi];
}

/** Parses one allow entry (see the module comment); INVALID_ARGUMENT names the entry. */
export function parseAllowEntry(entry: unknown, field = 'allowOut'): CidrRule | DomainRule {
  if (typeof entry !== 'string' || entry.length === 0 || entry.length > 300)
    throw new InvalidArgumentError(field, 'an address, CIDR or domain name, optionally with ":port"', entry);
  const colon = entry.lastIndexOf(':');
  const head = colon === -1 ? entry : entry.slice(0, colon);
  const ports = parsePorts(field, entry, colon === -1 ? undefined : entry.slice(colon + 1));
  if (/^[\d./]+$/.test(head)) {
    const c = parseCidr(head);
    if (!c) throw new InvalidArgumentError(field, 'an IPv4 address or CIDR such as 203.0.113.0/24', entry);
    return { cidr: c.text, ports };
  }
  const domain = head.toLowerCase().replace(/^\*\./, '').replace(/^\./, '').replace(/\.$/, '');
  if (!DOMAIN.test(domain) || !domain.includes('.') || /^[\d.]+$/.test(domain))
    throw new InvalidArgumentError(field, 'a domain name such as example.com (it allows its subdomains too)', entry);
  return { domain, ports };
}

/** What create accepts for the network (SDK, HTTP, CLI, MCP all pass these through). */
export interface NetworkOptions {
  /** "none" (default): loopback only. "egress": a routed address, outbound connections under the policy. */
  network?: NetworkMode | undefined;
  /** Allow entries for an egress sandbox (see policy.ts); none means "anywhere outside the deny list". */
  allowOut?: string[] | undefined;
  /** Egress bandwidth cap in Mbit/s. */
  bandwidthMbit?: number | undefined;
}

/** Validates the network options; returns the policy to record, or null for "none". */
export function validateNetworkOptions(opts: NetworkOptions, defaultMode: NetworkMode = 'none'): NetworkPolicy | null {
  const mode = opts.network ?? defaultMode;
  if (!NETWORK_MODES.includes(mode))
    throw new InvalidArgumentError('network', `one of ${NETWORK_MODES.map((m) => `"${m}"`).join(', ')}`, mode);
  if (mode === 'none') {
    if (opts.allowOut !== undefined && opts.allowOut.length > 0)
      throw new InvalidArgumentError('allowOut', 'no entries unless network is "egress"', opts.allowOut);
    if (opts.bandwidthMbit !== undefined)
      throw new InvalidArgumentError('bandwidthMbit', 'no value unless network is "egress"', opts.bandwidthMbit);
    return null;
  }
  const allow = opts.allowOut ?? [];
  if (!Array.isArray(allow) || allow.length > MAX_ALLOW_ENTRIES)
    throw new InvalidArgumentError('allowOut', `a list of at most ${MAX_ALLOW_ENTRIES} entries`, allow);
  const cidrs: CidrRule[] = [];
  const domains: DomainRule[] = [];
  allow.forEach((e, i) => {
    const r = parseAllowEntry(e, `allowOut[${i}]`);
    if ('cidr' in r) cidrs.push(r);
    else domains.push(r);
  });
  const bw = opts.bandwidthMbit;
  if (
    bw !== undefined &&
    (typeof bw !== 'number' || !Number.isInteger(bw) || bw < BANDWIDTH_LIMITS.min || bw > BANDWIDTH_LIMITS.max)
  )
    throw new InvalidArgumentError(
      'bandwidthMbit',
      `an integer number of Mbit/s from ${BANDWIDTH_LIMITS.min} to ${BANDWIDTH_LIMITS.max}`,
      bw,
    );
  // No entry at all: any destination outside the deny list, every name.
  if (allow.length === 0) cidrs.push({ cidr: '0.0.0.0/0', ports: ALL_PORTS });
  return { mode: 'egress', cidrs, domains, bandwidthMbit: bw ?? null };
}

/** True when the resolver may answer this name for the policy: it is, or is below, an allowed domain. */
export function nameAllowed(policy: NetworkPolicy, name: string): DomainRule | undefined {
  const n = name.toLowerCase().replace(/\.$/, '');
  if (policy.domains.length === 0 && policy.cidrs.some((c) => c.cidr === '0.0.0.0/0'))
    return { domain: '', ports: ALL_PORTS };
  return policy.domains.find((d) => n === d.domain || n.endsWith(`.${d.domain}`));
}

/** The policy a catalog row records (null for "none"). */
export function policyOf(network: string | null): NetworkPolicy | null {
  return network ? (JSON.parse(network) as NetworkPolicy) : null;
}

/** A sandbox's network as callers see it (SandboxInfo.network). */
export interface NetworkInfo {
  mode: NetworkMode;
  /** The sandbox's own address (eth0), or null for "none". */
  address: string | null;
  /** Its gateway and resolver, or null for "none". */
  gateway: string | null;
  /** The allow list, as entries like the ones create takes. */
  allowOut: string[];
  bandwidthMbit: number | null;
}

function entryText(target: string, ports: [number, number]): string {
  if (ports[0] === 0 && ports[1] === 65535) return target;
  return `${target}:${ports[0] === ports[1] ? ports[0] : `${ports[0]}-${ports[1]}`}`;
}

/** The info of a row: its policy, and its addresses from its slot in `range`. */
export function networkInfo(
  network: string | null | undefined,
  addresses: { address: string; gateway: string } | null,
): NetworkInfo {
  const p = policyOf(network ?? null);
  if (!p || !addresses) return { mode: 'none', address: null, gateway: null, allowOut: [], bandwidthMbit: null };
  return {
    mode: 'egress',
    address: addresses.address,
    gateway: addresses.gateway,
    allowOut: [
      ...p.cidrs.map((c) => entryText(c.cidr, c.ports)),
      ...p.domains.map((d) => entryText(d.domain, d.ports)),
    ],
    bandwidthMbit: p.bandwidthMbit,
  };
}
