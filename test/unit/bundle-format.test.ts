/**
 * The bundle's byte format (src/snapshots/bundle-format.ts) and the host
 * compatibility check (src/snapshots/host-identity.ts): pure logic, no root.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import test from 'ava';
import { BundleWriter, MAX_FRAME, readBundle, type BundleEvent } from '../../src/snapshots/bundle-format.js';
import { checkCompatible, hostIdentity, type HostIdentity } from '../../src/snapshots/host-identity.js';
import { checkSignature, keyName, signDigest } from '../../src/snapshots/signing.js';

/** Writes a bundle of the given parts, each part's data cut into the given chunks. */
async function write(header: unknown, parts: [string, Buffer[]][]): Promise<Buffer> {
  const w = new BundleWriter();
  const out: Buffer[] = [w.header(header)];
  for (const [name, chunks] of parts) for await (const f of w.part(name, chunks)) out.push(f);
  out.push(w.end().frame);
  return Buffer.concat(out);
}

async function read(bytes: Buffer, cut = 7919): Promise<BundleEvent[]> {
  async function* pieces() {
    for (let i = 0; i < bytes.length; i += cut) yield bytes.subarray(i, i + cut);
  }
  const events: BundleEvent[] = [];
  for await (const ev of readBundle(pieces())) events.push(ev);
  return events;
}

const big = randomBytes(MAX_FRAME * 2 + 12345);

test('a bundle reads back as it was written, whatever the chunking on either side', async (t) => {
  const bytes = await write({ v: 1 }, [
    ['layer', [big.subarray(0, 100), big.subarray(100)]],
    ['empty', []],
    ['small', [Buffer.from('hello')]],
  ]);
  for (const cut of [13, 4096, 1 << 20, bytes.length]) {
    const events = await read(bytes, cut);
    t.deepEqual(events[0], { type: 'header', header: { v: 1 } });
    const data = (name: string) =>
      Buffer.concat(events.flatMap((e) => (e.type === 'data' && e.name === name ? [e.chunk] : [])));
    t.true(data('layer').equals(big));
    t.is(data('empty').length, 0);
    t.is(data('small').toString(), 'hello');
    t.deepEqual(
      events.filter((e) => e.type === 'partEnd').map((e) => (e as { name: string }).name),
      ['layer', 'empty', 'small'],
    );
    t.is(events.at(-1)!.type, 'end');
  }
});

test('the bytes, and so the digest, depend only on the content, not on how the source cut it', async (t) => {
  const a = await write({ v: 1 }, [['layer', [big]]]);
  const b = await write({ v: 1 }, [['layer', [big.subarray(0, 3), big.subarray(3, 70000), big.subarray(70000)]]]);
  t.true(a.equals(b));
  const [endA] = (await read(a)).filter((e) => e.type === 'end');
  t.regex((endA as { digest: string }).digest, /^[0-9a-f]{64}$/);
});

const corrupt = test.macro({
  async exec(t, damage: (b: Buffer) => Buffer, reason: RegExp) {
    const good = await write({ v: 1 }, [
      ['layer', [big]],
      ['small', [Buffer.from('hello')]],
    ]);
    const e = await t.throwsAsync(read(damage(Buffer.from(good))), { code: 'BUNDLE_CORRUPT' });
    t.regex(e!.message, reason);
  },
  title: (what) => `a bundle with ${what} is BUNDLE_CORRUPT`,
});
test('a flipped data byte', corrupt, (b) => ((b[b.length >> 1]! ^= 1), b), /does not match its SHA-256/);
test('a flipped header byte', corrupt, (b) => ((b[15]! ^= 1), b), /header is not JSON|digest/);
test('a truncated end', corrupt, (b) => b.subarray(0, b.length - 10), /truncated|ends/);
test('bytes after its end', corrupt, (b) => Buffer.concat([b, Buffer.from('x')]), /after its end/);
test('another magic', corrupt, (b) => (b.write('NOTABUND', 0, 'latin1'), b), /does not start/);
test('a frame of an unknown type', corrupt, (b) => (b.write('Q', 8, 'latin1'), b), /unknown type/);
test('nothing at all', corrupt, () => Buffer.alloc(0), /too short/);

const here: HostIdentity = { arch: 'x64', kernelRelease: '6.18.0-1-amd64', cpuFlags: ['avx2', 'fpu', 'sse2'] };

test('a snapshot restores on the same host, a newer kernel, or a CPU with more extensions', (t) => {
  t.notThrows(() => checkCompatible(here, here));
  t.notThrows(() => checkCompatible({ ...here, kernelRelease: '6.12.5' }, here));
  t.notThrows(() => checkCompatible({ ...here, cpuFlags: ['fpu', 'hypervisor'] }, here), 'non-ISA flags do not matter');
  t.notThrows(() => checkCompatible(hostIdentity(), hostIdentity()));
});

const incompatible = test.macro({
  exec(t, source: unknown, field: string | undefined) {
    const e = t.throws(() => checkCompatible(source, here), { code: 'SNAPSHOT_INCOMPATIBLE' });
    t.is((e as unknown as { details: { field?: string } }).details.field, field);
  },
  title: (what) => `SNAPSHOT_INCOMPATIBLE: ${what}`,
});
test('another architecture', incompatible, { ...here, arch: 'arm64' }, 'arch');
test('an older kernel here', incompatible, { ...here, kernelRelease: '6.19.1' }, 'kernelRelease');
test('a CPU extension missing here', incompatible, { ...here, cpuFlags: ['avx512f', 'fpu'] }, 'cpuFlags');
test('no host facts at all', incompatible, undefined, undefined);

test('a signed bundle ends with its signature frame; the reader hands it over, and refuses it anywhere else', async (t) => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const key = { privateKey, name: keyName(publicKey) };
  const w = new BundleWriter();
  const frames: Buffer[] = [w.header({ v: 1 })];
  for await (const f of w.part('p', [Buffer.from('data')])) frames.push(f);
  const end = w.end((digest) => signDigest(key, digest));
  const bytes = Buffer.concat([...frames, end.frame]);
  t.is(end.bytes, bytes.length, 'the length counts the signature frame');
  const last = (await read(bytes)).at(-1)!;
  t.is(last.type, 'end');
  if (last.type !== 'end') return;
  t.is(last.digest, end.digest);
  t.is(checkSignature(last.signature, Buffer.from(last.digest, 'hex'), [key.name]), key.name);
  t.throws(() => checkSignature(last.signature, Buffer.from(last.digest, 'hex'), []), { code: 'BUNDLE_UNTRUSTED' });
  t.throws(() => checkSignature(undefined, Buffer.from(last.digest, 'hex'), [key.name]), {
    code: 'BUNDLE_UNTRUSTED',
    message: /not signed/,
  });
  const other = Buffer.from(last.digest, 'hex');
  other[0]! ^= 1;
  t.throws(() => checkSignature(last.signature, other, [key.name]), {
    code: 'BUNDLE_UNTRUSTED',
    message: /not verify/,
  });
  // Anything after the signature, or a signature frame before the end, is not a bundle.
  await t.throwsAsync(read(Buffer.concat([bytes, Buffer.from('x')])), { code: 'BUNDLE_CORRUPT' });
  const sFrame = end.frame.subarray(37);
  await t.throwsAsync(read(Buffer.concat([frames[0]!, sFrame, ...frames.slice(1), end.frame])), {
    code: 'BUNDLE_CORRUPT',
  });
  // Signing is deterministic: the same bundle signed twice is the same bytes (resumed downloads need it).
  t.deepEqual(signDigest(key, Buffer.alloc(32, 1)), signDigest(key, Buffer.alloc(32, 1)));
});
