/**
 * CLI commands for the interfaces platforms plug into: `serve` (the HTTP
 * API), `mcp` (the MCP server on stdio) and `tenant` (tokens and quotas).
 * Like the rest of the CLI they only parse arguments and call the library.
 */
import type { NetworkMode } from '../host/network/policy.js';
import { Lockstep } from '../api/lockstep.js';
import { createLogger } from '../log.js';
import type { LockstepServer } from '../http/server.js';
import { DEFAULT_CONFIG_FILE, DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';
import { VERSION } from '../version.js';
import { EXIT, UsageError, printJson, table } from './output.js';
import { intFlag, need, parse } from './args.js';
import { withLockstep } from './session.js';
import { envValue } from '../config.js';

type Handler = (argv: string[]) => Promise<number>;

// The servers load fastify and the MCP SDK only when they run (dynamic
// imports below), so that the rest of the CLI starts as fast as before.

export const SERVER_HELP = `server
  serve [--config FILE] [--port P] [--host H] [--home DIR] [--metrics-token-file F] [--log-level L] [--grace-ms MS] [--json]
                                  HTTP API (default ${DEFAULT_HOST}:${DEFAULT_PORT}); SIGTERM drains and stops;
                                  settings: flag > LOCKSTEP_* environment > config file (${DEFAULT_CONFIG_FILE})
  mcp [--sandbox ID] [--image NAME] [--memory MIB]
                                  MCP server on stdio for one sandbox (created and removed if not given)
  tenant add NAME [--max-sandboxes N] [--max-memory MIB] [--cpu-weight W] [--max-cpu-weight W] [--max-checkpoint-mb MIB] [--max-disk-mb MIB] [--network none|egress] [--max-network none|egress] [--json]
                                  prints the tenant's bearer token (shown once)
  tenant ls [--json]
  tenant rm NAME [--force] [--json]
                                  --force first removes the tenant's sandboxes`;

export const serverCommands: Record<string, Handler> = {
  async serve(argv) {
    const usage =
      'lockstep serve [--config FILE] [--port P] [--host H] [--home DIR] [--metrics-token T ' +
      '| --metrics-token-file F] [--log-level L] [--grace-ms MS] [--json]';
    const { values, positionals } = parse(
      argv,
      {
        config: { type: 'string' },
        port: { type: 'string' },
        host: { type: 'string' },
        home: { type: 'string' },
        'metrics-token': { type: 'string' },
        'metrics-token-file': { type: 'string' },
        'log-level': { type: 'string' },
        'grace-ms': { type: 'string' },
        json: { type: 'boolean' },
      },
      usage,
    );
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
    const usage = 'lockstep mcp [--sandbox ID] [--image NAME] [--memory MIB]';
    const { values, positionals } = parse(
      argv,
      { sandbox: { type: 'string' }, image: { type: 'string' }, memory: { type: 'string' } },
      usage,
    );
    need(positionals, 0, usage);
    const { runMcpStdio } = await import('../mcp/stdio.js');
    await runMcpStdio({ sandboxId: values.sandbox, image: values.image, memoryMb: intFlag(values.memory, 'memory') });
    return EXIT.ok;
  },

  async tenant(argv) {
    const [sub, ...rest] = argv;
    const usage =
      'lockstep tenant add NAME [--max-sandboxes N] [--max-memory MIB] [--cpu-weight W] [--max-cpu-weight ' +
      'W] [--max-checkpoint-mb MIB] [--max-disk-mb MIB] [--network none|egress] [--max-network none|egress] [--json] | ls [--json] | ' +
      'rm NAME [--force] [--json]';
    switch (sub) {
      case 'add': {
        const u =
          'lockstep tenant add NAME [--max-sandboxes N] [--max-memory MIB] ' +
          '[--cpu-weight W] [--max-cpu-weight W] [--max-checkpoint-mb MIB] [--max-disk-mb MIB] [--network none|egress] ' +
          '[--max-network none|egress] [--json]';
        const opts = {
          'max-sandboxes': { type: 'string' },
          'max-memory': { type: 'string' },
          'cpu-weight': { type: 'string' },
          'max-cpu-weight': { type: 'string' },
          'max-checkpoint-mb': { type: 'string' },
          'max-disk-mb': { type: 'string' },
          network: { type: 'string' },
          'max-network': { type: 'string' },
          json: { type: 'boolean' },
        } as const;
        const { values, positionals } = parse(rest, opts, u);
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
        const u = 'lockstep tenant ls [--json]';
        const { values, positionals } = parse(rest, { json: { type: 'boolean' } }, u);
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
        const u = 'lockstep tenant rm NAME [--force] [--json]';
        const { values, positionals } = parse(rest, { force: { type: 'boolean' }, json: { type: 'boolean' } }, u);
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
        throw new UsageError(`unknown tenant command ${JSON.stringify(sub ?? '')}\nusage: ${usage}`);
    }
  },
};
