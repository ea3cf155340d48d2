#!/usr/bin/env node
/**
 * The `lockstep` command: a thin layer over the library. It parses
 * arguments, calls one Lockstep method, and prints the result (stable JSON
 * with --json). See `lockstep help`.
 */
import type { NetworkMode } from '../host/network/policy.js';
import fs from 'node:fs';
import { EXIT, Progress, UsageError, printJson, reportError, table, useColor } from './output.js';
import { envFlags, intFlag, need, numberFlag, parse, splitCommand } from './args.js';
import type { SandboxInfo } from '../api/sandbox.js';
import { runDoctor } from '../host/doctor.js';
import { ImageStore, validateImageName } from '../images/image-store.js';
import { buildCacheDir } from '../config.js';
import { native } from '../native/binding.js';
import { InvalidArgumentError } from '../errors.js';
import { agentCommands } from './agent-commands.js';
import { serverCommands } from './server-commands.js';
import { withLockstep } from './session.js';
import { setupCommands } from './setup-command.js';
import { storeCommands } from './store-commands.js';
import { snapshotCommands } from './snapshot-commands.js';
import { portCommands } from './port-commands.js';
import { command, commandsHelp, subcommandUsage } from './command-table.js';
import { VERSION } from '../version.js';

/** "mem 512M pids 256 cpu 100 cap 0.5 disk 8M": the limits of a sandbox on one line. */
function limitsText(s: SandboxInfo): string {
  const parts = [`mem ${s.memoryMb ?? '-'}M`, `pids ${s.pids ?? '-'}`, `cpu ${s.cpuWeight ?? '-'}`];
  if (s.cpus !== null) parts.push(`cap ${s.cpus}`);
  if (s.ioWeight !== null) parts.push(`io ${s.ioWeight}`);
  if (s.diskMb !== null) parts.push(`disk ${s.diskMb}M`);
  return parts.join(' ');
}

const HELP = `lockstep — copy-on-write sandboxes with aligned checkpoints for AI agents

usage: lockstep <command> [options]

${commandsHelp()}

The state directory is /var/lib/lockstep, or LOCKSTEP_HOME when set.
Exit codes: 0 ok, 1 failure, 2 bad usage or input, 3 not found, 4 conflict
(busy, in use, refused), 5 host problem (CRIU, kernel, privileges); exec
exits with the command's own exit code.`;

type Handler = (argv: string[]) => Promise<number>;

const commands: Record<string, Handler> = {
  async help() {
    process.stdout.write(HELP + '\n');
    return EXIT.ok;
  },

  async version(argv) {
    const { options, usage } = command('--version');
    const { values } = parse(argv, options, usage);
    if (values.json) printJson({ version: VERSION });
    else process.stdout.write(`${VERSION}\n`);
    return EXIT.ok;
  },

  async doctor(argv) {
    const { options, usage } = command('doctor');
    const { values } = parse(argv, options, usage);
    const checks = await runDoctor();
    const failed = checks.filter((c) => !c.ok && !c.optional);
    if (values.json) printJson({ ok: failed.length === 0, checks });
    else {
      const color = useColor();
      for (const c of checks) {
        const mark = c.ok
          ? color
            ? '\x1b[32m✔\x1b[0m'
            : 'PASS'
          : c.optional
            ? color
              ? '\x1b[33m!\x1b[0m'
              : 'WARN'
            : color
              ? '\x1b[31m✘\x1b[0m'
              : 'FAIL';
        process.stdout.write(
          `${mark} ${c.name.padEnd(14)} ${c.detail}${!c.ok && c.fix ? `\n  ${' '.repeat(14)} → ${c.fix}` : ''}\n`,
        );
      }
    }
    return failed.length ? EXIT.host : EXIT.ok;
  },

  async create(argv) {
    const { options, usage } = command('create');
    const { values, positionals } = parse(argv, options, usage);
    need(positionals, 0, usage);
    return withLockstep(async (ls) => {
      // Only shown when the image is made on first use (a build or a link from the cache).
      const progress = new Progress(values.json === true);
      const sb = await ls
        .create({
          onProgress: (line) => progress.update(line),
          fromSnapshot: values['from-snapshot'],
          image: values.image,
          memoryMb: intFlag(values.memory, 'memory'),
          pids: intFlag(values.pids, 'pids'),
          cpuWeight: intFlag(values['cpu-weight'], 'cpu-weight'),
          cpus: numberFlag(values.cpus, 'cpus'),
          ioWeight: intFlag(values['io-weight'], 'io-weight'),
          diskMb: intFlag(values['disk-mb'], 'disk-mb'),
          network: values.network as NetworkMode | undefined,
          allowOut: values.allow,
          bandwidthMbit: intFlag(values['bandwidth-mbit'], 'bandwidth-mbit'),
          envs: envFlags(values.env),
        })
        .finally(() => progress.done());
      if (values.json) printJson({ id: sb.id });
      else process.stdout.write(`${sb.id}\n`);
      return EXIT.ok;
    });
  },

  async exec(argv) {
    const { options, usage } = command('exec');
    const [flags, cmd] = splitCommand(argv);
    const { values, positionals } = parse(flags, options, usage);
    const [id] = need(positionals, 1, usage);
    if (!cmd.length) throw new InvalidArgumentError('command', 'a command after "--"', '');
    return withLockstep(async (ls) => {
      const sb = ls.get(id!);
      const r = await sb.commands.run(cmd, {
        cwd: values.cwd,
        env: envFlags(values.env),
        timeoutMs: intFlag(values.timeout, 'timeout'),
        onStdout: values.json ? undefined : (s) => process.stdout.write(s),
        onStderr: values.json ? undefined : (s) => process.stderr.write(s),
      });
      if (values.json) printJson({ exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr });
      return r.exitCode;
    });
  },

  async spawn(argv) {
    const { options, usage } = command('spawn');
    const [flags, cmd] = splitCommand(argv);
    const { values, positionals } = parse(flags, options, usage);
    const [id] = need(positionals, 1, usage);
    if (!cmd.length) throw new InvalidArgumentError('command', 'a command after "--"', '');
    return withLockstep(async (ls) => {
      const pid = await ls
        .get(id!)
        .commands.spawn(cmd, { cwd: values.cwd, env: envFlags(values.env), stdoutPath: values.stdout });
      if (values.json) printJson({ pid });
      else process.stdout.write(`${pid}\n`);
      return EXIT.ok;
    });
  },

  async ls(argv) {
    const { options, usage } = command('ls');
    const { values, positionals } = parse(argv, options, usage);
    need(positionals, 0, usage);
    return withLockstep(async (ls) => {
      const list = ls.list();
      if (values.json) printJson(list);
      else {
        const rows = list.map((s) => [s.id, s.image, s.state, s.headCheckpointId ?? '-', s.createdAt, limitsText(s)]);
        process.stdout.write(table(['ID', 'IMAGE', 'STATE', 'HEAD', 'CREATED', 'LIMITS'], rows) + '\n');
      }
      return EXIT.ok;
    });
  },

  async inspect(argv) {
    const { options, usage } = command('inspect');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    return withLockstep(async (ls) => {
      const sb = ls.get(id!);
      const info = { ...sb.info(), usage: sb.usage() };
      if (values.json) printJson(info);
      else {
        const u = info.usage;
        const lines: [string, string][] = [
          ['id', info.id],
          ['image', info.image],
          ['state', info.state],
          ['head', info.headCheckpointId ?? '-'],
          ['limits', limitsText(info)],
          ['cpu used', u.cpuSeconds === null ? '-' : `${u.cpuSeconds.toFixed(2)} s`],
          [
            'disk used',
            u.diskUsedMb === null
              ? '- (no quotas on the store)'
              : `${u.diskUsedMb.toFixed(1)} MiB${info.diskMb === null ? '' : ` of ${info.diskMb} MiB`}`,
          ],
          ['created', info.createdAt],
        ];
        process.stdout.write(lines.map(([k, v]) => `${k.padEnd(10)} ${v}`).join('\n') + '\n');
      }
      return EXIT.ok;
    });
  },

  async rm(argv) {
    const { options, usage } = command('rm');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    return withLockstep(async (ls) => {
      await ls.remove(id!);
      if (values.json) printJson({ id, removed: true });
      return EXIT.ok;
    });
  },

  async fork(argv) {
    const { options, usage } = command('fork');
    const { values, positionals } = parse(argv, options, usage);
    const [id, ckpt] = need(positionals, 2, usage);
    return withLockstep(async (ls) => {
      const progress = new Progress(values.json === true);
      const results = await ls.get(id!).fork(ckpt!, {
        count: intFlag(values.count, 'count') ?? 1,
        onProgress: (d, n) => progress.update(`forking: ${d}/${n} ready`),
      });
      progress.done();
      const ids = results.flatMap((r) => (r.ok ? [r.id] : []));
      const errors = results.flatMap((r) => (r.ok ? [] : [r.error]));
      if (values.json) printJson({ ids, errors });
      else {
        for (const i of ids) process.stdout.write(`${i}\n`);
        for (const e of errors) process.stderr.write(`lockstep: a fork failed: ${e.message}\n`);
      }
      return errors.length && !ids.length ? EXIT.failure : EXIT.ok;
    });
  },

  async checkpoints(argv) {
    const { options, usage } = command('checkpoints');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    return withLockstep(async (ls) => {
      const sb = ls.get(id!);
      const list = sb.checkpoints();
      const head = sb.info().headCheckpointId;
      if (values.json) printJson(list);
      else
        process.stdout.write(
          table(
            ['ID', 'PARENT', 'LABEL', 'CREATED', 'MS', ''],
            list.map((c) => [
              c.id,
              c.parentId ?? '-',
              c.label ?? '',
              c.createdAt,
              c.timings.totalMs?.toFixed(1) ?? '',
              c.id === head ? 'HEAD' : '',
            ]),
          ) + '\n',
        );
      return EXIT.ok;
    });
  },

  async log(argv) {
    const { options, usage } = command('log');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    return withLockstep(async (ls) => {
      const sb = ls.get(id!);
      if (values.json) {
        // The tree as data: checkpoints with parent links, the head, and the forks started from them.
        const forks = ls.list().filter((s) => s.forkedFrom && sb.checkpoints().some((c) => c.id === s.forkedFrom));
        printJson({
          sandboxId: sb.id,
          head: sb.info().headCheckpointId,
          checkpoints: sb.checkpoints(),
          forks: forks.map((f) => ({ id: f.id, forkedFrom: f.forkedFrom, state: f.state })),
        });
      } else process.stdout.write(sb.tree({ color: useColor() }) + '\n');
      return EXIT.ok;
    });
  },

  async image(argv) {
    const [sub, ...rest] = argv;
    switch (sub) {
      case 'build': {
        const { options, usage } = command('image build');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        return withLockstep(async (ls) => {
          const progress = new Progress(values.json === true);
          const row = await ls.images.build(name!, {
            force: values.force === true,
            progress: (m) => progress.update(m),
          });
          progress.done();
          if (values.json) printJson(row);
          else process.stdout.write(`${row.name}  ${(row.size_bytes / 1e6).toFixed(1)} MB\n`);
          return EXIT.ok;
        });
      }
      case 'ls': {
        const { options, usage } = command('image ls');
        const { values } = parse(rest, options, usage);
        return withLockstep(async (ls) => {
          const rows = ls.images.list();
          if (values.json)
            printJson(
              rows.map((r) => ({
                name: r.name,
                source: r.source,
                sizeBytes: r.size_bytes,
                createdAt: new Date(r.created_at).toISOString(),
              })),
            );
          else
            process.stdout.write(
              table(
                ['NAME', 'SIZE', 'SOURCE'],
                rows.map((r) => [r.name, `${(r.size_bytes / 1e6).toFixed(1)} MB`, r.source]),
              ) + '\n',
            );
          return EXIT.ok;
        });
      }
      case 'rm': {
        const { options, usage } = command('image rm');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        return withLockstep(async (ls) => {
          const r = ls.images.remove(name!);
          if (values.json) printJson({ name, ...r });
          else if (r.pending)
            process.stdout.write(
              `${name} is still used by sandboxes or checkpoints: hidden now, deleted when the last of them goes\n`,
            );
          return EXIT.ok;
        });
      }
      case 'import': {
        const { options, usage } = command('image import');
        const { values, positionals } = parse(rest, options, usage);
        const [src] = need(positionals, 1, usage);
        const ref = dockerRef(src!);
        const name =
          values.name ??
          ref
            .replace(/^.*\//, '')
            .replace(/[:@].*$/, '')
            .toLowerCase();
        return withLockstep(async (ls) => {
          const row = await ls.images.importFromDocker(ref, validateImageName(name, 'name'));
          if (values.json) printJson({ name: row.name, source: row.source, sizeBytes: row.size_bytes });
          else process.stdout.write(`${row.name}\n`);
          return EXIT.ok;
        });
      }
      case 'export': {
        const { options, usage } = command('image export');
        const { values, positionals } = parse(rest, options, usage);
        const [name, dst] = need(positionals, 2, usage);
        return withLockstep(async (ls) => {
          const progress = new Progress(values.json === true);
          progress.update(`exporting ${name} to ${dst}`);
          await ls.images.exportToDocker(name!, dockerRef(dst!));
          progress.done();
          if (values.json) printJson({ name, ref: dockerRef(dst!) });
          return EXIT.ok;
        });
      }
      case 'cache': {
        const { options, usage } = command('image cache');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        const progress = new Progress(values.json === true);
        const rootfs = await ImageStore.cacheRecipe(name!, { cacheDir: buildCacheDir(), native: native() }, (m) =>
          progress.update(m),
        );
        progress.done();
        if (values.json) printJson({ name, rootfs });
        return EXIT.ok;
      }
      default:
        throw new UsageError(`unknown image command ${JSON.stringify(sub ?? '')}\nusage:\n${subcommandUsage('image')}`);
    }
  },
};

function dockerRef(s: string): string {
  if (!s.startsWith('docker:') || s.length <= 'docker:'.length)
    throw new InvalidArgumentError('image reference', '"docker:REPO[:TAG]"', s);
  return s.slice('docker:'.length);
}

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  const json =
    rest.includes('--json') && !(cmd === 'exec' && rest.indexOf('--json') > rest.indexOf('--') && rest.includes('--'));
  if (!cmd || cmd === '--help' || cmd === '-h') return commands.help!([]);
  const handler =
    cmd === '--version' || cmd === '-V'
      ? commands.version
      : (commands[cmd] ??
        agentCommands[cmd] ??
        snapshotCommands[cmd] ??
        portCommands[cmd] ??
        serverCommands[cmd] ??
        setupCommands[cmd] ??
        storeCommands[cmd]);
  try {
    if (!handler) throw new UsageError(`unknown command ${JSON.stringify(cmd)}; see \`lockstep help\``);
    return await handler(rest);
  } catch (e) {
    return reportError(e, json);
  }
}

const invokedDirectly =
  process.argv[1] && fs.realpathSync(process.argv[1]) === fs.realpathSync(new URL(import.meta.url).pathname);
if (invokedDirectly) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
