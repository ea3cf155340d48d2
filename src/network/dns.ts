/**
 * The resolver of egress sandboxes. One UDP socket per sandbox, bound to
 * port 53 of its gateway (the host side of its veth; nftables lets a sandbox
 * reach only its own gateway, and only UDP 53 while this socket is bound:
 * see `dns4` in nftables.ts). A query for a name the policy allows
 * (policy.ts, `nameAllowed`) is forwarded to the configured upstream; the
 * IPv4 addresses of the answer are added to the sandbox's allow set, with
 * the answer's TTL as timeout (at least 60 s, at most 1 hour), before the
 * answer is sent back: a connection the sandbox opens to an address it was
 * just told about is never refused. Any other name gets NXDOMAIN; AAAA gets
 * an empty answer (sandboxes have no IPv6). Messages are parsed and written
 * with `dns-packet` (docs/ARCHITECTURE.md, "Dependencies and why"); nothing
 * here interprets DNS by hand.
 *
 * What a sandbox can make the manager hold is bounded (DNS_LIMITS): queries
 * go upstream through a fixed pool of sockets shared by every sandbox (each
 * query gets an id of the pool's choosing, rewritten back on the answer),
 * each sandbox has a query rate and a number of forwarded queries in
 * flight, and a query past either is answered REFUSED at once. Learned
 * addresses are deduplicated and capped per sandbox (learned.ts) and go to
 * nft in batches through one long-lived process (nft-session.ts). A
 * sandbox's `bandwidthMbit` caps its DNS too (nftables.ts, `uplimit`).
 *
 * It runs inside the manager, so names resolve while a manager
 * (`lockstep serve`, or a program holding a Lockstep open) has the state
 * directory open; another manager of the same directory finds the port
 * taken and leaves it to the first.
 */
import dgram from 'node:dgram';
import fs from 'node:fs';
import { randomInt } from 'node:crypto';
import * as dnsPacket from 'dns-packet';
import { Admission } from '../admission.js';
import type { SandboxRow } from '../catalog/catalog.js';
import type { Logger } from '../log.js';
import { TokenBuckets } from '../token-bucket.js';
import type { HostNetwork } from '../host/network/host-network.js';
import { LearnedAddresses } from '../host/network/learned.js';
import type { AllowElement } from '../host/network/nftables.js';
import { nameAllowed, policyOf, type NetworkPolicy } from '../host/network/policy.js';

const MIN_TTL_S = 60;
const MAX_TTL_S = 3600;

/** The resolver's bounds (docs/SECURITY.md). */
export const DNS_LIMITS = {
  /** UDP sockets to the upstream, shared by every sandbox. */
  upstreamSockets: 4,
  /** How long a forwarded query waits for the upstream. */
  upstreamTimeoutMs: 3000,
  /** Queries per second per sandbox (any query: forwarded or answered here), and the burst. */
  queriesPerS: 100,
  queryBurst: 200,
  /** Forwarded queries in flight per sandbox, and for the whole manager. */
  inFlightPerSandbox: 32,
  inFlightTotal: 1024,
};

const RCODE = { SERVFAIL: 2, NXDOMAIN: 3, REFUSED: 5 } as const;

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
  /** Set by close: answers still being worked out are not sent. */
  closed: boolean;
}

export class SandboxResolver {
  private readonly listeners = new Map<string, Listener>();
  private readonly rate = new TokenBuckets({ ratePerS: DNS_LIMITS.queriesPerS, burst: DNS_LIMITS.queryBurst });
  private readonly inFlight = new Admission({
    what: 'DNS queries',
    perKey: DNS_LIMITS.inFlightPerSandbox,
    total: DNS_LIMITS.inFlightTotal,
    scope: 'sandbox',
  });
  private readonly pool = new UpstreamPool(DNS_LIMITS.upstreamSockets, DNS_LIMITS.upstreamTimeoutMs);
  readonly learned = new LearnedAddresses();
  /** Queries refused at once (rate or in-flight bound), for tests and logs. */
  refused = 0;

  /** Forwarded queries in flight, for one sandbox address or in total. */
  inFlightCount(address?: string): number {
    return this.inFlight.inFlight(address);
  }

  constructor(
    private readonly network: HostNetwork,
    private readonly upstream: () => string | undefined,
    private readonly log: Logger,
  ) {}

  /**
   * Starts answering for an egress sandbox (idempotent; a no-op without a
   * network). Resolves once the socket is bound and the firewall lets the
   * sandbox reach it; never rejects (a resolver that cannot listen is logged).
   */
  open(row: Pick<SandboxRow, 'id' | 'network' | 'net_slot'>): Promise<void> {
    const policy = policyOf(row.network ?? null);
    if (!policy || row.net_slot == null || this.listeners.has(row.id)) return Promise.resolve();
    const { gateway, address } = this.network.addresses(row.net_slot);
    const socket = dgram.createSocket({ type: 'udp4', reuseAddr: false });
    const listener: Listener = { socket, policy, address, closed: false };
    this.listeners.set(row.id, listener);
    socket.on('message', (msg, rinfo) => {
      if (rinfo.address !== address) return;
      this.onQuery(listener, msg, rinfo.port);
    });
    socket.unref();
    return new Promise<void>((resolve) => {
      socket.once('error', (err) => {
        this.log.debug({ err, sandboxId: row.id }, 'sandbox resolver not listening');
        if (this.listeners.get(row.id) === listener) this.listeners.delete(row.id);
        socket.close();
        resolve();
      });
      socket.bind(53, gateway, () => {
        socket.on('error', (err) => this.log.warn({ err, sandboxId: row.id }, 'sandbox resolver socket'));
        this.network
          .setResolver(address, true)
          .catch((err) => this.log.warn({ err, sandboxId: row.id }, 'cannot open DNS to the sandbox resolver'))
          .finally(resolve);
      });
    });
  }

  /** Stops answering for a sandbox; resolves once UDP 53 to its gateway is closed again (never rejects). */
  close(sandboxId: string): Promise<void> {
    const l = this.listeners.get(sandboxId);
    if (!l) return Promise.resolve();
    this.listeners.delete(sandboxId);
    l.closed = true;
    this.learned.forget(l.address);
    this.rate.forget(l.address);
    try {
      l.socket.close();
    } catch {
      /* already closed */
    }
    return this.network
      .setResolver(l.address, false)
      .catch((err) => this.log.debug({ err, sandboxId }, 'could not close DNS to the sandbox resolver'));
  }

  /** Every resolver and the upstream pool (manager close). */
  async closeAll(): Promise<void> {
    const closing = [...this.listeners.keys()].map((id) => this.close(id));
    this.pool.close();
    await Promise.all(closing);
  }

  private reply(l: Listener, port: number, packet: dnsPacket.Packet): void {
    if (!l.closed) l.socket.send(dnsPacket.encode(packet), port, l.address);
  }

  private onQuery(l: Listener, msg: Buffer, port: number): void {
    let query: dnsPacket.DecodedPacket;
    try {
      query = dnsPacket.decode(msg);
    } catch {
      return; // not DNS: no answer
    }
    if (query.type !== 'query') return;
    if (!this.rate.take(l.address)) return this.refuse(l, port, query);
    let release: () => void;
    try {
      release = this.inFlight.enter(l.address);
    } catch {
      return this.refuse(l, port, query);
    }
    void this.answer(l, msg, query, port)
      .catch((err) => this.log.warn({ err, address: l.address }, 'sandbox resolver failed to answer'))
      .finally(release);
  }

  private refuse(l: Listener, port: number, query: dnsPacket.DecodedPacket): void {
    this.refused++;
    this.reply(l, port, {
      id: query.id,
      type: 'response',
      flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | RCODE.REFUSED,
      questions: query.questions ?? [],
      answers: [],
    });
  }

  private async answer(l: Listener, msg: Buffer, query: dnsPacket.DecodedPacket, port: number): Promise<void> {
    const q = query.questions?.[0];
    const base = { id: query.id, type: 'response' as const, questions: query.questions ?? [] };
    const flags = dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE;
    const rule = q ? nameAllowed(l.policy, q.name) : undefined;
    if (!q || !rule) return this.reply(l, port, { ...base, flags: flags | RCODE.NXDOMAIN, answers: [] });
    if (q.type === 'AAAA') return this.reply(l, port, { ...base, flags, answers: [] });
    const upstream = this.upstream();
    if (!upstream) return this.reply(l, port, { ...base, flags: flags | RCODE.SERVFAIL, answers: [] });
    const got = await this.pool.query(msg, q, upstream);
    if (!got) return this.reply(l, port, { ...base, flags: flags | RCODE.SERVFAIL, answers: [] });
    const { answer, decoded } = got;
    const open = l.policy.cidrs.some((c) => c.cidr === '0.0.0.0/0' && c.ports[0] === 0 && c.ports[1] === 65535);
    const elements: AllowElement[] = [];
    for (const a of decoded.answers ?? []) {
      if (a.type !== 'A' || typeof a.data !== 'string') continue;
      if (open) continue; // every address outside the deny set is allowed already
      const timeoutS = Math.min(MAX_TTL_S, Math.max(MIN_TTL_S, a.ttl ?? MIN_TTL_S));
      for (const proto of ['tcp', 'udp'] as const)
        elements.push({ sandbox: l.address, cidr: `${a.data}/32`, proto, ports: rule.ports, timeoutS });
    }
    if (elements.length) {
      const { add, waitFor, refused } = this.learned.admit(elements, Date.now());
      if (refused) this.log.debug({ address: l.address, refused }, 'sandbox holds its maximum of learned addresses');
      if (add.length) {
        const batch = this.network.addLearned(add);
        this.learned.adding(add, batch);
        waitFor.push(batch);
      }
      // Before the answer: the sandbox's first connection must find its element.
      try {
        await Promise.all(waitFor);
      } catch (err) {
        this.log.warn({ err, address: l.address }, 'could not add learned addresses');
        return this.reply(l, port, { ...base, flags: flags | RCODE.SERVFAIL, answers: [] });
      }
    }
    if (!l.closed) l.socket.send(answer, port, l.address);
  }
}

interface Waiting {
  question: dnsPacket.Question;
  originalId: number;
  host: string;
  port: number;
  timer: NodeJS.Timeout;
  resolve: (got: { answer: Buffer; decoded: dnsPacket.DecodedPacket } | undefined) => void;
}

/**
 * A fixed number of UDP sockets to the upstream, shared by every sandbox.
 * A query is sent with an id of the pool's choosing (random, unused on its
 * socket) and matched back by (socket, id, upstream address, question);
 * the sandbox's own id is written back into the answer.
 */
class UpstreamPool {
  private readonly sockets: (dgram.Socket | undefined)[];
  private readonly waiting: Map<number, Waiting>[];
  private next = 0;

  constructor(
    size: number,
    private readonly timeoutMs: number,
  ) {
    this.sockets = new Array<dgram.Socket | undefined>(size).fill(undefined);
    this.waiting = Array.from({ length: size }, () => new Map<number, Waiting>());
  }

  query(
    msg: Buffer,
    question: dnsPacket.Question,
    upstream: string,
  ): Promise<{ answer: Buffer; decoded: dnsPacket.DecodedPacket } | undefined> {
    const [host, p] = upstream.split(':');
    const port = Number(p ?? 53);
    const i = this.next++ % this.sockets.length;
    const socket = this.socket(i);
    const waiting = this.waiting[i]!;
    let id = randomInt(65536);
    for (let tries = 0; waiting.has(id); tries++) {
      if (tries > 64) return Promise.resolve(undefined); // the socket's ids are (nearly) all taken
      id = randomInt(65536);
    }
    const out = Buffer.from(msg);
    out.writeUInt16BE(id, 0);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        waiting.delete(id);
        resolve(undefined);
      }, this.timeoutMs);
      waiting.set(id, { question, originalId: msg.readUInt16BE(0), host: host!, port, timer, resolve });
      socket.send(out, port, host!, (err) => {
        if (!err || waiting.get(id)?.timer !== timer) return;
        clearTimeout(timer);
        waiting.delete(id);
        resolve(undefined);
      });
    });
  }

  close(): void {
    for (let i = 0; i < this.sockets.length; i++) this.drop(i);
  }

  private socket(i: number): dgram.Socket {
    const existing = this.sockets[i];
    if (existing) return existing;
    const s = dgram.createSocket('udp4');
    this.sockets[i] = s;
    s.on('error', () => {
      if (this.sockets[i] === s) this.drop(i);
    });
    s.on('message', (b, rinfo) => this.onAnswer(i, b, rinfo));
    s.unref();
    return s;
  }

  private onAnswer(i: number, b: Buffer, rinfo: dgram.RemoteInfo): void {
    if (b.length < 12) return;
    const waiting = this.waiting[i]!;
    const id = b.readUInt16BE(0);
    const w = waiting.get(id);
    if (!w || rinfo.address !== w.host || rinfo.port !== w.port) return;
    let decoded: dnsPacket.DecodedPacket;
    try {
      decoded = dnsPacket.decode(b);
    } catch {
      return;
    }
    const q = decoded.questions?.[0];
    if (
      decoded.type !== 'response' ||
      !q ||
      q.type !== w.question.type ||
      q.name.toLowerCase() !== w.question.name.toLowerCase()
    )
      return; // not the answer to this question: keep waiting
    clearTimeout(w.timer);
    waiting.delete(id);
    const answer = Buffer.from(b);
    answer.writeUInt16BE(w.originalId, 0);
    w.resolve({ answer, decoded });
  }

  /** Closes socket i; its queries end unanswered (SERVFAIL). */
  private drop(i: number): void {
    const s = this.sockets[i];
    this.sockets[i] = undefined;
    try {
      s?.close();
    } catch {
      /* already closed */
    }
    const waiting = this.waiting[i]!;
    for (const w of waiting.values()) {
      clearTimeout(w.timer);
      w.resolve(undefined);
    }
    waiting.clear();
  }
}
