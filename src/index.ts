/** Public API of Lockstep. */
export { Lockstep, type OpenOptions } from './api/lockstep.js';
export { Tenants } from './api/tenants.js';
export type { Tenant, TenantQuotas } from './tenants/tenants.js';
export type { TenantUsage } from './tenants/quotas.js';
export type { PurgeReport } from './tenants/purge.js';
export type { StoredReplies, StoredReply, StoredResponse } from './tenants/replies.js';
export { Sandbox, type SandboxInfo, type ForkOptions } from './api/sandbox.js';
export { SandboxCommands, CommandHandle, type ObservedRunResult } from './api/sandbox-commands.js';
export { SandboxPty, PtyHandle } from './api/sandbox-pty.js';
export { ObservedFiles } from './api/observed-files.js';
export { SandboxEffects } from './api/sandbox-effects.js';
export { SandboxVerdicts } from './api/sandbox-verdicts.js';
export { SandboxPorts } from './api/sandbox-ports.js';
export type { Provenance } from './api/sandbox-core.js';
export type { CreateOptions } from './lifecycle/create.js';
export type { ExposedPort, ExposureInfo, ExposureCredentials } from './network/exposed-ports.js';
export type { RunOptions, RunResult, SpawnOptions } from './instances/commands.js';
export type { PtyCreateOptions, PtyOutput, PtyExit } from './api/sandbox-pty.js';
export type { BackgroundOptions } from './api/sandbox-commands.js';
export { MAX_PENDING_INPUT_BYTES } from './instances/relay.js';
export {
  PathEscapeError,
  FileNotFoundError,
  FileTypeNotSupportedError,
  FileBusyError,
  FileTooLargeError,
  type FileEntry,
  type FileReadStream,
  type WriteOptions,
  type WriteResult,
} from './instances/files.js';
export type { CheckpointInfo, CheckpointOptions, CheckpointTimings } from './checkpoints/checkpoint.js';
export type { RollbackReport, RollbackTimings } from './checkpoints/rollback.js';
export type { ForkResult } from './checkpoints/fork.js';
export type { AgentRollbackReport, RollbackAgentOptions } from './agent-state/agent-state.js';
export {
  CONTEXT_FORMATS,
  validateContext,
  appendRecoveryNote,
  type AgentContext,
  type ContextFormat,
} from './context/formats.js';
export type { RecoverySummary } from './context/recovery.js';
export {
  EffectOutcomeUnknownError,
  IrreversibleEffectError,
  type EffectRecord,
  type EffectSpec,
  type BeginResult,
  type Reversibility,
  type EffectStatus,
  type RollbackPolicy,
  type RollbackWarning,
} from './effects/effect-ledger.js';
export type { Observation, ObservationKind } from './provenance/observations.js';
export type { Verdict, StaleVerdict } from './provenance/verdicts.js';
export * from './errors.js';
// The snapshot store. Its S3 backend is reached through openSnapshotStore, which loads
// the AWS SDK only when an s3:// store is opened, so importing 'lockstep' stays light.
export { openSnapshotStore } from './snapshots/open-store.js';
export { DirSnapshotStore } from './snapshots/dir-store.js';
export {
  BundleCorruptError,
  StoreUnavailableError,
  TransferAbortedError,
  type BundleStat,
  type GetOptions,
  type PutOptions,
  type PutProgress,
  type PutResult,
  type SnapshotStore,
} from './snapshots/store.js';
export { resolveStoreConfig, type SnapshotStoreConfig, type SnapshotStoreOptions } from './config.js';
export { Snapshots, type PullResult, type StorePullResult } from './api/snapshots.js';
export type { PushOptions, PushReport, StorePullOptions, TransferProgress } from './snapshots/transfer.js';
export { BundleUntrustedError } from './snapshots/signing.js';
export type { SnapshotInfo } from './snapshots/snapshot-rows.js';
export type { SnapshotOptions } from './snapshots/snapshots.js';
export type { ImportOptions } from './snapshots/import.js';
export type { PullOptions, PullReport } from './snapshots/pull.js';
