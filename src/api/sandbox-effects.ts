/** sandbox.effects: the effect ledger seen from one sandbox. */
import { NotFoundError } from '../errors.js';
import type {
  EffectRecord,
  EffectSpec,
  BeginResult,
  Resolution,
  CompensationResult,
} from '../effects/effect-ledger.js';
import type { JsonValue } from '../effects/idempotency.js';
import type { SandboxCore } from './sandbox-core.js';

/** The effect ledger seen from one sandbox: intents recorded before side effects run. */
export class SandboxEffects {
  constructor(private readonly sandbox: SandboxCore) {}

  private ctx() {
    return this.sandbox.engine.agent.effectContext(this.sandbox.row());
  }
  private get ledger() {
    return this.sandbox.engine.agent.effects;
  }

  /** Records the intent durably; returns the recorded output instead if this effect already committed. */
  begin(spec: EffectSpec): BeginResult {
    return this.ledger.begin(this.ctx(), spec);
  }
  commit(effectId: string, output?: JsonValue): void {
    this.get(effectId); // another sandbox's effect is reported as missing
    this.ledger.commit(effectId, output);
  }
  fail(effectId: string, err: unknown, opts: { definite: boolean }): void {
    this.get(effectId);
    this.ledger.fail(effectId, err, opts);
  }
  /**
   * begin → fn → commit/fail; after a rollback or in a fork, a committed effect
   * returns its recorded output without running fn.
   */
  run<T extends JsonValue | undefined | void>(spec: EffectSpec, fn: () => T | Promise<T>): Promise<T> {
    return this.ledger.run(this.ctx(), spec, fn);
  }
  resolveUnknown(effectId: string, resolution: Resolution): EffectRecord {
    this.get(effectId);
    return this.ledger.resolveUnknown(effectId, resolution);
  }
  /** Runs compensations in reverse order of commit. */
  compensate(
    effectIds: string[],
    runner: (effect: EffectRecord) => Promise<JsonValue | undefined>,
  ): Promise<CompensationResult[]> {
    return this.ledger.compensate(effectIds, runner);
  }
  list(): EffectRecord[] {
    return this.ledger.list(this.sandbox.id);
  }
  get(effectId: string): EffectRecord {
    const e = this.ledger.get(effectId);
    if (!this.list().some((x) => x.id === e.id)) throw new NotFoundError('effect', effectId);
    return e;
  }
}
