/** Public API of Lockstep. */
export { Lockstep, type OpenOptions } from './lockstep.js';
export { Sandbox, type SandboxInfo } from './sandboxes/sandbox.js';
export type { CreateOptions } from './sandboxes/create.js';
export type { RunOptions, RunResult, SpawnOptions } from './sandboxes/commands.js';
export type { FileEntry } from './sandboxes/files.js';
export * from './errors.js';
