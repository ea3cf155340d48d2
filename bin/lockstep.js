#!/usr/bin/env node
// The `lockstep` command; the code lives in dist/src/cli/main.js (built by `npm run setup`).
import { main } from '../dist/src/cli/main.js';

process.exitCode = await main(process.argv.slice(2));
