/** The package's version, read once from its package.json (the one source of truth). */
import { createRequire } from 'node:module';

// Compiled to dist/src/version.js, two levels below the package root.
export const VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;
