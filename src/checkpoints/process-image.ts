/**
 * A checkpoint's process image, restored into a new instance of a sandbox
 * (forks, starts from a snapshot, warm standbys) through the one
 * instance-restore (src/instances/restore.ts), and the size of an image.
 */
import fs from 'node:fs';
import path from 'node:path';
import { prepareRestoredNetwork } from '../network/sandbox-network.js';
import type { CheckpointRow, SandboxRow } from '../catalog/catalog.js';
import { limitsOf } from '../lifecycle/create.js';
import { restoreInstance, type RestoreDeps } from '../instances/restore.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { CreateDeps } from '../lifecycle/create.js';

/** What process-image.ts uses of the manager's services (api/engine.ts builds them). */
export interface ProcessImageDeps extends SandboxNetworkDeps, CreateDeps, RestoreDeps {}

/**
 * Total bytes of a process image folder (CRIU writes a few dozen files); the
 * parent link counts as itself, not as the parent.
 */
export function processImageBytes(dir: string): number {
  let total = 0;
  for (const f of fs.readdirSync(dir)) total += fs.lstatSync(path.join(dir, f)).size;
  return total;
}

/**
 * A new instance of a sandbox restored from a checkpoint; `step` marks the
 * points the crash tests stop at. Returns the restored root's host pid; on
 * failure the caller removes the instance.
 */
export async function restoreNewInstance(
  engine: ProcessImageDeps,
  key: string,
  like: SandboxRow,
  ckpt: CheckpointRow,
  step: (point: 'prepared' | 'layer-ready') => void = () => undefined,
  /** Host id range the checkpoint's files are in, when its sandbox's row does not say (a snapshot outlives it). */
  sourceIdBase?: number | null,
  opts: { standby?: boolean } = {},
): Promise<number> {
  // A fork has a user namespace (id range) of its own: see id-shift.ts.
  const from = sourceIdBase !== undefined ? sourceIdBase : (engine.catalog.sandbox(ckpt.sandbox_id)?.id_base ?? null);
  return restoreInstance(
    engine,
    {
      host: {
        id: key,
        imageRootfs: engine.catalog.liveImageOrHidden(ckpt.image).rootfs,
        runtimeLayer: ckpt.runtime_layer,
        hostname: like.hostname,
        diskBytes: like.disk_bytes,
        idBase: like.id_base,
      },
      limits: limitsOf(like),
      layerId: ckpt.layer_id,
      processImage: engine.paths.processImage(ckpt.id),
      fromIdBase: from,
    },
    {
      inPlace: false,
      armTracking: opts.standby ?? false,
      network: () => prepareRestoredNetwork(engine, key, like, { standby: opts.standby ?? false }),
      at: (point) => {
        if (point === 'prepared') step('prepared');
        else if (point === 'mounted') step('layer-ready');
      },
    },
  );
}
