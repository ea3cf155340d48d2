// vitest settings for LangGraph's checkpointer conformance suite
// (test/conformance/langgraph.validation.ts, compiled to dist/). The suite
// calls the Jest-style globals (describe, it, beforeAll), hence `globals`.
// Every put is a real sandbox checkpoint, and a loaded 2-CPU machine can
// take seconds for one, so the timeouts are generous.
import { fileURLToPath } from 'node:url';

export default {
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['dist/test/conformance/**/*.validation.js'],
    globals: true,
    testTimeout: 120_000,
    hookTimeout: 600_000,
    fileParallelism: false,
    pool: 'forks',
  },
};
