/**
 * The TCP connections to the outside a sandbox's tree holds, read from
 * /proc/<init>/net/tcp (its network namespace's table) just before a
 * rollback replaces the tree: they are what the rollback resets (the
 * restored tree gets its sockets back closed, `tcp_close`). Only egress
 * sandboxes are read; loopback connections inside the sandbox are not
 * "to the outside".
 *
 * The table is as long as the sandbox makes it (150k sockets took 599 ms to
 * read synchronously, on the event loop): it is read on libuv's pool, in
 * chunks, and at most MAX_TCP_TABLE_BYTES of it. Past that bound the
 * connections after it are still reset by the rollback but not listed: the
 * answer says `truncated`.
 */
import fs from 'node:fs';

/** At most this much of /proc/<init>/net/tcp is read: about 7,000 sockets (150 bytes a line). */
export const MAX_TCP_TABLE_BYTES = 1024 * 1024;
const CHUNK_BYTES = 64 * 1024;

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

/**
 * The outside connections of the tree rooted at pid, from at most maxBytes
 * of its table (whole lines only); none when it cannot be read.
 */
export async function outsideConnections(
  pid: number | null,
  maxBytes = MAX_TCP_TABLE_BYTES,
): Promise<{ connections: ConnectionInfo[]; truncated: boolean }> {
  if (pid === null) return { connections: [], truncated: false };
  let fh: fs.promises.FileHandle | undefined;
  try {
    fh = await fs.promises.open(`/proc/${pid}/net/tcp`, 'r');
    const buf = Buffer.allocUnsafe(maxBytes);
    let used = 0;
    let truncated = false;
    for (;;) {
      // One byte past the bound tells a table that ends there from a longer one.
      const want = Math.min(CHUNK_BYTES, maxBytes - used);
      if (want === 0) {
        truncated = (await fh.read(Buffer.allocUnsafe(1), 0, 1, null)).bytesRead > 0;
        break;
      }
      const { bytesRead } = await fh.read(buf, used, want, null);
      if (bytesRead === 0) break;
      used += bytesRead;
    }
    let text = buf.subarray(0, used).toString('latin1');
    if (truncated) text = text.slice(0, text.lastIndexOf('\n') + 1);
    return { connections: parseProcNetTcp(text), truncated };
  } catch {
    return { connections: [], truncated: false };
  } finally {
    await fh?.close().catch(() => undefined);
  }
}
