/** Public API of Lockstep. */
export { Lockstep, type OpenOptions } from './lockstep.js';
export {
  Sandbox,
  SandboxCommands,
  CommandHandle,
  ObservedFiles,
  SandboxEffects,
  SandboxVerdicts,
  type SandboxInfo,
  type ForkOptions,
  type Provenance,
  type ObservedRunResult,
} from './sandboxes/sandbox.js';
export type { CreateOptions } from './sandboxes/create.js';
export type { RunOptions, RunResult, SpawnOptions } from './sandboxes/commands.js';
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
} from './sandboxes/files.js';
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
export { Snapshots, type PullResult } from './snapshots/snapshots-api.js';
export type { SnapshotInfo } from './snapshots/snapshot-rows.js';
export type { SnapshotOptions } from './snapshots/snapshots.js';
export type { ImportOptions } from './snapshots/import.js';
export type { PullOptions, PullReport } from './snapshots/pull.js';
