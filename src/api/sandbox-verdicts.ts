/** sandbox.verdicts: verdicts about files, bound to their content hash. */
import { InvalidArgumentError } from '../errors.js';
import { SandboxFiles } from '../instances/files.js';
import type { Verdict, StaleVerdict } from '../provenance/verdicts.js';
import { validateToolCallId, type Provenance, type SandboxCore } from './sandbox-core.js';

/** Verdicts a caller records about files ("the scan passed"), bound to the file's content hash. */
export class SandboxVerdicts {
  constructor(
    private readonly sandbox: SandboxCore,
    private readonly files: SandboxFiles,
  ) {}

  /** Records a verdict about a file as it is now. */
  async record(input: { path: string; verdict: string } & Provenance): Promise<Verdict> {
    if (typeof input.verdict !== 'string' || !input.verdict || input.verdict.length > 500)
      throw new InvalidArgumentError('verdict', 'a string of 1-500 characters', input.verdict);
    const row = this.sandbox.row();
    const hash = await this.files.verdictHash(input.path);
    if (hash === null) throw new InvalidArgumentError('path', 'an existing file in the sandbox', input.path);
    const toolCallId = validateToolCallId(input.toolCallId);
    return this.sandbox.engine.agent.verdicts.record({
      sandboxId: row.id,
      branchId: row.branch_id,
      path: input.path,
      contentHash: hash,
      verdict: input.verdict,
      ...(toolCallId ? { toolCallId } : {}),
    });
  }

  list(): Verdict[] {
    return this.sandbox.engine.agent.verdicts.list(this.sandbox.id);
  }

  /** Verdicts whose file no longer has the content they were made on. */
  async stale(): Promise<StaleVerdict[]> {
    const hashes = new Map<string, string | null>();
    for (const p of this.sandbox.engine.agent.verdictPaths(this.sandbox.id))
      hashes.set(p, await this.files.verdictHash(p).catch(() => null));
    return this.sandbox.engine.agent.verdicts.staleVerdicts(this.sandbox.id, (p) => hashes.get(p) ?? null);
  }
}
