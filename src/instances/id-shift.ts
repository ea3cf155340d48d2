/**
 * Moving a checkpoint into another host id range, for a fork: a fork gets a
 * user namespace of its own, so both halves of the checkpoint that name
 * host ids are translated from the parent's range to the fork's:
 * - the fork's writable layer (a btrfs snapshot of the checkpoint's layer)
 *   has its owners shifted in place; image layers are never touched, they
 *   reach every sandbox through idmapped mounts;
 * - CRIU restores the user namespace with the id maps recorded in the
 *   process image (userns-N.img), so the fork restores from a copy of the
 *   image (reflinks on btrfs: no data copied) whose maps name its range.
 *   Every other id in a process image (task credentials, file owners) is
 *   recorded as seen inside the namespace, so it needs no change.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import protobuf from 'protobufjs';
import { ID_RANGE_SIZE } from './id-ranges.js';
import type { NativeBinding } from '../native/binding.js';
import { StoreFullError } from '../errors.js';

/** CRIU's images/userns.proto (MIT). */
const UsernsEntry = protobuf.Root.fromJSON({
  nested: {
    uid_gid_extent: {
      fields: {
        first: { rule: 'required', type: 'uint32', id: 1 },
        lower_first: { rule: 'required', type: 'uint32', id: 2 },
        count: { rule: 'required', type: 'uint32', id: 3 },
      },
    },
    userns_entry: {
      fields: {
        uid_map: { rule: 'repeated', type: 'uid_gid_extent', id: 1 },
        gid_map: { rule: 'repeated', type: 'uid_gid_extent', id: 2 },
      },
    },
  },
}).lookupType('userns_entry');

interface Extent {
  first: number;
  lower_first: number;
  count: number;
}

function shift(id: number, from: number, to: number): number {
  return id >= from && id < from + ID_RANGE_SIZE ? to + (id - from) : id;
}

/**
 * Re-owns every entry of a writable layer from one range to the other (ids
 * outside the range, such as files the host wrote, stay as they are), in
 * one native job (the addon's shiftOwners: no link followed, set-user/group-id
 * bits kept).
 */
export async function shiftLayerOwners(
  native: Pick<NativeBinding, 'shiftOwners'>,
  dir: string,
  from: number,
  to: number,
): Promise<void> {
  await storeFullOnEnospc(`Cannot move the owners of ${dir} into the fork's id range`, () =>
    native.shiftOwners(dir, from, to, ID_RANGE_SIZE),
  );
}

/** ENOSPC (the store is full; btrfs needs room for new metadata too) becomes DISK_FULL, as everywhere else. */
async function storeFullOnEnospc<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if ((e as NodeJS.ErrnoException | undefined)?.code === 'ENOSPC') throw new StoreFullError(what, e);
    throw e;
  }
}

/**
 * CRIU image files start with two 32-bit magics, then entries, each a
 * 32-bit little-endian length and a protobuf message; userns-N.img holds
 * one userns_entry.
 */
export function rewriteUsernsImage(buf: Buffer, from: number, to: number): Buffer {
  const size = buf.readUInt32LE(8);
  const entry = UsernsEntry.toObject(UsernsEntry.decode(buf.subarray(12, 12 + size))) as {
    uid_map?: Extent[];
    gid_map?: Extent[];
  };
  for (const e of [...(entry.uid_map ?? []), ...(entry.gid_map ?? [])]) e.lower_first = shift(e.lower_first, from, to);
  const body = Buffer.from(UsernsEntry.encode(UsernsEntry.fromObject(entry)).finish());
  const len = Buffer.alloc(4);
  len.writeUInt32LE(body.length);
  return Buffer.concat([buf.subarray(0, 8), len, body, buf.subarray(12 + size)]);
}

/**
 * With a user namespace, CRIU reads part of the images from inside the
 * restored tree: some before its id maps are written (as host root, whose
 * privilege does not reach there), some after it has become root of its
 * namespace (the sandbox's host root id). So the images (CRIU writes them
 * 0600) stay host root's and become readable by the sandbox's root group;
 * they stay in the host-only store, where the sandbox cannot reach them.
 */
export function shareProcessImageWith(dir: string, idBase: number | null): void {
  if (idBase === null) return;
  fs.chownSync(dir, 0, idBase);
  fs.chmodSync(dir, 0o750);
  for (const f of fs.readdirSync(dir)) {
    const file = path.join(dir, f);
    // Never through a link: chmod would follow it to the folder it names.
    if (fs.lstatSync(file).isSymbolicLink()) continue;
    fs.chownSync(file, 0, idBase);
    fs.chmodSync(file, 0o640);
  }
}

/**
 * A copy of a process image for a fork in range `to`, under `dest` (a
 * folder the caller removes); returns the folder to restore from. Off the
 * event loop: forks made side by side copy at once. A whole image is one
 * native job that reflinks every file into a folder owned by the fork's
 * root group (see shareProcessImageWith), then the user namespace's maps
 * are rewritten. An incremental image (page-delta.ts) links to its parent
 * as `../<id>`: the chain is copied too, each image as a sibling under
 * `dest`, so the link resolves to the copy, in the fork's range, and never
 * to the parent sandbox's own files. Copies are reflinks on btrfs, so no
 * page data is copied.
 */
export function processImageForRange(
  native: Pick<NativeBinding, 'cloneFolder'>,
  source: string,
  dest: string,
  from: number,
  to: number,
): Promise<string> {
  return storeFullOnEnospc('Cannot copy the process image for the fork', () =>
    copyChainForRange(native, source, dest, from, to),
  );
}

async function copyChainForRange(
  native: Pick<NativeBinding, 'cloneFolder'>,
  source: string,
  dest: string,
  from: number,
  to: number,
): Promise<string> {
  if (!fs.lstatSync(path.join(source, 'parent'), { throwIfNoEntry: false })) {
    await native.cloneFolder(source, dest, to, 0o640);
    for (const name of await fsp.readdir(dest)) {
      if (!/^userns-\d+\.img$/.test(name)) continue;
      const file = path.join(dest, name);
      // Written in place: the clone already has the owner and mode it needs.
      await fsp.writeFile(file, rewriteUsernsImage(await fsp.readFile(file), from, to));
    }
    return dest;
  }
  await fsp.mkdir(dest, { mode: 0o700 });
  // CRIU may follow a parent link ("../<id>") as the fork's root: it must be able to pass through here.
  await fsp.chown(dest, 0, to);
  await fsp.chmod(dest, 0o750);
  const store = path.dirname(source);
  let top: string | null = null;
  // MAX_CHAIN_DEPTH bounds the chain (page-delta.ts); the seen set stops a loop of links.
  const seen = new Set<string>();
  for (let id: string | null = path.basename(source); id !== null;) {
    if (seen.has(id)) throw new Error(`process image ${path.basename(source)} has a loop of parent links`);
    seen.add(id);
    const out = path.join(dest, id);
    top ??= out;
    id = await copyImageForRange(path.join(store, id), out, from, to);
  }
  return top!;
}

/** Copies one image folder for range `to`; returns the id its parent link names, or null. */
async function copyImageForRange(source: string, dest: string, from: number, to: number): Promise<string | null> {
  await fsp.mkdir(dest, { mode: 0o700 });
  let parent: string | null = null;
  await Promise.all(
    (await fsp.readdir(source)).map(async (name) => {
      const src = path.join(source, name);
      if (name === 'parent') {
        const target = await fsp.readlink(src);
        const m = /^\.\.\/([A-Za-z0-9_-]+)$/.exec(target);
        if (!m) throw new Error(`process image ${path.basename(source)} links outside the store`);
        parent = m[1]!;
        await fsp.symlink(target, path.join(dest, name));
      } else if (/^userns-\d+\.img$/.test(name))
        await fsp.writeFile(path.join(dest, name), rewriteUsernsImage(await fsp.readFile(src), from, to), {
          mode: 0o600,
        });
      else await fsp.copyFile(src, path.join(dest, name), fs.constants.COPYFILE_FICLONE);
    }),
  );
  shareProcessImageWith(dest, to);
  return parent;
}
