/**
 * Every `lockstep` command in one table: its synopsis (what follows
 * `lockstep `), the line `lockstep help` gives it, the group it is listed
 * under and the parseArgs options its handler parses. `lockstep help`, each
 * command's usage error and the command list of docs/cli.md (`npm run
 * docs:cli`) are rendered from it, so they cannot drift from the flags a
 * command takes (issue 26); test/unit/cli-table.test.ts checks that every
 * `--flag` of a synopsis is an option, that every option is in the
 * synopsis, and that docs/cli.md holds the list rendered now.
 */
import { DEFAULT_CONFIG_FILE, DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';
import type { Options } from './args.js';

/** The groups of `lockstep help`, in its order: key → heading. */
export const GROUPS = {
  sandboxes: 'sandboxes',
  checkpoints: 'checkpoints',
  snapshots: 'snapshots',
  ports: 'exposed ports (reached through lockstep serve at /ports/<id>/)',
  effects: 'effects',
  images: 'images',
  host: 'host',
  setup: 'setup',
  server: 'server',
  store: 'snapshot store (--store s3://BUCKET[/PREFIX] | file:///DIR | /DIR, else LOCKSTEP_SNAPSHOT_STORE)',
} as const;
export type Group = keyof typeof GROUPS;

/** Lines a group's help ends with that are not commands of their own. */
const GROUP_NOTES: Partial<Record<Group, readonly string[]>> = {
  snapshots: ['create --from-snapshot ID|NAME [--json]'],
};

export interface CommandSpec {
  readonly group: Group;
  /** The text after `lockstep `; `[--flag X]` for every option, redirections (`< FILE`) included. */
  readonly synopsis: string;
  /** What `lockstep help` says beside it; a second line goes under the first. */
  readonly description?: string;
  /** Further forms of the same command (`snapshot pull` from a server or from the store). */
  readonly more?: readonly { readonly synopsis: string; readonly description?: string }[];
  readonly options: Options;
}

const json = { json: { type: 'boolean' } } as const;

/** The commands, in the order `lockstep help` lists them; the key is the words that name it. */
export const COMMANDS = {
  create: {
    group: 'sandboxes',
    synopsis:
      'create [--image NAME | --from-snapshot ID] [--memory MIB] [--pids N] [--cpu-weight 1-10000] [--cpus N.NN] ' +
      '[--io-weight 1-1000] [--disk-mb MIB] [--network none|egress] [--allow ENTRY]... [--bandwidth-mbit N] ' +
      '[--env K=V]... [--json]',
    options: {
      image: { type: 'string' },
      memory: { type: 'string' },
      pids: { type: 'string' },
      'cpu-weight': { type: 'string' },
      cpus: { type: 'string' },
      'io-weight': { type: 'string' },
      'disk-mb': { type: 'string' },
      network: { type: 'string' },
      allow: { type: 'string', multiple: true },
      'bandwidth-mbit': { type: 'string' },
      env: { type: 'string', multiple: true },
      'from-snapshot': { type: 'string' },
      ...json,
    },
  },
  exec: {
    group: 'sandboxes',
    synopsis: 'exec ID [--cwd DIR] [--env K=V]... [--timeout MS] [--json] -- CMD [ARG...]',
    options: {
      cwd: { type: 'string' },
      env: { type: 'string', multiple: true },
      timeout: { type: 'string' },
      ...json,
    },
  },
  spawn: {
    group: 'sandboxes',
    synopsis: 'spawn ID [--cwd DIR] [--env K=V]... [--stdout PATH] [--json] -- CMD [ARG...]',
    options: {
      cwd: { type: 'string' },
      env: { type: 'string', multiple: true },
      stdout: { type: 'string' },
      ...json,
    },
  },
  ls: { group: 'sandboxes', synopsis: 'ls [--json]', options: json },
  inspect: {
    group: 'sandboxes',
    synopsis: 'inspect ID [--json]',
    description: 'limits and what the sandbox uses (CPU time, disk)',
    options: json,
  },
  rm: { group: 'sandboxes', synopsis: 'rm ID [--json]', options: json },

  checkpoint: {
    group: 'checkpoints',
    synopsis: 'checkpoint ID [--label L] [--context FILE --context-format F [--media-type T]] [--json]',
    options: {
      label: { type: 'string' },
      context: { type: 'string' },
      'context-format': { type: 'string' },
      'media-type': { type: 'string' },
      ...json,
    },
  },
  rollback: {
    group: 'checkpoints',
    synopsis: 'rollback ID CHECKPOINT [--policy warn|refuse] [--failure TEXT] [--lesson TEXT]... [--json]',
    options: {
      policy: { type: 'string' },
      failure: { type: 'string' },
      lesson: { type: 'string', multiple: true },
      ...json,
    },
  },
  fork: {
    group: 'checkpoints',
    synopsis: 'fork ID CHECKPOINT [--count N] [--json]',
    options: { count: { type: 'string' }, ...json },
  },
  checkpoints: { group: 'checkpoints', synopsis: 'checkpoints ID [--json]', options: json },
  log: { group: 'checkpoints', synopsis: 'log ID [--json]', options: json },

  'snapshot create': {
    group: 'snapshots',
    synopsis: 'snapshot create CHECKPOINT [--name N] [--meta K=V]... [--json]',
    options: { name: { type: 'string' }, meta: { type: 'string', multiple: true }, ...json },
  },
  'snapshot ls': { group: 'snapshots', synopsis: 'snapshot ls [--json]', options: json },
  'snapshot inspect': { group: 'snapshots', synopsis: 'snapshot inspect ID|NAME [--json]', options: json },
  'snapshot rm': { group: 'snapshots', synopsis: 'snapshot rm ID|NAME [--json]', options: json },
  'snapshot start': {
    group: 'snapshots',
    synopsis: 'snapshot start ID|NAME [--count N] [--json]',
    description: 'start sandboxes from it',
    options: { count: { type: 'string' }, ...json },
  },
  'snapshot export': {
    group: 'snapshots',
    synopsis: 'snapshot export ID|NAME > FILE',
    description: 'the bundle on stdout',
    options: {},
  },
  'snapshot import': {
    group: 'snapshots',
    synopsis: 'snapshot import [--name N] [--json] < FILE',
    description: 'a bundle from stdin',
    options: { name: { type: 'string' }, ...json },
  },
  'snapshot pull': {
    group: 'snapshots',
    synopsis: 'snapshot pull --from URL --token T ID|NAME [--name N] [--json]',
    more: [{ synopsis: 'snapshot pull KEY [--store URL] [--name N] [--json]', description: 'from the snapshot store' }],
    options: {
      from: { type: 'string' },
      token: { type: 'string' },
      name: { type: 'string' },
      store: { type: 'string' },
      ...json,
    },
  },
  'snapshot push': {
    group: 'snapshots',
    synopsis: 'snapshot push ID|NAME [--key K] [--store URL] [--json]',
    description: 'into the snapshot store',
    options: { key: { type: 'string' }, store: { type: 'string' }, ...json },
  },
  'snapshot key': {
    group: 'snapshots',
    synopsis: 'snapshot key',
    description: "this host's bundle-signing key",
    options: {},
  },

  'ports expose': {
    group: 'ports',
    synopsis: 'ports expose ID PORT [--json]',
    description: 'prints the URL and the token (shown only here)',
    options: json,
  },
  'ports ls': { group: 'ports', synopsis: 'ports ls ID [--json]', options: json },
  'ports close': { group: 'ports', synopsis: 'ports close ID PORT [--json]', options: json },

  'effect begin': {
    group: 'effects',
    synopsis:
      'effect begin ID --kind K --input JSON [--key KEY] [--irreversible|--compensable --compensation JSON] ' +
      '[--scope lineage|branch] [--tool-call ID] [--json]',
    options: {
      kind: { type: 'string' },
      input: { type: 'string' },
      key: { type: 'string' },
      irreversible: { type: 'boolean' },
      compensable: { type: 'boolean' },
      compensation: { type: 'string' },
      scope: { type: 'string' },
      'tool-call': { type: 'string' },
      ...json,
    },
  },
  'effect commit': {
    group: 'effects',
    synopsis: 'effect commit ID EFFECT_ID --output JSON [--json]',
    options: { output: { type: 'string' }, ...json },
  },
  'effect fail': {
    group: 'effects',
    synopsis: 'effect fail ID EFFECT_ID --error TEXT [--definite] [--json]',
    options: { error: { type: 'string' }, definite: { type: 'boolean' }, ...json },
  },
  effects: { group: 'effects', synopsis: 'effects ID [--json]', options: json },

  'image build': {
    group: 'images',
    synopsis: 'image build NAME [--force] [--json]',
    description: 'build from sandbox-images/NAME',
    options: { force: { type: 'boolean' }, ...json },
  },
  'image ls': { group: 'images', synopsis: 'image ls [--json]', options: json },
  'image rm': { group: 'images', synopsis: 'image rm NAME [--json]', options: json },
  'image import': {
    group: 'images',
    synopsis: 'image import docker:REF [--name NAME] [--json]',
    options: { name: { type: 'string' }, ...json },
  },
  'image export': { group: 'images', synopsis: 'image export NAME docker:REF [--json]', options: json },
  'image cache': {
    group: 'images',
    synopsis: 'image cache NAME [--json]',
    description: 'build a recipe into the build cache only',
    options: json,
  },

  doctor: { group: 'host', synopsis: 'doctor [--json]', options: json },
  '--version': { group: 'host', synopsis: '--version [--json]', options: json },

  setup: {
    group: 'setup',
    synopsis: 'setup [--images NAME,...] [--home DIR] [--cache-only] [--check] [--json]',
    description:
      'host packages, CRIU, native build, state directory, images (default base);\n' +
      'idempotent; --check only reports (exit 0: set up, 5: not)',
    options: {
      images: { type: 'string' },
      home: { type: 'string' },
      'cache-only': { type: 'boolean' },
      check: { type: 'boolean' },
      ...json,
    },
  },

  serve: {
    group: 'server',
    synopsis:
      'serve [--config FILE] [--port P] [--host H] [--home DIR] [--metrics-token T | --metrics-token-file F] ' +
      '[--log-level L] [--grace-ms MS] [--json]',
    description:
      `HTTP API (default ${DEFAULT_HOST}:${DEFAULT_PORT}); SIGTERM drains and stops;\n` +
      `settings: flag > LOCKSTEP_* environment > config file (${DEFAULT_CONFIG_FILE})`,
    options: {
      config: { type: 'string' },
      port: { type: 'string' },
      host: { type: 'string' },
      home: { type: 'string' },
      'metrics-token': { type: 'string' },
      'metrics-token-file': { type: 'string' },
      'log-level': { type: 'string' },
      'grace-ms': { type: 'string' },
      ...json,
    },
  },
  mcp: {
    group: 'server',
    synopsis: 'mcp [--sandbox ID] [--image NAME] [--memory MIB]',
    description: 'MCP server on stdio for one sandbox (created and removed if not given)',
    options: { sandbox: { type: 'string' }, image: { type: 'string' }, memory: { type: 'string' } },
  },
  'tenant add': {
    group: 'server',
    synopsis:
      'tenant add NAME [--max-sandboxes N] [--max-memory MIB] [--cpu-weight W] [--max-cpu-weight W] ' +
      '[--max-checkpoint-mb MIB] [--max-disk-mb MIB] [--network none|egress] [--max-network none|egress] [--json]',
    description: "prints the tenant's bearer token (shown once)",
    options: {
      'max-sandboxes': { type: 'string' },
      'max-memory': { type: 'string' },
      'cpu-weight': { type: 'string' },
      'max-cpu-weight': { type: 'string' },
      'max-checkpoint-mb': { type: 'string' },
      'max-disk-mb': { type: 'string' },
      network: { type: 'string' },
      'max-network': { type: 'string' },
      ...json,
    },
  },
  'tenant ls': { group: 'server', synopsis: 'tenant ls [--json]', options: json },
  'tenant rm': {
    group: 'server',
    synopsis: 'tenant rm NAME [--force] [--json]',
    description: "--force first removes the tenant's sandboxes",
    options: { force: { type: 'boolean' }, ...json },
  },

  'store put': {
    group: 'store',
    synopsis: 'store put NAME [--store URL] [--json] < BUNDLE',
    description: 'reads the bundle from stdin; sends only chunks the store lacks',
    options: { store: { type: 'string' }, ...json },
  },
  'store get': {
    group: 'store',
    synopsis: 'store get NAME [--store URL] > BUNDLE',
    description: 'writes the bundle to stdout, each chunk verified',
    options: { store: { type: 'string' } },
  },
  'store ls': {
    group: 'store',
    synopsis: 'store ls [PREFIX] [--store URL] [--json]',
    options: { store: { type: 'string' }, ...json },
  },
  'store rm': {
    group: 'store',
    synopsis: 'store rm NAME [--store URL] [--json]',
    options: { store: { type: 'string' }, ...json },
  },
  'store gc': {
    group: 'store',
    synopsis: 'store gc [--grace-ms MS] [--store URL] [--json]',
    description: "removes chunks no bundle lists (every tenant's part too)",
    options: { 'grace-ms': { type: 'string' }, store: { type: 'string' }, ...json },
  },
} as const satisfies Record<string, CommandSpec>;

export type CommandName = keyof typeof COMMANDS;

/** Every entry of the table, in order, as `[name, spec]`. */
export function commandEntries(): [string, CommandSpec][] {
  return Object.entries(COMMANDS);
}

/** An entry's synopses: its own and those of its further forms. */
export function synopses(spec: CommandSpec): string[] {
  return [spec.synopsis, ...(spec.more ?? []).map((m) => m.synopsis)];
}

/** The usage line(s) a command's errors end with: `lockstep SYNOPSIS`, one line per form. */
export function usageOf(spec: CommandSpec): string {
  return synopses(spec)
    .map((s, i) => `${i ? '       ' : ''}lockstep ${s}`)
    .join('\n');
}

/** A command's options and usage text, for its handler: `parse(argv, c.options, c.usage)`. */
export function command<N extends CommandName>(name: N): { options: (typeof COMMANDS)[N]['options']; usage: string } {
  const spec = COMMANDS[name];
  return { options: spec.options, usage: usageOf(spec) };
}

/** The usage of every `PREFIX …` command (`image`, `tenant`), a line each: for a missing or unknown subcommand. */
export function subcommandUsage(prefix: string): string {
  return commandEntries()
    .filter(([name]) => name.startsWith(`${prefix} `))
    .flatMap(([, spec]) => synopses(spec).map((s) => `  lockstep ${s}`))
    .join('\n');
}

/**
 * Where descriptions start in `lockstep help`: a group lines them up at
 * column 34, or further right to fit its longest described synopsis as long
 * as that stays within column 60; a synopsis too long for the group's
 * column has its description on the next line.
 */
const DESCRIPTION_COLUMN = 34;
const WIDEST_COLUMN = 60;
const GAP = 3;

function helpLines(synopsis: string, description: string | undefined, column: number): string[] {
  const line = `  ${synopsis}`;
  if (description === undefined) return [line];
  const [first, ...rest] = description.split('\n');
  const indent = ' '.repeat(column);
  const head = line.length + GAP <= column ? [line.padEnd(column) + first] : [line, indent + first];
  return [...head, ...rest.map((r) => indent + r)];
}

/** The forms (synopsis and description) of a group's commands, in order. */
function groupForms(group: Group): { synopsis: string; description?: string }[] {
  return commandEntries()
    .filter(([, spec]) => spec.group === group)
    .flatMap(([, spec]) => [spec, ...(spec.more ?? [])]);
}

/** One group of `lockstep help`: its heading, then a line per command form (and its description). */
export function groupHelp(group: Group): string {
  const forms = groupForms(group);
  const widest = Math.max(
    0,
    ...forms.filter((f) => f.description !== undefined).map((f) => 2 + f.synopsis.length + GAP),
  );
  const column = widest > WIDEST_COLUMN ? DESCRIPTION_COLUMN : Math.max(DESCRIPTION_COLUMN, widest);
  const lines = [GROUPS[group] as string, ...forms.flatMap((f) => helpLines(f.synopsis, f.description, column))];
  for (const note of GROUP_NOTES[group] ?? []) lines.push(`  ${note}`);
  return lines.join('\n');
}

/** Every group of `lockstep help`, in order, a blank line between them. */
export function commandsHelp(): string {
  return (Object.keys(GROUPS) as Group[]).map(groupHelp).join('\n\n');
}

/** Markdown backticks around a synopsis (none of them holds a backtick). */
const code = (s: string) => `\`lockstep ${s}\``;
/** Plain text in Markdown: `<id>` stays text, `LOCKSTEP_*` starts no emphasis. */
const text = (s: string) => s.replace(/[<*]/g, (c) => `\\${c}`);

/** The command list of docs/cli.md (between its cli:begin and cli:end markers): a list per group. */
export function commandsMarkdown(): string {
  const out: string[] = [];
  for (const group of Object.keys(GROUPS) as Group[]) {
    out.push(`**${text(GROUPS[group])}**`, '');
    for (const form of groupForms(group)) {
      const d = form.description && text(form.description.replace(/\n/g, ' '));
      out.push(`- ${code(form.synopsis)}${d ? `: ${d}` : ''}`);
    }
    for (const note of GROUP_NOTES[group] ?? []) out.push(`- ${code(note)}`);
    out.push('');
  }
  return out.join('\n').trimEnd();
}

/** The markers of the generated command list in docs/cli.md (`npm run docs:cli`, scripts/cli-reference.mjs). */
export const CLI_DOC_BEGIN = '<!-- cli:begin (generated by npm run docs:cli; do not edit) -->';
export const CLI_DOC_END = '<!-- cli:end -->';

/** What goes between the markers: the list, with a blank line either side (so the markers stay out of it). */
export function cliDocSection(): string {
  return '\n' + commandsMarkdown() + '\n\n';
}

/** The text between the markers of a Markdown text, as it stands. */
export function cliDocGenerated(markdown: string): string {
  const begin = markdown.indexOf(CLI_DOC_BEGIN + '\n');
  const end = markdown.indexOf(CLI_DOC_END, begin);
  if (begin < 0 || end < 0) throw new Error(`no ${CLI_DOC_BEGIN} ... ${CLI_DOC_END} section`);
  return markdown.slice(begin + CLI_DOC_BEGIN.length + 1, end);
}
