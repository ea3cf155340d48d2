/**
 * Verb: remove a sandbox and everything it owns (processes, mounts, layers,
 * checkpoints with their context snapshots, cgroup). The one teardown path:
 * `rm`, expiry, destroyAll and the reaper (for sandboxes left "creating" or
 * "removing" by a crash) all come here, so none of them leaks agent state.
 * Safe to repeat after a failure at any step.
 */
import fs from 'node:fs';
import { processImagesHeld } from '../snapshots/holders.js';
import { forgetNetwork } from '../network/sandbox-network.js';
import { forgetStandbyChances } from '../checkpoints/standby-policy.js';
import type { SandboxNetworkDeps } from '../network/sandbox-network.js';
import type { StandbyPolicyDeps } from '../checkpoints/standby-policy.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { ExposedPorts } from '../network/exposed-ports.js';
import type { FaultHook } from '../faults.js';
import type { ImageStore } from '../images/image-store.js';
import type { InitWatcher } from '../instances/init-watcher.js';
import type { LayerPort } from '../ports.js';
import type { SandboxRuntime } from '../instances/runtime.js';
import type { StatePaths } from '../paths.js';

/** What remove.ts uses of the manager's services (api/engine.ts builds them). */
export interface RemoveDeps extends SandboxNetworkDeps, StandbyPolicyDeps {
  agent: AgentState;
  exposures: ExposedPorts;
  fault: FaultHook;
  images: ImageStore;
  inits: InitWatcher;
  layers: LayerPort;
  paths: StatePaths;
  runtime: SandboxRuntime;
}

export async function removeSandbox(engine: RemoveDeps, id: string): Promise<void> {
  const { catalog } = engine;
  // Hidden first, so no other call starts on it; the reaper finishes the job after a crash.
  catalog.updateSandbox(id, { state: 'removing' }); // closes its exposed ports
  engine.exposures.dropSandbox(id);
  engine.inits.untrack(id); // its init is about to be killed on purpose
  forgetStandbyChances(engine, id);
  engine.fault('remove:marked');
  const row = catalog.sandbox(id);
  await engine.runtime.destroy(row?.instance ?? id);
  const standby = catalog.standby(id);
  if (standby) await engine.runtime.destroy(standby.instance);
  // A snapshot of one of its checkpoints keeps that checkpoint's layer and image (and the images they link to).
  const own = new Set(catalog.checkpointsOf(id).map((c) => c.id));
  const heldElsewhere = (layerId: string) =>
    catalog.holders('layer', layerId).some((h) => !(h.holder_kind === 'checkpoint' && own.has(h.holder_id)));
  const heldImages = processImagesHeld(engine, 'snapshot');
  if (row) await forgetNetwork(engine, row);
  for (const ckpt of catalog.checkpointsOf(id)) {
    if (!heldElsewhere(ckpt.layer_id)) await engine.layers.deleteLayer(ckpt.layer_id);
    // On libuv's pool: a process image holds files per process, a count the sandbox sets.
    if (!heldImages.has(ckpt.id))
      await fs.promises.rm(engine.paths.processImage(ckpt.id), { recursive: true, force: true });
  }
  catalog.tx(() => {
    for (const ckpt of catalog.checkpointsOf(id)) {
      engine.agent.onCheckpointDeleted(ckpt);
      catalog.deleteCheckpointRow(ckpt.id);
      catalog.deleteLayerRow(ckpt.layer_id);
    }
    catalog.deleteLayerRow(`upper_${id}`);
    catalog.deleteSandboxRow(id);
  });
  fs.rmSync(engine.paths.sandboxLock(id), { force: true });
  engine.images.collectGarbage();
}
