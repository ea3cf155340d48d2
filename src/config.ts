/**
 * One configuration object per manager. `Lockstep.open()` resolves it once,
 * from its options, then the environment, then the defaults; nothing below
 * the manager reads `process.env`, so two managers in one process can differ.
 * The README's table of environment variables is checked against
 * ENVIRONMENT (test/unit/config.test.ts), in both directions.
 */
import path from 'node:path';
import { HostError } from './errors.js';
import { parseCidr, ipv4ToInt } from './network/policy.js';

/** The defaults, for code that runs without a manager (setup, doctor) and for resolveConfig. */
export const DEFAULTS = {
  home: '/var/lib/lockstep',
  logLevel: 'warn',
  storeGib: 64,
  cacheDir: '/var/cache/lockstep',
  criuBinary: '/opt/lockstep/bin/criu',
  criuLogLevel: 2,
  dockerSocket: '/var/run/docker.sock',
  networkRange: '10.213.0.0/16',
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
  /** Private IPv4 range cut into one /31 per egress sandbox (src/network/addresses.ts). */
  readonly networkRange: string;
  /** CIDRs no egress sandbox may reach, on top of the built-in deny list (src/network/nftables.ts). */
  readonly networkDeny: readonly string[];
  /** Upstream DNS server (IPv4 address, optional :port) that egress sandboxes' resolver forwards allowed names to; undefined: the first IPv4 nameserver of /etc/resolv.conf. */
  readonly dnsUpstream: string | undefined;
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
  LOCKSTEP_NETWORK_RANGE: { reader: 'manager', key: 'networkRange' },
  LOCKSTEP_NETWORK_DENY: { reader: 'manager', key: 'networkDeny' },
  LOCKSTEP_DNS_UPSTREAM: { reader: 'manager', key: 'dnsUpstream' },
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
  const networkRange = options.networkRange ?? e('LOCKSTEP_NETWORK_RANGE') ?? DEFAULTS.networkRange;
  const range = parseCidr(networkRange);
  if (!range || range.text !== networkRange || range.bits < 8 || range.bits > 29 || !isPrivate(range.base))
    throw invalid(
      'networkRange',
      'LOCKSTEP_NETWORK_RANGE',
      'a private IPv4 CIDR (10/8, 172.16/12, 192.168/16 or 100.64/10) from /8 to /29, host bits zero',
      networkRange,
    );
  const denyRaw =
    options.networkDeny ??
    (e('LOCKSTEP_NETWORK_DENY') ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
  const networkDeny = denyRaw.map((c) => {
    const p = parseCidr(c);
    if (!p) throw invalid('networkDeny', 'LOCKSTEP_NETWORK_DENY', 'IPv4 CIDRs separated by commas', c);
    return p.text;
  });
  const dnsUpstream = options.dnsUpstream ?? e('LOCKSTEP_DNS_UPSTREAM');
  if (dnsUpstream !== undefined && !validUpstream(dnsUpstream))
    throw invalid('dnsUpstream', 'LOCKSTEP_DNS_UPSTREAM', 'an IPv4 address with an optional :port', dnsUpstream);
  return {
    networkRange,
    networkDeny,
    dnsUpstream,
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
  };
}

/** RFC 1918 and the shared address space (RFC 6598): ranges no public host uses. */
function isPrivate(base: number): boolean {
  const inRange = (cidr: string) => {
    const c = parseCidr(cidr)!;
    const mask = (0xffffffff << (32 - c.bits)) >>> 0;
    return (base & mask) >>> 0 === c.base;
  };
  return ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'].some(inRange);
}

function validUpstream(s: string): boolean {
  const [host, port, ...rest] = s.split(':');
  if (rest.length || host === undefined || ipv4ToInt(host) === undefined) return false;
  return port === undefined || (/^\d{1,5}$/.test(port) && Number(port) >= 1 && Number(port) <= 65535);
}
