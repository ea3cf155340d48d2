/**
 * LangGraph's own conformance suite for checkpointers
 * (`@langchain/langgraph-checkpoint-validation`) against `LockstepSaver`
 * on real sandboxes: every checkpointer the suite creates is a saver over a
 * fresh sandbox of its own (so the suite's isolation rule holds), and every
 * `put` is a real Lockstep checkpoint (freeze, layer snapshot, CRIU dump).
 *
 * This is a vitest file (the suite is written for a Jest-like runner), run
 * by `test/integration/langgraph-validation.test.ts` with
 * `test/conformance/vitest.config.mjs`; it is outside ava's glob.
 */
import { validate } from '@langchain/langgraph-checkpoint-validation';
import { Lockstep, type Sandbox } from '../../src/index.js';
import { LockstepSaver } from '../../src/integrations/langgraph.js';
import { destroyHome, freshHome } from '../helpers/harness.js';

let lockstep: Lockstep | undefined;
let home: string | undefined;
const sandboxOf = new WeakMap<LockstepSaver, Sandbox>();

validate<LockstepSaver>({
  checkpointerName: 'LockstepSaver',
  beforeAllTimeout: 600_000,
  async beforeAll() {
    home = freshHome('langgraph-validation');
    // No warm standby: the suite takes hundreds of checkpoints and never rolls back to most of them.
    lockstep = await Lockstep.open({ home, config: { standby: false } });
    await lockstep.images.ensure('base');
  },
  async afterAll() {
    await lockstep?.close();
    if (home) await destroyHome(home);
  },
  async createCheckpointer() {
    const sandbox = await lockstep!.create({ image: 'base', memoryMb: 64 });
    const saver = new LockstepSaver({ sandbox });
    sandboxOf.set(saver, sandbox);
    return saver;
  },
  async destroyCheckpointer(saver) {
    await sandboxOf.get(saver)?.kill();
  },
});
