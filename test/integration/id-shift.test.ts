/**
 * The native halves of moving a fork into its own id range
 * (src/instances/id-shift.ts), on the real filesystem: re-owning a
 * writable layer never follows a link a sandbox planted and keeps
 * set-user-id bits; the process image copy has the bytes of the original,
 * is readable only by the fork's root group, and its user namespace maps
 * name the fork's range.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { freshHome, integration } from '../helpers/harness.js';
import { native } from '../../src/native/binding.js';
import { processImageForRange, rewriteUsernsImage, shiftLayerOwners } from '../../src/instances/id-shift.js';
import { FIRST_ID_BASE, ID_RANGE_SIZE } from '../../src/instances/id-ranges.js';

const FROM = FIRST_ID_BASE;
const TO = FIRST_ID_BASE + 5 * ID_RANGE_SIZE;

function scratch(t: { teardown: (fn: () => void) => void }): string {
  const dir = freshHome('id-shift');
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A userns-N.img as CRIU writes it: two magics, then one length-prefixed userns_entry. */
function usernsImage(base: number): Buffer {
  // userns_entry { uid_map { first: 0 lower_first: base count: 65536 } gid_map { same } }
  const extent = (tag: number) => {
    const body = Buffer.concat([Buffer.from([0x08, 0x00, 0x10]), varint(base), Buffer.from([0x18]), varint(65536)]);
    return Buffer.concat([Buffer.from([tag, body.length]), body]);
  };
  const entry = Buffer.concat([extent(0x0a), extent(0x12)]);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(entry.length);
  return Buffer.concat([Buffer.from('5443545454435454', 'hex'), len, entry]);
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

integration(test, () => {
  test('shiftOwners moves the range, leaves other ids and link targets alone, keeps set-user-id bits', async (t) => {
    const dir = scratch(t);
    const layer = path.join(dir, 'upper');
    const outside = path.join(dir, 'outside');
    fs.mkdirSync(path.join(layer, 'home', 'user'), { recursive: true });
    fs.writeFileSync(outside, 'host file');
    fs.chownSync(outside, FROM + 7, FROM + 7); // in the range, but not in the layer: must stay
    fs.writeFileSync(path.join(layer, 'home', 'user', 'notes'), 'x');
    fs.writeFileSync(path.join(layer, 'suid'), 'y');
    fs.writeFileSync(path.join(layer, 'hostowned'), 'z');
    fs.symlinkSync(outside, path.join(layer, 'link'));
    fs.chownSync(layer, FROM, FROM);
    fs.chownSync(path.join(layer, 'home'), FROM, FROM);
    fs.chownSync(path.join(layer, 'home', 'user'), FROM + 1000, FROM + 1000);
    fs.chownSync(path.join(layer, 'home', 'user', 'notes'), FROM + 1000, FROM + 100);
    fs.chownSync(path.join(layer, 'suid'), FROM, FROM);
    fs.chmodSync(path.join(layer, 'suid'), 0o4755);
    fs.lchownSync(path.join(layer, 'link'), FROM + 1000, FROM + 1000);

    await shiftLayerOwners(native(), layer, FROM, TO);

    const ids = (p: string) => {
      const st = fs.lstatSync(p);
      return [st.uid, st.gid];
    };
    t.deepEqual(ids(layer), [TO, TO]);
    t.deepEqual(ids(path.join(layer, 'home')), [TO, TO]);
    t.deepEqual(ids(path.join(layer, 'home', 'user')), [TO + 1000, TO + 1000]);
    t.deepEqual(ids(path.join(layer, 'home', 'user', 'notes')), [TO + 1000, TO + 100]);
    t.deepEqual(ids(path.join(layer, 'suid')), [TO, TO]);
    t.is(fs.statSync(path.join(layer, 'suid')).mode & 0o7777, 0o4755);
    t.deepEqual(ids(path.join(layer, 'hostowned')), [0, 0]);
    t.deepEqual(ids(path.join(layer, 'link')), [TO + 1000, TO + 1000]);
    t.deepEqual(ids(outside), [FROM + 7, FROM + 7]);
  });

  test('the process image copy for a range has the same bytes, the fork root group only, and maps of its range', async (t) => {
    const dir = scratch(t);
    const source = path.join(dir, 'image');
    const dest = path.join(dir, 'copy');
    fs.mkdirSync(source);
    const small = Buffer.from('core of task 1');
    const large = Buffer.alloc(1 << 20, 7); // above the buffer-copy size: reflinked where the filesystem can
    fs.writeFileSync(path.join(source, 'core-1.img'), small);
    fs.writeFileSync(path.join(source, 'pages-1.img'), large);
    fs.writeFileSync(path.join(source, 'userns-11.img'), usernsImage(FROM));

    await processImageForRange(native(), source, dest, FROM, TO);

    t.deepEqual(fs.readdirSync(dest).sort(), ['core-1.img', 'pages-1.img', 'userns-11.img']);
    t.deepEqual(fs.readFileSync(path.join(dest, 'core-1.img')), small);
    t.deepEqual(fs.readFileSync(path.join(dest, 'pages-1.img')), large);
    t.deepEqual(fs.readFileSync(path.join(dest, 'userns-11.img')), rewriteUsernsImage(usernsImage(FROM), FROM, TO));
    t.deepEqual(fs.readFileSync(path.join(dest, 'userns-11.img')), usernsImage(TO));
    const top = fs.statSync(dest);
    t.deepEqual([top.uid, top.gid, top.mode & 0o777], [0, TO, 0o750]);
    for (const f of fs.readdirSync(dest)) {
      const st = fs.statSync(path.join(dest, f));
      t.deepEqual([f, st.uid, st.gid, st.mode & 0o777], [f, 0, TO, 0o640]);
    }
    // The original is untouched.
    t.deepEqual(fs.readFileSync(path.join(source, 'userns-11.img')), usernsImage(FROM));
    // A second copy into the same place is refused, not merged.
    await t.throwsAsync(processImageForRange(native(), source, dest, FROM, TO), { code: 'EEXIST' });
  });
});
