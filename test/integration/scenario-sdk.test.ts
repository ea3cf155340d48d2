/** The shared client scenario, through the in-process SDK. */
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { scenarioTests, type ScenarioSandbox } from '../helpers/scenario.js';

integration(test, () => {
  scenarioTests(test, 'in-process SDK', async (t) => {
    const ls = await openTestLockstep(t);
    return {
      create: async (opts) => (await ls.create(opts)) as unknown as ScenarioSandbox,
      connect: async (id) => ls.get(id) as unknown as ScenarioSandbox,
      list: async (metadata) =>
        ls
          .list()
          .filter((s) => Object.entries(metadata).every(([k, v]) => s.metadata[k] === v))
          .map((s) => s.id),
    };
  });
});
