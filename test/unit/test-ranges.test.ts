/**
 * Integration files run two at a time (ava's concurrency), each with its own
 * state directory but on one host: two files whose egress sandboxes share an
 * address range get the same gateway and sandbox addresses, so one file's
 * resolver holds the other's gateway:53 and host routes point at the wrong
 * veth (network-checkpoint and network-dns-flood failed so in CI). Every
 * file that makes egress sandboxes names a range of its own, disjoint from
 * every other file's and from the default one.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULTS } from '../../src/config.js';
import { parseCidr } from '../../src/host/network/policy.js';

const dir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/integration');

test('every integration file with egress sandboxes has a network range no other file shares', (t) => {
  const ranges: { file: string; cidr: string }[] = [];
  for (const name of fs.readdirSync(dir).filter((f) => f.endsWith('.test.ts'))) {
    const text = fs.readFileSync(path.join(dir, name), 'utf8');
    if (!/egress/.test(text)) continue;
    const found = [...text.matchAll(/const RANGE = '(\d+\.\d+\.\d+\.\d+\/\d+)'/g)].map((m) => m[1]!);
    t.is(found.length, 1, `${name} makes egress sandboxes: it names one range (const RANGE = '…') and uses it`);
    if (found[0]) ranges.push({ file: name, cidr: found[0] });
  }
  t.true(ranges.length >= 4, `found the egress files: ${ranges.map((r) => r.file).join(', ')}`);
  const all = [...ranges, { file: 'the default (src/config.ts)', cidr: DEFAULTS.networkRange }];
  const span = (cidr: string) => {
    const c = parseCidr(cidr)!;
    return [c.base, c.base + 2 ** (32 - c.bits) - 1] as const;
  };
  for (let i = 0; i < all.length; i++)
    for (let j = i + 1; j < all.length; j++) {
      const [a0, a1] = span(all[i]!.cidr);
      const [b0, b1] = span(all[j]!.cidr);
      t.true(a1 < b0 || b1 < a0, `${all[i]!.file} (${all[i]!.cidr}) and ${all[j]!.file} (${all[j]!.cidr}) overlap`);
    }
});
