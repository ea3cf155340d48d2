/**
 * Configuration of `lockstep serve`: a JSON file (default
 * /etc/lockstep/config.json, like Docker's daemon.json; deploy/config.json is
 * the shipped one), environment variables, then command-line flags. Each
 * setting is taken from the first of these that gives it:
 *
 *     flag  >  environment variable  >  configuration file  >  default
 *
 * so a unit's Environment= or a one-off flag overrides the file without
 * editing it. deploy/README.md lists every setting.
 */
import fs from 'node:fs';
import { z } from 'zod';
import { LockstepError } from '../errors.js';
import { DEFAULT_HOME } from '../paths.js';
import { DEFAULT_CONFIG_FILE, DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';

export { DEFAULT_CONFIG_FILE };
const MiB = 1024 * 1024;
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/** The configuration file or a setting is unusable; `field` names the setting. */
export class ConfigError extends LockstepError {
  readonly field: string;
  constructor(file: string | undefined, field: string, message: string, cause?: unknown) {
    super('CONFIG_INVALID', `${file ? `${file}: ` : ''}${message}`, { cause, details: { file, field } });
    this.field = field;
  }
}

const port = z.number().int().min(0).max(65535);
const bytes = z
  .number()
  .int()
  .min(1024)
  .max(1024 * MiB);

/** The file's schema: every key optional, no unknown keys (a typo must not be ignored silently). */
const FileSchema = z
  .object({
    host: z.string().min(1),
    port,
    stateDirectory: z.string().startsWith('/'),
    metricsTokenFile: z.string().startsWith('/'),
    logLevel: z.enum(LOG_LEVELS),
    graceMs: z.number().int().min(0).max(3_600_000),
    limits: z
      .object({
        /** Largest JSON request body. */
        bodyBytes: bytes,
        /** Largest file write, or checkpoint with its context. */
        fileBodyBytes: bytes,
      })
      .partial()
      .strict(),
  })
  .partial()
  .strict();

export type ConfigFile = z.infer<typeof FileSchema>;

/** The settings the server runs with. */
export interface ServeConfig {
  host: string;
  port: number;
  stateDirectory: string;
  /** Bearer token required on /metrics, or undefined (open, as on loopback). */
  metricsToken: string | undefined;
  logLevel: string;
  graceMs: number;
  bodyLimit: number;
  fileBodyLimit: number;
  /** Where each setting came from (flag, env, file, default), for the start-up log. */
  sources: Record<string, 'flag' | 'env' | 'file' | 'default'>;
}

/** Command-line values of `lockstep serve` (strings as parsed). */
export interface ServeFlags {
  host?: string | undefined;
  port?: string | undefined;
  home?: string | undefined;
  'metrics-token'?: string | undefined;
  'metrics-token-file'?: string | undefined;
  'log-level'?: string | undefined;
  'grace-ms'?: string | undefined;
}

/** Parses and checks a configuration file's text. */
export function parseConfigFile(text: string, file: string): ConfigFile {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(file, 'file', `not valid JSON (${(e as Error).message})`, e);
  }
  const r = FileSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const field = issue.path.join('.') || (issue.code === 'unrecognized_keys' ? '' : 'file');
    const keys = issue.code === 'unrecognized_keys' ? (issue as { keys: string[] }).keys : [];
    if (keys.length)
      throw new ConfigError(
        file,
        [field, keys[0]].filter(Boolean).join('.'),
        `unknown setting ${[field, keys[0]].filter(Boolean).join('.')}`,
      );
    throw new ConfigError(file, field, `invalid ${field}: ${issue.message}`);
  }
  return r.data;
}

/**
 * Reads the configuration file: the one named by --config or LOCKSTEP_CONFIG
 * must exist; the default one may be absent (then only defaults apply).
 */
export function loadConfigFile(explicit: string | undefined): { file: string | undefined; config: ConfigFile } {
  const file = explicit ?? DEFAULT_CONFIG_FILE;
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' && explicit === undefined)
      return { file: undefined, config: {} };
    throw new ConfigError(file, 'config', `cannot read the configuration file: ${(e as Error).message}`, e);
  }
  return { file, config: parseConfigFile(text, file) };
}

/** Reads a secret from a file that only its owner may read (like ssh's keys). */
export function readSecretFile(file: string, field: string): string {
  let st: fs.Stats;
  let text: string;
  try {
    st = fs.statSync(file);
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(undefined, field, `cannot read ${field} ${file}: ${(e as Error).message}`, e);
  }
  if ((st.mode & 0o077) !== 0)
    throw new ConfigError(
      undefined,
      field,
      `${field} ${file} is readable by other users (mode ${(st.mode & 0o777).toString(8)}): chmod 600 it`,
    );
  const token = text.trim();
  if (!token || /\s/.test(token))
    throw new ConfigError(undefined, field, `${field} ${file} must hold one token on one line`);
  return token;
}

function intSetting(value: string, field: string, min: number, max: number): number {
  const n = /^\d+$/.test(value.trim()) ? Number(value.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new ConfigError(
      undefined,
      field,
      `invalid ${field}: expected an integer from ${min} to ${max}, received ${JSON.stringify(value)}`,
    );
  return n;
}

/**
 * Merges flags, environment and file (in that order of precedence) over the
 * defaults. Pure apart from reading the metrics token file.
 */
export function resolveServeConfig(flags: ServeFlags, env: NodeJS.ProcessEnv, file: ConfigFile): ServeConfig {
  const sources: ServeConfig['sources'] = {};
  function pick<T>(name: string, flag: T | undefined, envValue: T | undefined, fileValue: T | undefined, dflt: T): T {
    if (flag !== undefined) return ((sources[name] = 'flag'), flag);
    if (envValue !== undefined && envValue !== '') return ((sources[name] = 'env'), envValue);
    if (fileValue !== undefined) return ((sources[name] = 'file'), fileValue);
    return ((sources[name] = 'default'), dflt);
  }
  const num = (v: string | undefined, field: string, min: number, max: number) =>
    v === undefined || v === '' ? undefined : intSetting(v, field, min, max);

  const host = pick('host', flags.host, env.LOCKSTEP_HOST, file.host, DEFAULT_HOST);
  const port = pick(
    'port',
    num(flags.port, '--port', 0, 65535),
    num(env.LOCKSTEP_PORT, 'LOCKSTEP_PORT', 0, 65535),
    file.port,
    DEFAULT_PORT,
  );
  const stateDirectory = pick('stateDirectory', flags.home, env.LOCKSTEP_HOME, file.stateDirectory, DEFAULT_HOME);
  const logLevel = pick('logLevel', flags['log-level'], env.LOCKSTEP_LOG_LEVEL, file.logLevel, 'info');
  if (!(LOG_LEVELS as readonly string[]).includes(logLevel))
    throw new ConfigError(
      undefined,
      'logLevel',
      `invalid log level ${JSON.stringify(logLevel)}: expected one of ${LOG_LEVELS.join(', ')}`,
    );
  const graceMs = pick(
    'graceMs',
    num(flags['grace-ms'], '--grace-ms', 0, 3_600_000),
    num(env.LOCKSTEP_GRACE_MS, 'LOCKSTEP_GRACE_MS', 0, 3_600_000),
    file.graceMs,
    30_000,
  );

  // The metrics token: a value or a file at each level, the value first.
  const token = ((): { value?: string; source: 'flag' | 'env' | 'file' | 'default' } => {
    if (flags['metrics-token'] !== undefined) return { value: flags['metrics-token'], source: 'flag' };
    if (flags['metrics-token-file'] !== undefined)
      return { value: readSecretFile(flags['metrics-token-file'], '--metrics-token-file'), source: 'flag' };
    if (env.LOCKSTEP_METRICS_TOKEN) return { value: env.LOCKSTEP_METRICS_TOKEN, source: 'env' };
    if (env.LOCKSTEP_METRICS_TOKEN_FILE)
      return { value: readSecretFile(env.LOCKSTEP_METRICS_TOKEN_FILE, 'LOCKSTEP_METRICS_TOKEN_FILE'), source: 'env' };
    if (file.metricsTokenFile !== undefined)
      return { value: readSecretFile(file.metricsTokenFile, 'metricsTokenFile'), source: 'file' };
    return { source: 'default' };
  })();
  const metricsToken = token.value;
  sources.metricsToken = token.source;

  return {
    host,
    port,
    stateDirectory,
    metricsToken,
    logLevel,
    graceMs,
    bodyLimit: file.limits?.bodyBytes ?? MiB,
    fileBodyLimit: file.limits?.fileBodyBytes ?? 16 * MiB,
    sources,
  };
}
