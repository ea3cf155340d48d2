/**
 * One configuration object per manager. `Lockstep.open()` resolves it once,
 * from its options, then the environment, then the defaults; nothing below
 * the manager reads `process.env`, so two managers in one process can differ.
 * The README's table of environment variables is checked against
 * ENVIRONMENT (test/unit/config.test.ts), in both directions.
 */
import path from 'node:path';
import { HostError } from './errors.js';

/** The defaults, for code that runs without a manager (setup, doctor) and for resolveConfig. */
export const DEFAULTS = {
  home: '/var/lib/lockstep',
  logLevel: 'warn',
  storeGib: 64,
  cacheDir: '/var/cache/lockstep',
  criuBinary: '/opt/lockstep/bin/criu',
  criuLogLevel: 2,
  dockerSocket: '/var/run/docker.sock',
} as const;

export const DEFAULT_HOME = DEFAULTS.home;

/** What a manager's behaviour depends on besides its arguments. */
export interface LockstepConfig {
  /** The state directory. */
  readonly home: string;
  /** Prepare a warm standby after each checkpoint (a second copy of the sandbox's memory). */
  readonly standby: boolean;
  /** pino level of the manager's logger, when the caller passes none. */
  readonly logLevel: string;
  /** Size of the sparse btrfs image holding the layers, when the state directory is not on btrfs. */
  readonly storeGib: number;
  /** "on": quotas from the start; "off": refuse diskMb; "auto": on with the first sandbox that asks. */
  readonly diskQuota: 'on' | 'off' | 'auto';
  /** Build cache of recipe images. */
  readonly cacheDir: string;
  /** The criu binary (a 4.x wrapper). */
  readonly criuBinary: string;
  /** CRIU's log level for dumps and restores. */
  readonly criuLogLevel: number;
  /** Keep CRIU's restore logs in store/scratch. */
  readonly keepCriuLogs: boolean;
  /** The point where the manager kills itself (crash tests); validated by faults.ts. */
  readonly fault: string | undefined;
  /** The Docker engine's socket, for image import and export. */
  readonly dockerSocket: string;
  /** New sandboxes get a user namespace (root inside = an unprivileged host id range). */
  readonly userNamespaces: boolean;
  /** Store only the pages that changed since the head checkpoint (incremental process images; opt-in). */
  readonly pageDelta: boolean;
  /** Origins (scheme://host:port) the HTTP API may pull snapshots from; empty: pulls over HTTP are refused. */
  readonly pullSources: readonly string[];
}

/** Settings a caller may pass to open(); each beats its environment variable. */
export type ConfigOptions = { [K in keyof LockstepConfig]?: LockstepConfig[K] | undefined };

/**
 * Every environment variable Lockstep reads, and who reads it: the manager
 * (through LockstepConfig), `lockstep serve` (src/http/config.ts), the CLI,
 * or the provisioning scripts.
 */
export const ENVIRONMENT = {
  LOCKSTEP_HOME: { reader: 'manager', key: 'home' },
  LOCKSTEP_STANDBY: { reader: 'manager', key: 'standby' },
  LOCKSTEP_LOG_LEVEL: { reader: 'manager', key: 'logLevel' },
  LOCKSTEP_STORE_GIB: { reader: 'manager', key: 'storeGib' },
  LOCKSTEP_DISK_QUOTA: { reader: 'manager', key: 'diskQuota' },
  LOCKSTEP_CACHE: { reader: 'manager', key: 'cacheDir' },
  LOCKSTEP_CRIU: { reader: 'manager', key: 'criuBinary' },
  LOCKSTEP_CRIU_LOG_LEVEL: { reader: 'manager', key: 'criuLogLevel' },
  LOCKSTEP_KEEP_CRIU_LOGS: { reader: 'manager', key: 'keepCriuLogs' },
  LOCKSTEP_FAULT: { reader: 'manager', key: 'fault' },
  DOCKER_SOCKET: { reader: 'manager', key: 'dockerSocket' },
  LOCKSTEP_USERNS: { reader: 'manager', key: 'userNamespaces' },
  LOCKSTEP_PAGE_DELTA: { reader: 'manager', key: 'pageDelta' },
  LOCKSTEP_PULL_SOURCES: { reader: 'manager', key: 'pullSources' },
  LOCKSTEP_API_URL: { reader: 'client' },
  LOCKSTEP_API_KEY: { reader: 'client' },
  LOCKSTEP_CONFIG: { reader: 'serve' },
  LOCKSTEP_HOST: { reader: 'serve' },
  LOCKSTEP_PORT: { reader: 'serve' },
  LOCKSTEP_GRACE_MS: { reader: 'serve' },
  LOCKSTEP_METRICS_TOKEN: { reader: 'serve' },
  LOCKSTEP_METRICS_TOKEN_FILE: { reader: 'serve' },
  LOCKSTEP_DEBUG: { reader: 'cli' },
  NO_COLOR: { reader: 'cli' },
  CI: { reader: 'cli' },
  LOCKSTEP_CRIU_SUITE: { reader: 'provisioning' },
  LOCKSTEP_KEEP_CONNTRACK_HASHSIZE: { reader: 'provisioning' },
} as const satisfies Record<
  string,
  { reader: 'manager'; key: keyof LockstepConfig } | { reader: 'serve' | 'cli' | 'client' | 'provisioning' }
>;

/** A variable Lockstep reads. */
export type EnvironmentVariable = keyof typeof ENVIRONMENT;

type Env = Readonly<Record<string, string | undefined>>;

/** Reads one variable (for `serve` and the CLI, which resolve their own settings); unset and empty are the same. */
export function envValue(name: EnvironmentVariable, env: Env = process.env): string | undefined {
  return env[name] || undefined;
}

/** A setting that cannot be used: named by its option and its variable, so either can be fixed. */
function invalid(
  key: keyof LockstepConfig,
  variable: EnvironmentVariable,
  expected: string,
  received: unknown,
): HostError {
  return new HostError(
    'CONFIG_INVALID',
    `Invalid ${key} (${variable}): expected ${expected}, received ${JSON.stringify(received)}`,
    { details: { field: key, variable } },
  );
}

/** Options first, then the environment, then the defaults. */
export function resolveConfig(options: ConfigOptions = {}, env: Env = process.env): LockstepConfig {
  const e = (name: EnvironmentVariable) => envValue(name, env);
  // Any value but "on" and "off" has always meant "unset".
  const quota = options.diskQuota ?? e('LOCKSTEP_DISK_QUOTA');
  const diskQuota = quota === 'on' || quota === 'off' ? quota : 'auto';
  const criuLogLevel = options.criuLogLevel ?? Number(e('LOCKSTEP_CRIU_LOG_LEVEL') ?? DEFAULTS.criuLogLevel);
  if (!Number.isInteger(criuLogLevel) || criuLogLevel < 0 || criuLogLevel > 4)
    throw invalid('criuLogLevel', 'LOCKSTEP_CRIU_LOG_LEVEL', 'an integer from 0 to 4', criuLogLevel);
  const storeGib = options.storeGib ?? Number(e('LOCKSTEP_STORE_GIB') ?? DEFAULTS.storeGib);
  if (!Number.isFinite(storeGib) || storeGib <= 0)
    throw invalid('storeGib', 'LOCKSTEP_STORE_GIB', 'a positive number of GiB', storeGib);
  return {
    home: path.resolve(options.home ?? e('LOCKSTEP_HOME') ?? DEFAULTS.home),
    standby: options.standby ?? e('LOCKSTEP_STANDBY') !== 'off',
    logLevel: options.logLevel ?? e('LOCKSTEP_LOG_LEVEL') ?? DEFAULTS.logLevel,
    storeGib,
    diskQuota,
    cacheDir: options.cacheDir ?? e('LOCKSTEP_CACHE') ?? DEFAULTS.cacheDir,
    criuBinary: options.criuBinary ?? e('LOCKSTEP_CRIU') ?? DEFAULTS.criuBinary,
    criuLogLevel,
    keepCriuLogs: options.keepCriuLogs ?? e('LOCKSTEP_KEEP_CRIU_LOGS') !== undefined,
    fault: options.fault ?? e('LOCKSTEP_FAULT'),
    dockerSocket: options.dockerSocket ?? e('DOCKER_SOCKET') ?? DEFAULTS.dockerSocket,
    userNamespaces: options.userNamespaces ?? e('LOCKSTEP_USERNS') !== 'off',
    pageDelta: options.pageDelta ?? e('LOCKSTEP_PAGE_DELTA') === 'on',
    pullSources: options.pullSources ?? pullSources(e('LOCKSTEP_PULL_SOURCES')),
  };
}

/** "http://a:7300, http://b:7300" as origins; a value that is not an http(s) origin is CONFIG_INVALID. */
function pullSources(raw: string | undefined): string[] {
  if (!raw) return [];
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((s) => {
      let url: URL;
      try {
        url = new URL(s);
      } catch {
        throw invalid('pullSources', 'LOCKSTEP_PULL_SOURCES', 'comma-separated http(s) origins', s);
      }
      if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.pathname !== '/' || url.search)
        throw invalid('pullSources', 'LOCKSTEP_PULL_SOURCES', 'comma-separated http(s) origins', s);
      return url.origin;
    });
}
