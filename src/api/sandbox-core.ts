/** The engine-facing core every sub-API of a sandbox shares, and the provenance options of observed calls. */
import type { SandboxRow, CheckpointRow } from '../catalog/catalog.js';
import { InvalidArgumentError, InvalidStateError } from '../errors.js';
import type { Engine } from './engine.js';
import { SandboxFiles } from '../instances/files.js';

/** Options every observed call takes: the agent's tool-call id, for provenance. */
export interface Provenance {
  toolCallId?: string | undefined;
  /** false: do not record an observation (the platform's own inspection, not the agent's). Default true. */
  observe?: boolean | undefined;
}

export function validateToolCallId(id: unknown): string | undefined {
  if (id === undefined) return undefined;
  if (typeof id !== 'string' || id.length === 0 || id.length > 200)
    throw new InvalidArgumentError('toolCallId', 'a string of 1-200 characters', id);
  return id;
}

/** The engine-facing core shared by the public Sandbox handle. */
export class SandboxCore {
  constructor(
    readonly engine: Engine,
    readonly id: string,
  ) {}

  row(): SandboxRow {
    return this.engine.catalog.requireSandbox(this.id);
  }

  /**
   * The row, checked to be running with its init alive: the process with the
   * row's pid and start time (a bare pid may belong to a host process by now).
   * The init is watched from here on, so its exit marks the sandbox stopped.
   */
  runningRow(): SandboxRow {
    const row = this.row();
    if (row.state !== 'running' || row.init_pid === null || row.init_start === null || !this.engine.inits.track(row)) {
      throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${this.id} is not running (state: ${row.state})`, {
        sandboxId: this.id,
      });
    }
    return row;
  }

  enterTarget(row: SandboxRow = this.runningRow()) {
    return {
      sandboxId: row.id,
      initPid: row.init_pid!,
      initStart: row.init_start!,
      cgroupProcs: this.engine.cgroups.procsFiles(this.engine.runtime.cgroupName(row.instance)),
      baseEnv: JSON.parse(row.env) as Record<string, string>,
    };
  }

  checkpoints(): CheckpointRow[] {
    return this.engine.catalog.checkpointsOf(this.id);
  }

  files(): SandboxFiles {
    return new SandboxFiles(
      this.engine.native,
      () => this.engine.paths.sandboxRoot(this.runningRow().instance),
      () => this.runningRow().id_base,
    );
  }
}
