/**
 * The resolver of egress sandboxes. One UDP socket per sandbox, bound to
 * port 53 of its gateway (the host side of its veth; nftables lets a sandbox
 * reach only its own gateway, and only on port 53). A query for a name the
 * policy allows (policy.ts, `nameAllowed`) is forwarded to the configured
 * upstream; the IPv4 addresses of the answer are added to the sandbox's
 * allow set, with the answer's TTL as timeout (at least 60 s, at most
 * 1 hour), before the answer is sent back: a connection the sandbox opens
 * to an address it was just told about is never refused. Any other name
 * gets NXDOMAIN; AAAA gets an empty answer (sandboxes have no IPv6).
 * Messages are parsed and written with `dns-packet` (docs/ARCHITECTURE.md,
 * "Dependencies and why"); nothing here interprets DNS by hand.
 *
 * It runs inside the manager, so names resolve while a manager
 * (`lockstep serve`, or a program holding a Lockstep open) has the state
 * directory open; another manager of the same directory finds the port
 * taken and leaves it to the first.
 */
import dgram from 'node:dgram';
import fs from 'node:fs';
import * as dnsPacket from 'dns-packet';
import type { SandboxRow } from '../catalog/catalog.js';
import type { Logger } from '../log.js';
import type { HostNetwork } from './host-network.js';
import type { AllowElement } from './nftables.js';
import { nameAllowed, policyOf, type NetworkPolicy } from './policy.js';

const UPSTREAM_TIMEOUT_MS = 3000;
const MIN_TTL_S = 60;
const MAX_TTL_S = 3600;

/** The first IPv4 nameserver of resolv.conf (the host's own resolver), or undefined. */
export function systemUpstream(file = '/etc/resolv.conf'): string | undefined {
  try {
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
      const m = /^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/.exec(line);
      if (m) return m[1];
    }
  } catch {
    /* no resolv.conf */
  }
  return undefined;
}

interface Listener {
  socket: dgram.Socket;
  policy: NetworkPolicy;
  address: string;
}

export class SandboxResolver {
  private readonly listeners = new Map<string, Listener>();

  constructor(
    private readonly network: HostNetwork,
    private readonly upstream: () => string | undefined,
    private readonly log: Logger,
  ) {}

  /** Starts answering for an egress sandbox (idempotent; a no-op without a network). */
  open(row: Pick<SandboxRow, 'id' | 'network' | 'net_slot'>): void {
    const policy = policyOf(row.network ?? null);
    if (!policy || row.net_slot == null || this.listeners.has(row.id)) return;
    const { gateway, address } = this.network.addresses(row.net_slot);
    const socket = dgram.createSocket({ type: 'udp4', reuseAddr: false });
    const listener: Listener = { socket, policy, address };
    this.listeners.set(row.id, listener);
    socket.on('error', (err) => {
      this.log.debug({ err, sandboxId: row.id }, 'sandbox resolver not listening');
      if (this.listeners.get(row.id) === listener) this.listeners.delete(row.id);
      socket.close();
    });
    socket.on('message', (msg, rinfo) => {
      if (rinfo.address !== address) return;
      void this.answer(listener, msg, rinfo.port).catch((err) =>
        this.log.warn({ err, sandboxId: row.id }, 'sandbox resolver failed to answer'),
      );
    });
    socket.bind(53, gateway);
    socket.unref();
  }

  close(sandboxId: string): void {
    const l = this.listeners.get(sandboxId);
    if (!l) return;
    this.listeners.delete(sandboxId);
    try {
      l.socket.close();
    } catch {
      /* already closed */
    }
  }

  closeAll(): void {
    for (const id of [...this.listeners.keys()]) this.close(id);
  }

  private reply(l: Listener, port: number, packet: dnsPacket.Packet): void {
    l.socket.send(dnsPacket.encode(packet), port, l.address);
  }

  private async answer(l: Listener, msg: Buffer, port: number): Promise<void> {
    let query: dnsPacket.DecodedPacket;
    try {
      query = dnsPacket.decode(msg);
    } catch {
      return; // not DNS: no answer
    }
    const q = query.questions?.[0];
    const base = { id: query.id, type: 'response' as const, questions: query.questions ?? [] };
    const flags = dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE;
    const rule = q ? nameAllowed(l.policy, q.name) : undefined;
    if (!q || !rule) return this.reply(l, port, { ...base, flags: flags | 3 /* NXDOMAIN */, answers: [] });
    if (q.type === 'AAAA') return this.reply(l, port, { ...base, flags, answers: [] });
    const upstream = this.upstream();
    if (!upstream) return this.reply(l, port, { ...base, flags: flags | 2 /* SERVFAIL */, answers: [] });
    const answer = await forward(msg, upstream);
    if (!answer) return this.reply(l, port, { ...base, flags: flags | 2, answers: [] });
    let decoded: dnsPacket.DecodedPacket;
    try {
      decoded = dnsPacket.decode(answer);
    } catch {
      return this.reply(l, port, { ...base, flags: flags | 2, answers: [] });
    }
    const open = l.policy.cidrs.some((c) => c.cidr === '0.0.0.0/0' && c.ports[0] === 0 && c.ports[1] === 65535);
    const learned: AllowElement[] = [];
    for (const a of decoded.answers ?? []) {
      if (a.type !== 'A' || typeof a.data !== 'string') continue;
      if (open) continue; // every address outside the deny set is allowed already
      const timeoutS = Math.min(MAX_TTL_S, Math.max(MIN_TTL_S, a.ttl ?? MIN_TTL_S));
      for (const proto of ['tcp', 'udp'] as const)
        learned.push({ sandbox: l.address, cidr: `${a.data}/32`, proto, ports: rule.ports, timeoutS });
    }
    // Before the answer: the sandbox's first connection must find its element.
    if (learned.length) await this.network.addLearned(learned);
    l.socket.send(answer, port, l.address);
  }
}

/** One query to the upstream over UDP; undefined on timeout or error. */
function forward(msg: Buffer, upstream: string): Promise<Buffer | undefined> {
  const [host, port] = upstream.split(':');
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    const done = (b: Buffer | undefined) => {
      clearTimeout(timer);
      s.close();
      resolve(b);
    };
    const timer = setTimeout(() => done(undefined), UPSTREAM_TIMEOUT_MS);
    s.on('error', () => done(undefined));
    // Only the answer to this query (same id) counts.
    s.on('message', (b) => {
      if (b.length >= 2 && b.readUInt16BE(0) === msg.readUInt16BE(0)) done(b);
    });
    s.send(msg, Number(port ?? 53), host!);
  });
}
