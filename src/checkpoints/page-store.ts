/**
 * Policy for incremental process images (the format work is page-delta.ts):
 * which image a new checkpoint is compared with, and what deleting a
 * checkpoint must do first.
 *
 * A checkpoint is compared with its sandbox's head checkpoint, the one its
 * processes most recently came from or were saved as, so unchanged memory
 * is found there. Images only ever link to checkpoints of the same sandbox:
 * removing a sandbox removes all of them together, and a fork restores from
 * its parent's chain once, at creation, and keeps nothing of it.
 */
import fs from 'node:fs';
import { hashProcessImage, recordedChecksums } from './integrity.js';
import { shareProcessImageWith } from '../instances/id-shift.js';
import type { Logger } from '../log.js';
import type { SandboxRow, Catalog } from '../catalog/catalog.js';
import { SnapshotRows } from '../snapshots/snapshot-rows.js';
import { flattenOnto, parentOf, storeChangedPages, type DeltaStats } from './page-delta.js';
import type { LockstepConfig } from '../config.js';
import type { StatePaths } from '../paths.js';

/** What page-store.ts uses of the manager's services (api/engine.ts builds them). */
export interface PageStoreDeps {
  catalog: Catalog;
  config: LockstepConfig;
  paths: StatePaths;
}

/**
 * Rewrites a fresh dump to keep only the pages that differ from the head
 * checkpoint's image (opt-in, LOCKSTEP_PAGE_DELTA=on; by default every
 * image is whole).
 */
export async function keepChangedPagesOnly(
  engine: PageStoreDeps,
  row: SandboxRow,
  imagesDir: string,
  log: Pick<Logger, 'warn' | 'debug'>,
): Promise<DeltaStats | null> {
  if (!row.head_checkpoint_id || !engine.config.pageDelta) return null;
  // A tracked dump (checkpoint.ts) already stored only what was written.
  if (parentOf(imagesDir) !== null) return null;
  // With a user namespace too: the parent is the same sandbox's, in the same id
  // range; a fork into another range copies the whole chain (processImageForRange).
  const stats = await storeChangedPages(imagesDir, engine.paths.processImage(row.head_checkpoint_id), (err) =>
    log.warn(
      { err, parentId: row.head_checkpoint_id },
      'parent process image unusable; this checkpoint keeps its memory whole',
    ),
  );
  log.debug({ ...stats }, 'process image stored as a delta');
  return stats;
}

/**
 * Makes every image of the sandbox that links to `checkpointId` stand
 * without it (its pages copied in, the link moved to the grandparent). Run
 * before the checkpoint's record is deleted; each step is crash-safe.
 */
export async function detachImagesFrom(engine: PageStoreDeps, sandboxId: string, checkpointId: string): Promise<void> {
  for (const c of engine.catalog.checkpointsOf(sandboxId)) {
    const dir = engine.paths.processImage(c.id);
    if (c.id === checkpointId || !fs.existsSync(dir)) continue;
    if (!(await flattenOnto(dir, checkpointId))) continue;
    // The pages files it wrote are host root's: the sandbox's root reads them at restore too.
    shareProcessImageWith(dir, engine.catalog.sandbox(sandboxId)?.id_base ?? null);
    // Its pages and link changed on purpose: record them again. A crash between the
    // flatten and this update leaves old checksums, so that image is refused as
    // CHECKPOINT_CORRUPT (nothing restores from unverified bytes), not misread.
    const recorded = recordedChecksums(c);
    const images = await hashProcessImage(dir);
    if (recorded) engine.catalog.setCheckpointChecksums(c.id, JSON.stringify({ ...recorded, images }));
    // A snapshot of that checkpoint shares the folder: its record follows too.
    new SnapshotRows(engine.catalog.db).setChecksums(c.id, (old) => JSON.stringify({ ...JSON.parse(old), images }));
  }
}
