/**
 * The TCP connections to the outside a sandbox's tree holds, read from
 * /proc/<init>/net/tcp (its network namespace's table) just before a
 * rollback replaces the tree: they are what the rollback resets (the
 * restored tree gets its sockets back closed, `tcp_close`). Only egress
 * sandboxes are read; loopback connections inside the sandbox are not
 * "to the outside".
 */
import fs from 'node:fs';

/** One connection, as `address:port` pairs. */
export interface ConnectionInfo {
  local: string;
  remote: string;
}

function hexAddress(s: string): string {
  const [ip, port] = s.split(':');
  const n = parseInt(ip!, 16);
  // /proc prints the address in host (little-endian) order.
  return `${n & 255}.${(n >>> 8) & 255}.${(n >>> 16) & 255}.${n >>> 24}:${parseInt(port!, 16)}`;
}

/** Parses /proc/net/tcp text: established connections whose remote end is not loopback. */
export function parseProcNetTcp(text: string): ConnectionInfo[] {
  const out: ConnectionInfo[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 4 || f[3] !== '01') continue; // 01: TCP_ESTABLISHED
    const local = hexAddress(f[1]!);
    const remote = hexAddress(f[2]!);
    if (remote.startsWith('127.')) continue;
    out.push({ local, remote });
  }
  return out;
}

/** The outside connections of the tree rooted at pid; [] when it cannot be read. */
export function outsideConnections(pid: number | null): ConnectionInfo[] {
  if (pid === null) return [];
  try {
    return parseProcNetTcp(fs.readFileSync(`/proc/${pid}/net/tcp`, 'utf8'));
  } catch {
    return [];
  }
}
