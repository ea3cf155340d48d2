#!/usr/bin/env node
// The command list of docs/cli.md, rendered from the CLI's table of commands
// (src/cli/command-table.ts), so that the doc cannot drift from the flags the
// commands take (issue 26, the CLI part). `npm run docs:cli` compiles and
// rewrites the list between the markers (CLI_DOC_BEGIN, CLI_DOC_END);
// test/unit/cli-table.test.ts fails when docs/cli.md holds anything else
// there. `lockstep help` and each command's usage error come from the same
// table.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const DOC = path.join(root, 'docs/cli.md');
const compiled = path.join(root, 'dist/src/cli/command-table.js');
if (!fs.existsSync(compiled)) throw new Error(`${compiled} is missing: compile first (npx tsc -p tsconfig.json)`);
const { CLI_DOC_BEGIN, cliDocGenerated, cliDocSection, commandEntries } = await import(compiled);

const before = fs.readFileSync(DOC, 'utf8');
const old = cliDocGenerated(before);
const start = before.indexOf(CLI_DOC_BEGIN) + CLI_DOC_BEGIN.length + 1;
const after = before.slice(0, start) + cliDocSection() + before.slice(start + old.length);
if (after === before) console.log(`${path.relative(root, DOC)}: up to date`);
else {
  fs.writeFileSync(DOC, after);
  console.log(`${path.relative(root, DOC)}: command list rewritten (${commandEntries().length} commands)`);
}
