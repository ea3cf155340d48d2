/**
 * CLI commands for the interfaces platforms plug into: `serve` (the HTTP
 * API), `mcp` (the MCP server on stdio) and `tenant` (tokens and quotas).
 * Like the rest of the CLI they only parse arguments and call the library.
 */
import type { NetworkMode } from '../host/network/policy.js';
import { Lockstep } from '../api/lockstep.js';
import { createLogger } from '../log.js';
import type { LockstepServer } from '../http/server.js';
import { VERSION } from '../version.js';
import { EXIT, UsageError, printJson, table } from './output.js';
import { intFlag, need, parse } from './args.js';
import { withLockstep } from './session.js';
import { command, subcommandUsage } from './command-table.js';
import { envValue } from '../config.js';

type Handler = (argv: string[]) => Promise<number>;

// The servers load fastify and the MCP SDK only when they run (dynamic
// imports below), so that the rest of the CLI starts as fast as before.

export const serverCommands: Record<string, Handler> = {
  async serve(argv) {
    const { options, usage } = command('serve');
    const { values, positionals } = parse(argv, options, usage);
    need(positionals, 0, usage);
    const { loadConfigFile, resolveServeConfig } = await import('../http/config.js');
    const { file, config: fileConfig } = loadConfigFile(values.config ?? envValue('LOCKSTEP_CONFIG'));
    const cfg = resolveServeConfig(values, process.env, fileConfig);
    const logger = createLogger(cfg.logLevel);
    logger.info(
      { version: VERSION, config: file ?? null, stateDirectory: cfg.stateDirectory, sources: cfg.sources },
      'starting',
    );
    const { createServer } = await import('../http/server.js');
    const ls = await Lockstep.open({ logger, home: cfg.stateDirectory });
    let app: LockstepServer | undefined;
    try {
      app = createServer({
        lockstep: ls,
        logger,
        metricsToken: cfg.metricsToken,
        bodyLimit: cfg.bodyLimit,
        fileBodyLimit: cfg.fileBodyLimit,
      });
      await app.listen({ port: cfg.port, host: cfg.host });
    } catch (e) {
      await app?.close().catch(() => undefined);
      await ls.close();
      throw e;
    }
    const graceMs = cfg.graceMs;
    const addr = app.server.address();
    const bound =
      typeof addr === 'object' && addr ? { host: addr.address, port: addr.port } : { host: cfg.host, port: cfg.port };
    const url = `http://${bound.host.includes(':') ? `[${bound.host}]` : bound.host}:${bound.port}`;
    if (values.json) printJson({ url, ...bound, pid: process.pid });
    else process.stdout.write(`lockstep: listening on ${url} (docs: ${url}/docs)\n`);

    const server = app;
    await new Promise<void>((resolve) => {
      let signals = 0;
      const onSignal = (sig: NodeJS.Signals) => {
        if (++signals > 1) {
          // A second signal: the operator does not want to wait. Operations
          // cut off here are what the reaper finishes on the next start.
          logger.warn({ signal: sig }, 'second signal: exiting without waiting');
          process.exit(EXIT.failure);
        }
        logger.info({ signal: sig, graceMs }, 'shutting down');
        server
          .shutdown({ graceMs, closeLockstep: true })
          .catch((err: unknown) => logger.error({ err }, 'shutdown failed'))
          .finally(resolve);
      };
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    });
    return EXIT.ok;
  },

  async mcp(argv) {
    const { options, usage } = command('mcp');
    const { values, positionals } = parse(argv, options, usage);
    need(positionals, 0, usage);
    const { runMcpStdio } = await import('../mcp/stdio.js');
    await runMcpStdio({ sandboxId: values.sandbox, image: values.image, memoryMb: intFlag(values.memory, 'memory') });
    return EXIT.ok;
  },

  async tenant(argv) {
    const [sub, ...rest] = argv;
    switch (sub) {
      case 'add': {
        const { options, usage: u } = command('tenant add');
        const { values, positionals } = parse(rest, options, u);
        const [name] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          const { tenant, token } = ls.tenants.add(name!, {
            maxSandboxes: intFlag(values['max-sandboxes'], 'max-sandboxes'),
            maxMemoryMb: intFlag(values['max-memory'], 'max-memory'),
            cpuWeight: intFlag(values['cpu-weight'], 'cpu-weight'),
            maxCpuWeight: intFlag(values['max-cpu-weight'], 'max-cpu-weight'),
            maxCheckpointMb: intFlag(values['max-checkpoint-mb'], 'max-checkpoint-mb'),
            maxDiskMb: intFlag(values['max-disk-mb'], 'max-disk-mb'),
            network: values.network as NetworkMode | undefined,
            maxNetwork: values['max-network'] as NetworkMode | undefined,
          });
          if (values.json) printJson({ ...tenant, token });
          else {
            process.stdout.write(`${token}\n`);
            process.stderr.write(
              `lockstep: tenant ${tenant.name} added; keep the token now: only its hash is stored\n`,
            );
          }
          return EXIT.ok;
        });
      }
      case 'ls': {
        const { options, usage: u } = command('tenant ls');
        const { values, positionals } = parse(rest, options, u);
        need(positionals, 0, u);
        return withLockstep(async (ls) => {
          const rows = ls.tenants.list().map((t) => ({ ...t, usage: ls.tenants.usage(t.id) }));
          if (values.json) printJson(rows);
          else {
            const lim = (n: number | null) => (n === null ? '-' : String(n));
            const cells = rows.map((t) => [
              t.name,
              `${t.usage.sandboxes}/${lim(t.maxSandboxes)}`,
              `${t.usage.memoryMb}+${t.usage.standbyMemoryMb}/${lim(t.maxMemoryMb)}`,
              `${t.usage.cpuWeight}/${lim(t.maxCpuWeight)}`,
              `${t.usage.checkpointMb + t.usage.snapshotMb}/${lim(t.maxCheckpointMb)}`,
              `${t.usage.diskMb}/${lim(t.maxDiskMb)}`,
              t.createdAt,
            ]);
            process.stdout.write(
              table(
                ['NAME', 'SANDBOXES', 'MEMORY+STANDBY MIB', 'CPU WEIGHT', 'CHECKPOINT MIB', 'DISK MIB', 'CREATED'],
                cells,
              ) + '\n',
            );
          }
          return EXIT.ok;
        });
      }
      case 'rm': {
        const { options, usage: u } = command('tenant rm');
        const { values, positionals } = parse(rest, options, u);
        const [name] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          // --force tears the tenant's sandboxes down first; without it, a tenant with sandboxes is refused.
          if (values.force === true) await ls.tenants.purge(name!);
          else ls.tenants.remove(name!);
          if (values.json) printJson({ name, removed: true });
          return EXIT.ok;
        });
      }
      default:
        throw new UsageError(
          `unknown tenant command ${JSON.stringify(sub ?? '')}\nusage:\n${subcommandUsage('tenant')}`,
        );
    }
  },
};
