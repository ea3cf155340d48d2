/**
 * The CLI's one table of commands (src/cli/command-table.ts) against what a
 * user sees: every `--flag` of a synopsis is an option its command parses
 * and every option is in its synopsis, `lockstep --help` lists every command
 * once, a command's usage error is its synopsis, and docs/cli.md's command
 * list is what `npm run docs:cli` renders. The CLI runs in-process
 * (main()), only with arguments it refuses before it opens a state
 * directory.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import {
  CLI_DOC_BEGIN,
  CLI_DOC_END,
  cliDocGenerated,
  cliDocSection,
  commandEntries,
  synopses,
  usageOf,
  type CommandSpec,
} from '../../src/cli/command-table.js';
import { main } from '../../src/cli/main.js';
import { EXIT } from '../../src/cli/output.js';
import { agentCommands } from '../../src/cli/agent-commands.js';
import { portCommands } from '../../src/cli/port-commands.js';
import { serverCommands } from '../../src/cli/server-commands.js';
import { setupCommands } from '../../src/cli/setup-command.js';
import { snapshotCommands } from '../../src/cli/snapshot-commands.js';
import { storeCommands } from '../../src/cli/store-commands.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

// A state directory that cannot be made (its parent is a file): a command this
// file runs by mistake fails instead of making sandboxes in the real one.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-cli-table-'));
fs.writeFileSync(path.join(scratch, 'file'), '');
process.env.LOCKSTEP_HOME = path.join(scratch, 'file', 'home');
test.after.always(() => fs.rmSync(scratch, { recursive: true, force: true }));

/** The `--flags` a synopsis names after the command's name, as written (`--irreversible|--compensable` names two). */
function flagsOf(name: string, synopsis: string): string[] {
  return [...synopsis.slice(name.length).matchAll(/(?<![\w-])--([a-z][a-z0-9-]*)/g)].map((m) => m[1]!);
}

/**
 * The positional arguments a synopsis requires: its words after the command's
 * name, outside [brackets], not a flag or a flag's VALUE, and before `--`,
 * `<` or `>` (the command after `--`, redirections).
 */
function requiredPositionals(name: string, synopsis: string): string[] {
  let rest = synopsis.slice(name.length);
  for (let prev = ''; prev !== rest;) [prev, rest] = [rest, rest.replace(/\[[^[\]]*\]/g, '')];
  const out: string[] = [];
  const words = rest.split(/\s+/).filter(Boolean);
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    if (w === '--' || w === '<' || w === '>') break;
    if (w.startsWith('--')) {
      if (/^[A-Z]/.test(words[i + 1] ?? '')) i++;
      continue;
    }
    if (/[A-Z]/.test(w) && !w.includes('...')) out.push(w); // not the "..." of a repeatable [--flag X]...
  }
  return out;
}

/** Runs the CLI in-process with its stdout and stderr captured. */
async function run(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const ow = process.stdout.write;
  const ew = process.stderr.write;
  process.stdout.write = ((s: string) => (out.push(String(s)), true)) as typeof process.stdout.write;
  process.stderr.write = ((s: string) => (err.push(String(s)), true)) as typeof process.stderr.write;
  try {
    const code = await main(argv);
    return { code, stdout: out.join(''), stderr: err.join('') };
  } finally {
    process.stdout.write = ow;
    process.stderr.write = ew;
  }
}

const entries: [string, CommandSpec][] = commandEntries();

test('every command of the CLI files has entries in the table', (t) => {
  const words = new Set(entries.map(([name]) => name.split(' ')[0]));
  for (const handlers of [agentCommands, portCommands, serverCommands, setupCommands, snapshotCommands, storeCommands])
    for (const word of Object.keys(handlers)) t.true(words.has(word), word);
});

test('the table has every command the CLI dispatches, and names each once', (t) => {
  const names = entries.map(([name]) => name);
  t.is(new Set(names).size, names.length);
  for (const name of ['create', 'checkpoint', 'effect commit', 'image build', 'snapshot pull', 'store gc', 'serve'])
    t.true(names.includes(name), name);
  for (const [name, spec] of entries)
    for (const s of synopses(spec)) t.true(s === name || s.startsWith(`${name} `), `${name}: ${s}`);
});

for (const [name, spec] of entries) {
  test(`${name}: every --flag of its synopsis is an option, and every option is in its synopsis`, (t) => {
    const named = new Set(synopses(spec).flatMap((s) => flagsOf(name, s)));
    const keys = Object.keys(spec.options);
    t.deepEqual(
      [...named].filter((f) => !keys.includes(f)),
      [],
      'flags of the synopsis that the command does not parse',
    );
    t.deepEqual(
      keys.filter((k) => !named.has(k)),
      [],
      'options the synopsis does not show',
    );
    for (const s of synopses(spec)) t.false(/\s{2}/.test(s), `no double space in "${s}" (help's column gap)`);
  });
}

test.serial('lockstep --help lists every form of every command exactly once', async (t) => {
  const r = await run('--help');
  t.is(r.code, EXIT.ok);
  t.is(r.stderr, '');
  const lines = r.stdout.split('\n');
  for (const [name, spec] of entries)
    for (const s of synopses(spec)) {
      const hits = lines.filter((l) => l === `  ${s}` || l.startsWith(`  ${s}  `));
      t.is(hits.length, 1, `${name}: "${s}"`);
    }
  // The groups, in the order they have always had.
  const headings = lines
    .filter((l, i) => /^[a-z]/.test(l) && lines[i + 1]?.startsWith('  '))
    .map((l) => l.split(' ')[0]);
  t.deepEqual(headings, [
    'sandboxes',
    'checkpoints',
    'snapshots',
    'exposed',
    'effects',
    'images',
    'host',
    'setup',
    'server',
    'snapshot',
  ]);
  t.true(r.stdout.includes('\nExit codes: 0 ok, 1 failure, 2 bad usage or input'));
});

for (const [name, spec] of entries) {
  test.serial(`${name}: an unknown flag prints its table synopsis as the usage`, async (t) => {
    const r = await run(...name.split(' '), '--no-such-flag');
    t.is(r.code, EXIT.usage);
    t.is(r.stdout, '');
    t.true(r.stderr.startsWith('lockstep: '), r.stderr);
    t.true(r.stderr.includes('--no-such-flag'), r.stderr);
    t.true(r.stderr.endsWith(`\nusage: ${usageOf(spec)}\n`), r.stderr);
  });

  const needed = requiredPositionals(name, spec.synopsis);
  if (needed.length)
    test.serial(`${name}: without ${needed.join(' ')} it prints its table synopsis as the usage`, async (t) => {
      const r = await run(...name.split(' '));
      t.is(r.code, EXIT.usage);
      t.is(r.stdout, '');
      t.is(r.stderr, `lockstep: missing arguments\nusage: ${usageOf(spec)}\n`);
    });
}

test('the positionals a synopsis requires are read as a user would', (t) => {
  t.deepEqual(requiredPositionals('checkpoint', 'checkpoint ID [--label L] [--context FILE [--media-type T]]'), ['ID']);
  t.deepEqual(requiredPositionals('effect begin', 'effect begin ID --kind K --input JSON [--key KEY]'), ['ID']);
  t.deepEqual(requiredPositionals('snapshot pull', 'snapshot pull --from URL --token T ID|NAME [--name N]'), [
    'ID|NAME',
  ]);
  t.deepEqual(requiredPositionals('exec', 'exec ID [--cwd DIR] -- CMD [ARG...]'), ['ID']);
  t.deepEqual(
    requiredPositionals('create', 'create [--image NAME | --from-snapshot ID] [--allow ENTRY]... [--json]'),
    [],
  );
  t.deepEqual(requiredPositionals('store ls', 'store ls [PREFIX] [--store URL]'), []);
  t.deepEqual(requiredPositionals('snapshot import', 'snapshot import [--name N] < FILE'), []);
  t.deepEqual(flagsOf('effect begin', 'effect begin [--irreversible|--compensable --compensation JSON] -- CMD'), [
    'irreversible',
    'compensable',
    'compensation',
  ]);
});

test('docs/cli.md holds the command list npm run docs:cli renders from the table', (t) => {
  const doc = fs.readFileSync(path.join(repoRoot, 'docs/cli.md'), 'utf8');
  t.true(doc.includes(CLI_DOC_BEGIN) && doc.includes(CLI_DOC_END));
  t.is(cliDocGenerated(doc), cliDocSection(), 'docs/cli.md is out of date: run npm run docs:cli');
  for (const [, spec] of entries) for (const s of synopses(spec)) t.true(doc.includes(`\`lockstep ${s}\``), s);
});
