/** The records the manager writes to a relay's FIFO (src/instances/relay.ts), as native/init/lockstep-relay.c reads them. */
import test from 'ava';
import { closeRecord, dataRecords, resizeRecord } from '../../src/instances/relay.js';

/** Splits a byte string into records the way the relay does: type, 4-byte LE length, payload. */
function parse(b: Buffer): { type: string; payload: Buffer }[] {
  const out = [];
  for (let at = 0; at < b.length;) {
    const n = b.readUInt32LE(at + 1);
    out.push({ type: String.fromCharCode(b[at]!), payload: b.subarray(at + 5, at + 5 + n) });
    at += 5 + n;
  }
  return out;
}

test('input bytes become data records of at most 64 KiB that concatenate to the input', (t) => {
  const data = Buffer.alloc(150_000);
  for (let i = 0; i < data.length; i++) data[i] = (i * 31) & 0xff;
  const recs = parse(dataRecords(data));
  t.deepEqual(
    recs.map((r) => [r.type, r.payload.length]),
    [
      ['d', 65536],
      ['d', 65536],
      ['d', 150_000 - 2 * 65536],
    ],
  );
  t.true(Buffer.concat(recs.map((r) => r.payload)).equals(data));
  t.deepEqual(parse(dataRecords(Buffer.alloc(0))), []);
});

test('resize carries cols then rows as 16-bit little-endian; close is an empty record', (t) => {
  t.deepEqual([...resizeRecord(300, 2)], [0x72, 4, 0, 0, 0, 0x2c, 0x01, 0x02, 0x00]);
  t.deepEqual([...closeRecord()], [0x63, 0, 0, 0, 0]);
});
