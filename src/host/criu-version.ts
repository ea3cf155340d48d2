/**
 * The CRIU release Lockstep is provisioned with and tested on. It is named in
 * one place, package.json's "lockstep.criuVersion": the doctor and setup
 * read it here, and `npm run check:docs` holds the docs to it.
 */
import { createRequire } from 'node:module';

// Compiled to dist/src/host/criu-version.js, three levels below the package root.
const pkg = createRequire(import.meta.url)('../../../package.json') as { lockstep: { criuVersion: string } };

/** "4.2.1". */
export const CRIU_TESTED_VERSION: string = pkg.lockstep.criuVersion;

/** The tested version as CRIU's RPC reports versions (4.2.1 → 40201). */
export const CRIU_TESTED_VERSION_NUMBER: number = (() => {
  const [major = 0, minor = 0, patch = 0] = CRIU_TESTED_VERSION.split('.').map(Number);
  return major * 10000 + minor * 100 + patch;
})();
