/**
 * The instance a sandbox row describes, as the runtime mounts and starts it:
 * the image's root, the runtime layer, hostname, disk limit and id range.
 */
import type { Catalog, SandboxRow } from '../catalog/catalog.js';
import type { SandboxHost } from '../instances/runtime.js';

export interface InstanceHostDeps {
  catalog: Pick<Catalog, 'liveImageOrHidden'>;
}

export function hostOf(engine: InstanceHostDeps, row: SandboxRow): SandboxHost {
  return {
    id: row.instance,
    imageRootfs: engine.catalog.liveImageOrHidden(row.image).rootfs,
    runtimeLayer: row.runtime_layer,
    hostname: row.hostname,
    diskBytes: row.disk_bytes,
    idBase: row.id_base,
  };
}
