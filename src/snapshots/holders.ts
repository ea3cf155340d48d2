/**
 * Releasing files a checkpoint and snapshots share: a layer or an image
 * folder goes once no checkpoint row and no snapshot row holds it (see
 * snapshot-rows.ts). Callers run this after the rows are gone.
 */
import fs from 'node:fs';
import { SnapshotRows } from './snapshot-rows.js';
import type { Catalog } from '../catalog/catalog.js';
import type { LayerPort } from '../ports.js';
import type { StatePaths } from '../paths.js';

/** What holders.ts uses of the manager's services (api/engine.ts builds them). */
export interface HoldersDeps {
  catalog: Catalog;
  layers: LayerPort;
  paths: StatePaths;
}

/** True while a checkpoint row or a snapshot row (other than `except`) names the layer. */
export function layerHeld(engine: HoldersDeps, layerId: string, except?: string): boolean {
  const db = engine.catalog.db;
  if (db.prepare('SELECT 1 FROM checkpoints WHERE layer_id = ? LIMIT 1').get(layerId)) return true;
  return !!db.prepare('SELECT 1 FROM snapshots WHERE layer_id = ? AND id != ? LIMIT 1').get(layerId, except ?? '');
}

/**
 * Removes the files of a layer and image folders that nothing holds any
 * more. Called after the rows that held them are gone (checkpoint and
 * sandbox deletion call it too, through releaseCheckpointFiles).
 */
export async function releaseFiles(engine: HoldersDeps, layerId: string, imageDirs: string[]): Promise<void> {
  if (!layerHeld(engine, layerId)) await engine.layers.deleteLayer(layerId);
  const heldImages = new SnapshotRows(engine.catalog.db).heldImages(engine.paths);
  for (const dir of imageDirs) {
    if (heldImages.has(dir) || engine.catalog.checkpoint(dir)) continue;
    fs.rmSync(engine.paths.processImage(dir), { recursive: true, force: true });
  }
}

/** A checkpoint's row is gone: its layer and image go too, unless a snapshot still holds them. */
export async function releaseCheckpointFiles(
  engine: HoldersDeps,
  layerId: string,
  checkpointId: string,
): Promise<void> {
  await releaseFiles(engine, layerId, [checkpointId]);
}
