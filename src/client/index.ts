/**
 * `lockstep/client`: the HTTP API from any machine, with the in-process
 * SDK's shape and typed errors. Needs only Node (fetch), no native addon.
 *
 *   import { Sandbox } from 'lockstep/client';
 *   const sbx = await Sandbox.create({ apiUrl, apiKey });
 */
export {
  Sandbox,
  RemoteCommands,
  RemoteCommandHandle,
  RemoteFiles,
  RemoteEffects,
  RemoteVerdicts,
  RemotePorts,
  type RemoteSandboxInfo,
  type RemoteCreateOptions,
  type RemoteRunOptions,
  type RemoteRollbackReport,
  type KillSignal,
  type RemoteReadStream,
} from './sandbox.js';
export { RemotePty, RemotePtyHandle, type RemotePtyCreateOptions } from './pty.js';
export type { PtyExit, PtyOutput } from '../api/sandbox-pty.js';
export { Images, type ImageInfo } from './images.js';
export { Tenant, type RemoteTenantInfo } from './tenant.js';
export { Snapshots, type RemotePullResult, type RemoteStorePullResult } from './snapshots.js';
export type { SnapshotInfo } from '../snapshots/snapshot-rows.js';
export { ConnectionError, RequestAbortedError, errorFromWire, type WireError } from '../errors-from-wire.js';
export { DEFAULT_API_URL, type ConnectionOptions, type CallOptions } from './transport.js';
export {
  LockstepError,
  InvalidArgumentError,
  NotFoundError,
  InvalidStateError,
  CommandAbortedError,
} from '../errors.js';
export type { ObservedRunResult } from '../api/sandbox-commands.js';
export type { ExposedPort, ExposureInfo } from '../network/exposed-ports.js';
export type { CheckpointInfo } from '../checkpoints/checkpoint.js';
export type { RemoteForkResult } from './fork-results.js';
export type { EffectRecord, EffectSpec, BeginResult } from '../effects/effect-ledger.js';
