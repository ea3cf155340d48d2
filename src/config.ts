/**
 * One configuration object per manager. `Lockstep.open()` resolves it once,
 * from its options, then the environment, then the defaults; nothing below
 * the manager reads `process.env`, so two managers in one process can differ.
 * The table of environment variables in docs/configuration.md is checked against
 * ENVIRONMENT (test/unit/config.test.ts), in both directions.
 */
import os from 'node:os';
import path from 'node:path';
import { HostError } from './errors.js';
import { parseCidr, ipv4ToInt } from './host/network/policy.js';

/** The defaults, for code that runs without a manager (setup, doctor) and for resolveConfig. */
export const DEFAULTS = {
  home: '/var/lib/lockstep',
  logLevel: 'warn',
  storeGib: 64,
  cacheDir: '/var/cache/lockstep',
  /** Lockstep's CRIU build (native/criu/, installed by setup): stock CRIU 4.2.1 plus written-page tracking. */
  criuBinary: '/opt/lockstep/criu-wp/criu',
  /** Where provisioning puts stock CRIU 4.2.1 (used when written-page tracking is off). */
  stockCriuBinary: '/opt/lockstep/bin/criu',
  /** Holds each tracked process's userfaultfd between dumps (native/criu/wp-keeper.c). */
  wpKeeper: '/opt/lockstep/criu-wp/wp-keeper',
  criuLogLevel: 2,
  dockerSocket: '/var/run/docker.sock',
  networkRange: '10.213.0.0/16',
  /** Disk limit of a sandbox's writable layer when its create names none (MiB). */
  diskMb: 2048,
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
  /**
   * "off": no btrfs quotas, diskMb refused, no default disk limit. Otherwise
   * ("on", or unset: "auto") quotas are on from the moment the store is
   * opened, on Lockstep's own loop-mounted store, so every writable layer
   * has a limit and every checkpoint's layer bytes are counted; a state
   * directory on a host btrfs has them if its administrator enabled them.
   */
  readonly diskQuota: 'on' | 'off' | 'auto';
  /**
   * Disk limit (MiB) of a writable layer whose create names none
   * (LOCKSTEP_DEFAULT_DISK_MB; default 2048): no sandbox can fill the store
   * that every tenant shares. Applied wherever quotas can be had.
   */
  readonly defaultDiskMb: number;
  /** Build cache of recipe images. */
  readonly cacheDir: string;
  /** The criu binary: Lockstep's build with written-page tracking, or stock 4.x when wpKeeper is null. */
  readonly criuBinary: string;
  /**
   * The written-page keeper (LOCKSTEP_WP_KEEPER, a path, or "off"). With it,
   * a checkpoint dumps only the pages its processes wrote since the previous
   * one (parent-linked images); null: every checkpoint dumps every page.
   */
  readonly wpKeeper: string | null;
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
  /** Store only the pages that changed since the head checkpoint (incremental process images; on by default). */
  readonly pageDelta: boolean;
  /**
   * A checkpoint returns once it can be rolled back to (layer snapshot, dump
   * and catalog row done); syncfs and checksums follow in the background.
   * false: each checkpoint is durable and checksummed before it returns.
   */
  readonly durableLater: boolean;
  /**
   * Host-wide bound on the memory of all warm standbys of this state
   * directory, in bytes (LOCKSTEP_STANDBY_BUDGET_MB; default a quarter of
   * the host's memory). Past it the least recently used standbys are evicted.
   */
  readonly standbyBudgetBytes: number;
  /**
   * Prepare a standby after every checkpoint (true), or only after a
   * rollback (false: an agent that checkpoints each step and rarely rolls
   * back then pays no CRIU restore per step; its first rollback to a
   * checkpoint restores with CRIU, later ones to the same checkpoint swap),
   * or 'auto': after a checkpoint or rollback only when most of the
   * sandbox's recent ones were followed by a rollback to that very
   * checkpoint (standby-policy.ts, standbyWanted).
   */
  readonly standbyAfterCheckpoint: boolean | 'auto';
  /** Origins (scheme://host:port) the HTTP API may pull snapshots from; empty: pulls over HTTP are refused. */
  readonly pullSources: readonly string[];
  /** The snapshot store push and pull use (LOCKSTEP_SNAPSHOT_STORE and the S3 settings beside it). */
  readonly snapshotStore: SnapshotStoreConfig;
  /**
   * Public keys (`ed25519:<base64url>`) whose signed bundles an import accepts,
   * besides this state directory's own key; every other bundle is BUNDLE_UNTRUSTED.
   */
  readonly trustedBundleKeys: readonly string[];
  /** Private IPv4 range cut into one /31 per egress sandbox (src/host/network/addresses.ts). */
  readonly networkRange: string;
  /** CIDRs no egress sandbox may reach, on top of the built-in deny list (src/host/network/nftables.ts). */
  readonly networkDeny: readonly string[];
  /** Upstream DNS server (IPv4 address, optional :port) that egress sandboxes' resolver forwards allowed names to; undefined: the first IPv4 nameserver of /etc/resolv.conf. */
  readonly dnsUpstream: string | undefined;
  /**
   * Where `lockstep serve` is reached from outside (`http(s)://host[:port]`):
   * the base of exposed ports' URLs (src/network/exposed-ports.ts). Unset:
   * the SDK and CLI print `http://127.0.0.1:7878`, the server the request's own Host.
   */
  readonly publicUrl: string | undefined;
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
  LOCKSTEP_DEFAULT_DISK_MB: { reader: 'manager', key: 'defaultDiskMb' },
  LOCKSTEP_CACHE: { reader: 'manager', key: 'cacheDir' },
  LOCKSTEP_CRIU: { reader: 'manager', key: 'criuBinary' },
  LOCKSTEP_WP_KEEPER: { reader: 'manager', key: 'wpKeeper' },
  LOCKSTEP_CRIU_LOG_LEVEL: { reader: 'manager', key: 'criuLogLevel' },
  LOCKSTEP_KEEP_CRIU_LOGS: { reader: 'manager', key: 'keepCriuLogs' },
  LOCKSTEP_FAULT: { reader: 'manager', key: 'fault' },
  DOCKER_SOCKET: { reader: 'manager', key: 'dockerSocket' },
  LOCKSTEP_USERNS: { reader: 'manager', key: 'userNamespaces' },
  LOCKSTEP_PAGE_DELTA: { reader: 'manager', key: 'pageDelta' },
  LOCKSTEP_DURABLE_LATER: { reader: 'manager', key: 'durableLater' },
  LOCKSTEP_STANDBY_BUDGET_MB: { reader: 'manager', key: 'standbyBudgetBytes' },
  LOCKSTEP_STANDBY_AFTER_CHECKPOINT: { reader: 'manager', key: 'standbyAfterCheckpoint' },
  LOCKSTEP_PULL_SOURCES: { reader: 'manager', key: 'pullSources' },
  LOCKSTEP_TRUSTED_BUNDLE_KEYS: { reader: 'manager', key: 'trustedBundleKeys' },
  LOCKSTEP_NETWORK_RANGE: { reader: 'manager', key: 'networkRange' },
  LOCKSTEP_NETWORK_DENY: { reader: 'manager', key: 'networkDeny' },
  LOCKSTEP_DNS_UPSTREAM: { reader: 'manager', key: 'dnsUpstream' },
  LOCKSTEP_PUBLIC_URL: { reader: 'manager', key: 'publicUrl' },
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
  LOCKSTEP_SNAPSHOT_STORE: { reader: 'store' },
  LOCKSTEP_STORE_CHUNK_MIB: { reader: 'store' },
  LOCKSTEP_S3_ENDPOINT: { reader: 'store' },
  LOCKSTEP_S3_REGION: { reader: 'store' },
  LOCKSTEP_S3_FORCE_PATH_STYLE: { reader: 'store' },
  LOCKSTEP_S3_ACCESS_KEY_ID: { reader: 'store' },
  LOCKSTEP_S3_SECRET_ACCESS_KEY: { reader: 'store' },
  LOCKSTEP_CRIU_SUITE: { reader: 'provisioning' },
  LOCKSTEP_KEEP_CONNTRACK_HASHSIZE: { reader: 'provisioning' },
  LOCKSTEP_KEEP_SOCKET_HASHES: { reader: 'provisioning' },
} as const satisfies Record<
  string,
  { reader: 'manager'; key: keyof LockstepConfig } | { reader: 'serve' | 'cli' | 'client' | 'provisioning' | 'store' }
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

/** The build cache of recipe images as the environment sets it (for the CLI's `image cache` and `setup`, which open no manager). */
export function buildCacheDir(env: Env = process.env): string {
  return envValue('LOCKSTEP_CACHE', env) ?? DEFAULTS.cacheDir;
}

/** Options first, then the environment, then the defaults. */
export function resolveConfig(options: ConfigOptions = {}, env: Env = process.env): LockstepConfig {
  const e = (name: EnvironmentVariable) => envValue(name, env);
  // Any value but "on" and "off" has always meant "unset".
  const quota = options.diskQuota ?? e('LOCKSTEP_DISK_QUOTA');
  const diskQuota = quota === 'on' || quota === 'off' ? quota : 'auto';
  const keeperRaw = options.wpKeeper !== undefined ? options.wpKeeper : e('LOCKSTEP_WP_KEEPER');
  const wpKeeper =
    keeperRaw === undefined ? DEFAULTS.wpKeeper : keeperRaw === 'off' || keeperRaw === null ? null : keeperRaw;
  if (wpKeeper !== null && !path.isAbsolute(wpKeeper))
    throw invalid('wpKeeper', 'LOCKSTEP_WP_KEEPER', 'an absolute path or "off"', wpKeeper);
  const criuLogLevel = options.criuLogLevel ?? Number(e('LOCKSTEP_CRIU_LOG_LEVEL') ?? DEFAULTS.criuLogLevel);
  if (!Number.isInteger(criuLogLevel) || criuLogLevel < 0 || criuLogLevel > 4)
    throw invalid('criuLogLevel', 'LOCKSTEP_CRIU_LOG_LEVEL', 'an integer from 0 to 4', criuLogLevel);
  const storeGib = options.storeGib ?? Number(e('LOCKSTEP_STORE_GIB') ?? DEFAULTS.storeGib);
  if (!Number.isFinite(storeGib) || storeGib <= 0)
    throw invalid('storeGib', 'LOCKSTEP_STORE_GIB', 'a positive number of GiB', storeGib);
  const defaultDiskMb = options.defaultDiskMb ?? Number(e('LOCKSTEP_DEFAULT_DISK_MB') ?? DEFAULTS.diskMb);
  if (!Number.isInteger(defaultDiskMb) || defaultDiskMb < 1 || defaultDiskMb > 1 << 24)
    throw invalid(
      'defaultDiskMb',
      'LOCKSTEP_DEFAULT_DISK_MB',
      'an integer number of MiB from 1 to 16777216',
      defaultDiskMb,
    );
  const afterCheckpoint = e('LOCKSTEP_STANDBY_AFTER_CHECKPOINT');
  if (afterCheckpoint !== undefined && !['on', 'off', 'auto'].includes(afterCheckpoint))
    throw invalid('standbyAfterCheckpoint', 'LOCKSTEP_STANDBY_AFTER_CHECKPOINT', 'on, off or auto', afterCheckpoint);
  const standbyAfterCheckpoint =
    options.standbyAfterCheckpoint ?? (afterCheckpoint === 'auto' ? 'auto' : afterCheckpoint !== 'off');
  const budgetMb = e('LOCKSTEP_STANDBY_BUDGET_MB');
  const standbyBudgetBytes =
    options.standbyBudgetBytes ?? (budgetMb === undefined ? Math.floor(os.totalmem() / 4) : Number(budgetMb) * 2 ** 20);
  if (!Number.isFinite(standbyBudgetBytes) || standbyBudgetBytes < 0)
    throw invalid(
      'standbyBudgetBytes',
      'LOCKSTEP_STANDBY_BUDGET_MB',
      'a number of MiB, 0 or more',
      options.standbyBudgetBytes ?? budgetMb,
    );
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
  const publicUrl = options.publicUrl ?? e('LOCKSTEP_PUBLIC_URL');
  if (publicUrl !== undefined && !/^https?:\/\/[A-Za-z0-9.[\]:-]+(:\d{1,5})?$/.test(publicUrl))
    throw invalid(
      'publicUrl',
      'LOCKSTEP_PUBLIC_URL',
      'an origin such as https://lockstep.example.com:7878 (no path)',
      publicUrl,
    );
  return {
    networkRange,
    networkDeny,
    dnsUpstream,
    publicUrl,
    home: path.resolve(options.home ?? e('LOCKSTEP_HOME') ?? DEFAULTS.home),
    standby: options.standby ?? e('LOCKSTEP_STANDBY') !== 'off',
    logLevel: options.logLevel ?? e('LOCKSTEP_LOG_LEVEL') ?? DEFAULTS.logLevel,
    storeGib,
    diskQuota,
    defaultDiskMb,
    cacheDir: options.cacheDir ?? buildCacheDir(env),
    wpKeeper,
    criuBinary:
      options.criuBinary ?? e('LOCKSTEP_CRIU') ?? (wpKeeper === null ? DEFAULTS.stockCriuBinary : DEFAULTS.criuBinary),
    criuLogLevel,
    keepCriuLogs: options.keepCriuLogs ?? e('LOCKSTEP_KEEP_CRIU_LOGS') !== undefined,
    fault: options.fault ?? e('LOCKSTEP_FAULT'),
    dockerSocket: options.dockerSocket ?? e('DOCKER_SOCKET') ?? DEFAULTS.dockerSocket,
    userNamespaces: options.userNamespaces ?? e('LOCKSTEP_USERNS') !== 'off',
    pageDelta: options.pageDelta ?? e('LOCKSTEP_PAGE_DELTA') === 'on',
    durableLater: options.durableLater ?? e('LOCKSTEP_DURABLE_LATER') !== 'off',
    standbyBudgetBytes,
    standbyAfterCheckpoint,
    pullSources: options.pullSources ?? pullSources(e('LOCKSTEP_PULL_SOURCES')),
    snapshotStore: options.snapshotStore ?? resolveStoreConfig({}, env),
    trustedBundleKeys: options.trustedBundleKeys ?? bundleKeys(e('LOCKSTEP_TRUSTED_BUNDLE_KEYS')),
  };
}

/** A bundle-signing public key as Lockstep writes it: `ed25519:` and the 32 raw bytes in base64url. */
export const BUNDLE_KEY = /^ed25519:[A-Za-z0-9_-]{43}$/;

/** "ed25519:…, ed25519:…" as keys; anything else is CONFIG_INVALID. */
function bundleKeys(raw: string | undefined): string[] {
  if (!raw) return [];
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((k) => {
      if (!BUNDLE_KEY.test(k))
        throw invalid(
          'trustedBundleKeys',
          'LOCKSTEP_TRUSTED_BUNDLE_KEYS',
          'comma-separated keys as `lockstep snapshot key` prints them (ed25519:…)',
          k,
        );
      return k;
    });
}

/** Where snapshot bundles are stored (src/snapshots/), and how to reach it. */
export interface SnapshotStoreConfig {
  /** `s3://BUCKET[/PREFIX]`, `file:///DIR` or an absolute folder; undefined: none configured. */
  readonly url: string | undefined;
  /** Size of the chunks a bundle is cut into. */
  readonly chunkBytes: number;
  readonly s3: {
    /** An S3-compatible server's URL; undefined: AWS's endpoint for the region. */
    readonly endpoint: string | undefined;
    readonly region: string;
    readonly forcePathStyle: boolean;
    /** Undefined: the AWS SDK's default chain (AWS_* variables, profiles, web identity). */
    readonly credentials: { readonly accessKeyId: string; readonly secretAccessKey: string } | undefined;
  };
}

/** Store settings a caller may pass; each beats its environment variable. */
export interface SnapshotStoreOptions {
  url?: string | undefined;
  chunkMib?: number | undefined;
  s3Endpoint?: string | undefined;
  s3Region?: string | undefined;
  s3ForcePathStyle?: boolean | undefined;
  s3AccessKeyId?: string | undefined;
  s3SecretAccessKey?: string | undefined;
}

export const STORE_DEFAULTS = { chunkMib: 8, s3Region: 'us-east-1' } as const;

function invalidStore(variable: EnvironmentVariable, expected: string, received: unknown): HostError {
  return new HostError(
    'CONFIG_INVALID',
    `Invalid ${variable}: expected ${expected}, received ${JSON.stringify(received)}`,
    { details: { variable } },
  );
}

/** The snapshot store's settings: options, then the environment, then the defaults. */
export function resolveStoreConfig(options: SnapshotStoreOptions = {}, env: Env = process.env): SnapshotStoreConfig {
  const e = (name: EnvironmentVariable) => envValue(name, env);
  const chunkMib = options.chunkMib ?? Number(e('LOCKSTEP_STORE_CHUNK_MIB') ?? STORE_DEFAULTS.chunkMib);
  if (!Number.isInteger(chunkMib) || chunkMib < 1 || chunkMib > 4096)
    throw invalidStore('LOCKSTEP_STORE_CHUNK_MIB', 'an integer number of MiB from 1 to 4096', chunkMib);
  const endpoint = options.s3Endpoint ?? e('LOCKSTEP_S3_ENDPOINT');
  if (endpoint !== undefined && !/^https?:\/\/[^/]+/.test(endpoint))
    throw invalidStore('LOCKSTEP_S3_ENDPOINT', 'an http:// or https:// URL', endpoint);
  const pathStyle = e('LOCKSTEP_S3_FORCE_PATH_STYLE');
  if (pathStyle !== undefined && pathStyle !== 'on' && pathStyle !== 'off')
    throw invalidStore('LOCKSTEP_S3_FORCE_PATH_STYLE', '"on" or "off"', pathStyle);
  const accessKeyId = options.s3AccessKeyId ?? e('LOCKSTEP_S3_ACCESS_KEY_ID');
  const secretAccessKey = options.s3SecretAccessKey ?? e('LOCKSTEP_S3_SECRET_ACCESS_KEY');
  if ((accessKeyId === undefined) !== (secretAccessKey === undefined))
    throw invalidStore(
      accessKeyId === undefined ? 'LOCKSTEP_S3_ACCESS_KEY_ID' : 'LOCKSTEP_S3_SECRET_ACCESS_KEY',
      'both LOCKSTEP_S3_ACCESS_KEY_ID and LOCKSTEP_S3_SECRET_ACCESS_KEY, or neither',
      'only one of them',
    );
  return {
    url: options.url ?? e('LOCKSTEP_SNAPSHOT_STORE'),
    chunkBytes: chunkMib * 1024 * 1024,
    s3: {
      endpoint,
      region: options.s3Region ?? e('LOCKSTEP_S3_REGION') ?? STORE_DEFAULTS.s3Region,
      // S3-compatible servers (MinIO, Ceph RGW, ...) mostly need path-style URLs; AWS prefers virtual hosts.
      forcePathStyle: options.s3ForcePathStyle ?? (pathStyle ? pathStyle === 'on' : endpoint !== undefined),
      credentials: accessKeyId && secretAccessKey ? { accessKeyId, secretAccessKey } : undefined,
    },
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
