/**
 * Copy-on-write: whatever a sandbox does to files that come from its image
 * (overwrite, append, delete, chmod, touch, rename, in-place byte edits of a
 * big binary) lands in its own writable layer. The image's root filesystem on
 * the host stays byte-identical, and a second sandbox from the same image
 * sees the original files.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/**
 * Everything observable about a tree, per path: type, permission bits,
 * owner, size, mtime and content hash (or link target). Link counts, ctime
 * and atime are left out: other state directories hard-link the same build
 * cache concurrently, and reads may touch atime.
 */
function fingerprint(root: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (rel: string) => {
    const abs = path.join(root, rel);
    const st = fs.lstatSync(abs, { bigint: true });
    const meta = `mode=${st.mode.toString(8)} uid=${st.uid} gid=${st.gid} mtime=${st.mtimeNs}`;
    if (st.isSymbolicLink()) out.set(rel, `link ${fs.readlinkSync(abs)} ${meta}`);
    else if (st.isFile()) out.set(rel, `file size=${st.size} sha256=${sha256(fs.readFileSync(abs))} ${meta}`);
    else if (st.isDirectory()) {
      out.set(rel, `dir ${meta}`);
      for (const name of fs.readdirSync(abs).sort()) walk(path.join(rel, name));
    } else out.set(rel, `other ${meta}`);
  };
  walk('.');
  return out;
}

function diff(before: Map<string, string>, after: Map<string, string>): string[] {
  const keys = new Set([...before.keys(), ...after.keys()]);
  return [...keys]
    .filter((k) => before.get(k) !== after.get(k))
    .map((k) => `${k}: ${before.get(k)} -> ${after.get(k)}`);
}

/**
 * Every process of a sandbox command is busybox, so /bin/busybox is always
 * being executed (ETXTBSY for writers). A private copy run through `exec`
 * takes its place, after which the image's busybox can be edited in place.
 */
const WITH_PRIVATE_BUSYBOX = (script: string) =>
  `mkdir -p /tmp/bb && cp /bin/busybox /tmp/bb/busybox && for a in sh dd printf echo chmod touch sha256sum stat; do ln -sf busybox /tmp/bb/$a; done; PATH=/tmp/bb exec /tmp/bb/sh -c '${script}'`;

integration(test, () => {
  test.serial(
    'changes to image files stay in the sandbox; the image and a second sandbox see the original bytes',
    async (t) => {
      const ls = await openTestLockstep(t);
      const rootfs = ls.images.get('base').rootfs;
      const before = fingerprint(rootfs);
      t.true(before.size > 100, `the base image has ${before.size} entries`);
      const original = {
        busybox: sha256(fs.readFileSync(path.join(rootfs, 'bin/busybox'))),
        busyboxSize: fs.statSync(path.join(rootfs, 'bin/busybox')).size,
        passwd: fs.readFileSync(path.join(rootfs, 'etc/passwd'), 'utf8'),
        hosts: fs.readFileSync(path.join(rootfs, 'etc/hosts'), 'utf8'),
        group: fs.readFileSync(path.join(rootfs, 'etc/group'), 'utf8'),
      };

      const sb = await ls.create();
      const edit = await sb.commands.run([
        'sh',
        '-c',
        [
          "echo 'mallory:x:0:0::/:/bin/sh' > /etc/passwd",
          'chmod 600 /etc/passwd',
          "echo '203.0.113.9 evil.example' >> /etc/hosts",
          'rm /etc/group',
          'rm -rf /usr/sbin',
          'mv /bin/ls /bin/ls-moved',
          'chmod 700 /usr/bin',
          'touch -h -d 2001-01-01 /usr/bin/wget',
        ].join(' && '),
      ]);
      t.is(edit.exitCode, 0, edit.stderr);
      const big = await sb.commands.run([
        'sh',
        '-c',
        WITH_PRIVATE_BUSYBOX(
          'echo appended >> /bin/busybox && printf ZZZZ | dd of=/bin/busybox bs=1 seek=$(($(stat -c %s /bin/busybox) - 4)) conv=notrunc 2>/dev/null && chmod 4711 /bin/busybox && touch -d 2001-01-01 /bin/busybox && stat -c "%s %a" /bin/busybox && sha256sum /bin/busybox',
        ),
      ]);
      t.is(big.exitCode, 0, big.stderr);
      const [statLine, sumLine] = big.stdout.trim().split('\n');
      t.is(statLine, `${original.busyboxSize + 'appended\n'.length} 4711`);
      // Appended, then its last four bytes overwritten in place (the code itself stays runnable).
      const expected = Buffer.concat([fs.readFileSync(path.join(rootfs, 'bin/busybox')), Buffer.from('appenZZZZ')]);
      t.is(sumLine, `${sha256(expected)}  /bin/busybox`);
      // The host's files API goes through the same overlay.
      await sb.files.write('/etc/hosts', 'rewritten from the host\n');
      await sb.files.remove('/usr/bin/wget');

      // Inside, the sandbox sees its own changes.
      const seen = await sb.commands.run([
        'sh',
        '-c',
        'cat /etc/passwd /etc/hosts; ls /etc; test -e /usr/sbin || echo no-sbin; test -e /usr/bin/wget || echo no-wget; ls /bin/ls-moved',
      ]);
      t.is(
        seen.stdout,
        'mallory:x:0:0::/:/bin/sh\nrewritten from the host\nhosts\npasswd\nno-sbin\nno-wget\n/bin/ls-moved\n',
      );
      // ...which live in its writable layer: a modified copy of busybox and a whiteout for /etc/group.
      const upper = ls.engine.layers.upperDir(sb.id).upper;
      t.is(sha256(fs.readFileSync(path.join(upper, 'bin/busybox'))), sha256(expected));
      t.true(fs.lstatSync(path.join(upper, 'etc/group')).isCharacterDevice(), 'overlay whiteout');

      // The image on the host is untouched, bit for bit and in its metadata.
      t.deepEqual(diff(before, fingerprint(rootfs)), []);

      // A second sandbox from the same image sees the original files.
      const fresh = await ls.create({ image: 'base' });
      const orig = await fresh.commands.run([
        'sh',
        '-c',
        'sha256sum /bin/busybox; stat -c "%s %a" /bin/busybox /etc/passwd; cat /etc/passwd /etc/hosts /etc/group; ls /usr/sbin | wc -l; ls /bin/ls',
      ]);
      t.is(orig.exitCode, 0, orig.stderr);
      const lines = orig.stdout.split('\n');
      t.is(lines[0], `${original.busybox}  /bin/busybox`);
      t.is(lines[1], `${original.busyboxSize} 755`);
      t.is(lines[2], `${original.passwd.length} 644`);
      t.is(lines.slice(3).join('\n'), `${original.passwd}${original.hosts}${original.group}${lines.at(-3)}\n/bin/ls\n`);
      t.true(Number(lines.at(-3)) > 0, '/usr/sbin is populated');
      const freshRead = await fresh.files.read('/bin/busybox');
      t.is(freshRead.sha256, original.busybox);

      // Removing the modified sandbox changes nothing in the image either.
      await ls.remove(sb.id);
      t.deepEqual(diff(before, fingerprint(rootfs)), []);
      t.is((await fresh.files.read('/etc/passwd')).content.toString(), original.passwd);
    },
  );
});
