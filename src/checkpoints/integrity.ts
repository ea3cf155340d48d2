/**
 * Checkpoint integrity: what a checkpoint's files were when it was taken,
 * recorded in its catalog row, and checked before anything is restored
 * from it (rollback by CRIU, fork, warm standby), so that a damaged
 * checkpoint is refused before the sandbox is touched rather than found
 * half-way through a restore.
 * - Process image: SHA-256 and size of every file CRIU wrote, computed while
 *   the store's `syncfs` runs (the files are still in the page cache), and
 *   read back in full before a restore, unless this process read the same
 *   file unchanged before (see `verified`). btrfs's own block checksums turn
 *   media errors into EIO on that read; the digests catch everything else
 *   (a flipped byte, a truncated or replaced file, a file added or removed).
 * - Layer: the read-only snapshot's UUID and ctransid
 *   (BTRFS_IOC_GET_SUBVOL_INFO). Any change to a subvolume's files moves its
 *   ctransid, and a replaced subvolume has another UUID, so a layer is
 *   verified in O(1) whatever its size; writing into it at all needs its
 *   read-only flag lifted first.
 * (Decision and measurements: docs/decisions/checkpoint-integrity.md, "Checkpoint integrity".)
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import type { Catalog, CheckpointRow } from '../catalog/catalog.js';
import { parentOf } from './page-delta.js';
import { LockstepError } from '../errors.js';
import type { NativeBinding } from '../native/binding.js';
import type { Logger } from '../log.js';
import type { NativeBinding as NativeBindingPort } from '../ports.js';
import type { StatePaths } from '../paths.js';

/** What integrity.ts uses of the manager's services (api/engine.ts builds them). */
export interface IntegrityDeps {
  /** The rows of the checkpoints an incremental image takes pages from. */
  catalog: Catalog;
  log: Logger;
  native: NativeBindingPort;
  paths: StatePaths;
}

/** What a checkpoint's files were when it was taken (stored as JSON in checkpoints.checksums). */
export interface CheckpointChecksums {
  /** Process image files by name: size in bytes and SHA-256 (hex). */
  images: Record<string, { size: number; sha256: string }>;
  /** The read-only layer subvolume's identity and last change. */
  layer: { uuid: string; ctransid: number };
}

/** A checkpoint's files differ from what was recorded when it was taken; nothing was restored from it. */
export class CheckpointCorruptError extends LockstepError {
  constructor(checkpointId: string, file: string, reason: string) {
    super(
      'CHECKPOINT_CORRUPT',
      `Checkpoint ${checkpointId} is corrupt: ${file} ${reason}; nothing was ` +
        `restored from it (checkpoints that take no pages from it are unaffected)`,
      {
        details: { checkpointId, file, reason },
      },
    );
  }
}

const CHUNK = 1 << 20;
/** Files up to this size are read in one call: a stream costs a pool round trip per chunk. */
const WHOLE_FILE_BYTES = 8 << 20;

/** SHA-256 and size of a file's bytes (a link: of what it names). */
async function hashFile(file: string): Promise<{ size: number; sha256: string }> {
  // An incremental image's `parent` link (page-delta.ts): what it names is what counts.
  const st = await fs.promises.lstat(file);
  if (st.isSymbolicLink()) {
    const target = Buffer.from(await fs.promises.readlink(file));
    return { size: target.length, sha256: createHash('sha256').update(target).digest('hex') };
  }
  return hashRegularFile(file, st.size);
}

async function hashRegularFile(file: string, knownSize?: number): Promise<{ size: number; sha256: string }> {
  const h = createHash('sha256');
  if (knownSize !== undefined && knownSize <= WHOLE_FILE_BYTES) {
    const bytes = await fs.promises.readFile(file);
    return { size: bytes.length, sha256: h.update(bytes).digest('hex') };
  }
  // Large files in 1 MiB chunks, so the event loop keeps turning between them.
  let size = 0;
  for await (const chunk of fs.createReadStream(file, { highWaterMark: CHUNK })) {
    h.update(chunk as Buffer);
    size += (chunk as Buffer).length;
  }
  return { size, sha256: h.digest('hex') };
}

/**
 * Files this process has read and found as recorded, by path, with the
 * identity they had then: device, inode, size, mtime and ctime to the
 * nanosecond. A file whose identity is unchanged has not been written since
 * (every write, truncate, rename over it, chmod or utimes moves its ctime,
 * and only the kernel sets ctime), so it is not read again: a fork or
 * rollback from the same checkpoint costs an lstat per file after the first.
 * A file changed within the last second is never remembered (git's "racily
 * clean" rule): timestamps come from a coarse clock, so a write right after
 * the read could leave them as they were. Bounded; the oldest go first.
 */
const verified = new Map<string, string>();
const VERIFIED_MAX = 16384;
const SETTLE_NS = 1_000_000_000n;

function identityOf(st: fs.BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

/** A file's size and digest, from memory when its identity says it was read before and is unchanged. */
async function checkedDigest(file: string, want: { sha256: string }): Promise<{ size: number; sha256: string }> {
  const st = await fs.promises.lstat(file, { bigint: true });
  if (!st.isFile()) return hashFile(file);
  const identity = identityOf(st);
  const remembered = verified.get(file);
  if (remembered === `${identity}:${want.sha256}`) return { size: Number(st.size), sha256: want.sha256 };
  const got = await hashRegularFile(file, Number(st.size));
  const settled = BigInt(Date.now()) * 1_000_000n - (st.ctimeNs > st.mtimeNs ? st.ctimeNs : st.mtimeNs) > SETTLE_NS;
  if (got.sha256 === want.sha256 && got.size === Number(st.size) && settled) {
    verified.delete(file);
    if (verified.size >= VERIFIED_MAX) verified.delete(verified.keys().next().value as string);
    verified.set(file, `${identity}:${want.sha256}`);
  } else {
    verified.delete(file);
  }
  return got;
}

/**
 * Digests of every file of a process image folder: CRIU's regular files, and the
 * `parent` link of an incremental image.
 */
export async function hashProcessImage(dir: string): Promise<CheckpointChecksums['images']> {
  const out: CheckpointChecksums['images'] = {};
  for (const name of fs.readdirSync(dir).sort()) out[name] = await hashFile(path.join(dir, name));
  return out;
}

/** The layer's identity and last-change transaction (O(1)). */
export function layerFingerprint(
  native: Pick<NativeBinding, 'subvolumeInfo'>,
  layerDir: string,
): CheckpointChecksums['layer'] {
  const info = native.subvolumeInfo(layerDir);
  return { uuid: info.uuid, ctransid: info.ctransid };
}

/** The recorded checksums of a checkpoint, or null for one taken before they were recorded. */
export function recordedChecksums(ckpt: CheckpointRow): CheckpointChecksums | null {
  return ckpt.checksums ? (JSON.parse(ckpt.checksums) as CheckpointChecksums) : null;
}

/**
 * Throws CheckpointCorruptError, naming the checkpoint and the first file
 * found wrong, unless the checkpoint's layer and process image are exactly
 * what was recorded. The layer is checked first (O(1)); the image is read
 * in full, or found unchanged since this process last read it. A checkpoint
 * taken before checksums were recorded passes (there is nothing to compare
 * with). An incremental image is only as good as the images it takes pages
 * from: they are verified too, down its `parent` links, and a damaged one
 * is named.
 */
export async function verifyCheckpoint(
  engine: Pick<IntegrityDeps, 'catalog' | 'paths' | 'log' | 'native'>,
  ckpt: CheckpointRow,
): Promise<void> {
  await verifyOwnFiles(engine, ckpt);
  let parentId: string | null;
  try {
    parentId = parentOf(engine.paths.processImage(ckpt.id));
  } catch (e) {
    throw new CheckpointCorruptError(ckpt.id, 'process image file parent', (e as Error).message);
  }
  if (parentId === null) return;
  const parent = engine.catalog.checkpoint(parentId);
  if (!parent)
    throw new CheckpointCorruptError(
      ckpt.id,
      'process image file parent',
      `names checkpoint ${parentId}, which is gone`,
    );
  try {
    await verifyCheckpoint(engine, parent);
  } catch (e) {
    if (!(e instanceof CheckpointCorruptError)) throw e;
    const { file, reason } = e.details as { file: string; reason: string };
    const err = new CheckpointCorruptError(ckpt.id, `${file} of checkpoint ${parentId}, whose pages it takes,`, reason);
    Object.assign(err.details, {
      damagedCheckpointId: (e.details as { damagedCheckpointId?: string }).damagedCheckpointId ?? parentId,
    });
    throw err;
  }
}

/** verifyCheckpoint for the checkpoint's own layer and process image files. */
async function verifyOwnFiles(
  engine: Pick<IntegrityDeps, 'paths' | 'log' | 'native'>,
  ckpt: CheckpointRow,
): Promise<void> {
  const recorded = recordedChecksums(ckpt);
  if (!recorded) {
    engine.log.debug({ checkpointId: ckpt.id }, 'checkpoint has no recorded checksums; not verified');
    return;
  }
  const layerDir = engine.paths.layer(ckpt.layer_id);
  let layer: CheckpointChecksums['layer'];
  try {
    layer = layerFingerprint(engine.native, layerDir);
  } catch (e) {
    throw new CheckpointCorruptError(ckpt.id, `layer ${ckpt.layer_id}`, `cannot be read (${(e as Error).message})`);
  }
  if (layer.uuid !== recorded.layer.uuid)
    throw new CheckpointCorruptError(ckpt.id, `layer ${ckpt.layer_id}`, 'was replaced by another subvolume');
  if (layer.ctransid !== recorded.layer.ctransid) {
    throw new CheckpointCorruptError(
      ckpt.id,
      `layer ${ckpt.layer_id}`,
      `was changed after the checkpoint (btrfs transaction ${layer.ctransid}, recorded ${recorded.layer.ctransid})`,
    );
  }
  const dir = engine.paths.processImage(ckpt.id);
  let names: string[];
  try {
    names = await fs.promises.readdir(dir);
  } catch (e) {
    throw new CheckpointCorruptError(ckpt.id, 'the process image folder', `cannot be read (${(e as Error).message})`);
  }
  for (const name of names)
    if (!(name in recorded.images))
      throw new CheckpointCorruptError(ckpt.id, `process image file ${name}`, 'was added after the checkpoint');
  // The files are read side by side (a fork or restore waits for this): a
  // few dozen small files one after the other cost a pool round trip each.
  const verdicts = await Promise.all(
    Object.entries(recorded.images).map(async ([name, want]) => {
      const file = `process image file ${name}`;
      let got: { size: number; sha256: string };
      try {
        got = await checkedDigest(path.join(dir, name), want);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        return new CheckpointCorruptError(
          ckpt.id,
          file,
          code === 'ENOENT' ? 'is missing' : `cannot be read (${code ?? (e as Error).message})`,
        );
      }
      if (got.size !== want.size)
        return new CheckpointCorruptError(ckpt.id, file, `has ${got.size} bytes, ${want.size} were recorded`);
      if (got.sha256 !== want.sha256)
        return new CheckpointCorruptError(ckpt.id, file, 'has other bytes than were recorded (SHA-256 mismatch)');
      return undefined;
    }),
  );
  // The first damaged file in the recorded order, whichever read finished first.
  const damaged = verdicts.find((v) => v !== undefined);
  if (damaged) throw damaged;
}
