/**
 * Releasing files that checkpoints and snapshots share: a layer or a
 * process image folder goes once no row holds it. Who holds what is the
 * catalog's `holds` table, kept by triggers on the rows that hold
 * (src/catalog/schema/instances.ts). Callers run this after the rows are gone.
 */
import fs from 'node:fs';
import { imageChain } from './snapshot-rows.js';
import type { Catalog, HolderKind } from '../catalog/catalog.js';
import type { LayerPort } from '../ports.js';
import type { StatePaths } from '../paths.js';

/** What holders.ts uses of the manager's services (api/engine.ts builds them). */
export interface HoldersDeps {
  catalog: Catalog;
  layers: LayerPort;
  paths: StatePaths;
}

/** True while a row (a checkpoint, a snapshot) holds the layer. */
export function layerHeld(engine: Pick<HoldersDeps, 'catalog'>, layerId: string): boolean {
  return engine.catalog.isHeld('layer', layerId);
}

/**
 * Process image folders some row (of one kind, if given) holds, plus the
 * folders the parent links of snapshot-held ones lead to: a snapshot's image
 * may be a page delta on an earlier checkpoint's (a checkpoint's own image
 * is flattened before its parent goes, src/checkpoints/page-store.ts, so
 * only snapshots hold chains).
 */
export function processImagesHeld(
  engine: Pick<HoldersDeps, 'catalog' | 'paths'>,
  holderKind?: HolderKind,
): Set<string> {
  const held = engine.catalog.heldIds('process-image', holderKind);
  for (const dir of engine.catalog.heldIds('process-image', 'snapshot'))
    for (const linked of imageChain(engine.paths, dir)) held.add(linked);
  return held;
}

/**
 * Removes the files of a layer and image folders that nothing holds any
 * more. Called after the rows that held them are gone (checkpoint and
 * sandbox deletion call it too, through releaseCheckpointFiles).
 */
export async function releaseFiles(engine: HoldersDeps, layerId: string, imageDirs: string[]): Promise<void> {
  if (!layerHeld(engine, layerId)) await engine.layers.deleteLayer(layerId);
  const held = processImagesHeld(engine);
  for (const dir of imageDirs) {
    if (held.has(dir)) continue;
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
