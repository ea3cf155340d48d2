/** The shared client scenario, through `lockstep/client` against a real server on loopback. */
import test from 'ava';
import { Sandbox } from '../../src/client/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';
import { scenarioTests, type ScenarioSandbox } from '../helpers/scenario.js';

integration(test, () => {
  scenarioTests(test, 'lockstep/client', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const conn = { apiUrl: client.base, apiKey: tenantToken(ls, 'scenario') };
    return {
      create: async (opts) => (await Sandbox.create({ ...conn, ...opts })) as unknown as ScenarioSandbox,
      connect: async (id) => (await Sandbox.connect(id, conn)) as unknown as ScenarioSandbox,
      list: async (metadata) => (await Sandbox.list({ ...conn, metadata })).map((s) => s.id),
    };
  });
});
