/**
 * `lockstep serve` settings: flag > environment > configuration file >
 * default, the file's schema, and the metrics token file's permissions.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  loadConfigFile,
  parseConfigFile,
  resolveServeConfig,
  type ConfigFile,
  type ServeFlags,
} from '../../src/http/config.js';
import { journalDestination, stderrIsJournal } from '../../src/log.js';

function tempDir(t: { teardown: (fn: () => void) => void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-config-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const FILE: ConfigFile = {
  host: '10.0.0.5',
  port: 9000,
  stateDirectory: '/srv/lockstep',
  logLevel: 'debug',
  graceMs: 5000,
  limits: { bodyBytes: 65536 },
};

const precedence = test.macro({
  exec(
    t,
    flags: ServeFlags,
    env: NodeJS.ProcessEnv,
    file: ConfigFile,
    expected: Partial<ReturnType<typeof resolveServeConfig>>,
  ) {
    t.like(resolveServeConfig(flags, env, file), expected);
  },
  title: (given = '') => `serve settings: ${given}`,
});

test(
  'defaults when nothing is given',
  precedence,
  {},
  {},
  {},
  {
    host: '127.0.0.1',
    port: 7878,
    stateDirectory: '/var/lib/lockstep',
    logLevel: 'info',
    graceMs: 30000,
    metricsToken: undefined,
    bodyLimit: 1024 * 1024,
    fileBodyLimit: 16 * 1024 * 1024,
    sources: {
      host: 'default',
      port: 'default',
      stateDirectory: 'default',
      logLevel: 'default',
      graceMs: 'default',
      metricsToken: 'default',
    },
  },
);
test('the file overrides the defaults', precedence, {}, {}, FILE, {
  host: '10.0.0.5',
  port: 9000,
  stateDirectory: '/srv/lockstep',
  logLevel: 'debug',
  graceMs: 5000,
  bodyLimit: 65536,
  sources: {
    host: 'file',
    port: 'file',
    stateDirectory: 'file',
    logLevel: 'file',
    graceMs: 'file',
    metricsToken: 'default',
  },
});
test(
  'the environment overrides the file',
  precedence,
  {},
  {
    LOCKSTEP_HOST: '0.0.0.0',
    LOCKSTEP_PORT: '7000',
    LOCKSTEP_HOME: '/data/ls',
    LOCKSTEP_LOG_LEVEL: 'warn',
    LOCKSTEP_GRACE_MS: '100',
    LOCKSTEP_METRICS_TOKEN: 'env-token',
  },
  FILE,
  {
    host: '0.0.0.0',
    port: 7000,
    stateDirectory: '/data/ls',
    logLevel: 'warn',
    graceMs: 100,
    metricsToken: 'env-token',
    sources: { host: 'env', port: 'env', stateDirectory: 'env', logLevel: 'env', graceMs: 'env', metricsToken: 'env' },
  },
);
test(
  'flags override the environment and the file',
  precedence,
  { host: '::1', port: '0', home: '/flag/home', 'log-level': 'error', 'grace-ms': '7', 'metrics-token': 'flag-token' },
  {
    LOCKSTEP_HOST: '0.0.0.0',
    LOCKSTEP_PORT: '7000',
    LOCKSTEP_HOME: '/data/ls',
    LOCKSTEP_LOG_LEVEL: 'warn',
    LOCKSTEP_METRICS_TOKEN: 'env-token',
  },
  FILE,
  {
    host: '::1',
    port: 0,
    stateDirectory: '/flag/home',
    logLevel: 'error',
    graceMs: 7,
    metricsToken: 'flag-token',
    sources: {
      host: 'flag',
      port: 'flag',
      stateDirectory: 'flag',
      logLevel: 'flag',
      graceMs: 'flag',
      metricsToken: 'flag',
    },
  },
);
test('an empty environment variable counts as unset', precedence, {}, { LOCKSTEP_PORT: '', LOCKSTEP_HOST: '' }, FILE, {
  host: '10.0.0.5',
  port: 9000,
});

test('bad values are refused with the setting named', (t) => {
  t.throws(() => resolveServeConfig({ port: '80x' }, {}, {}), { code: 'CONFIG_INVALID', message: /--port.*"80x"/ });
  t.throws(() => resolveServeConfig({}, { LOCKSTEP_PORT: '70000' }, {}), {
    code: 'CONFIG_INVALID',
    message: /LOCKSTEP_PORT/,
  });
  t.throws(() => resolveServeConfig({ 'log-level': 'loud' }, {}, {}), {
    code: 'CONFIG_INVALID',
    message: /log level "loud"/,
  });
});

test('the file must be JSON with known settings of the right types', (t) => {
  t.deepEqual(parseConfigFile('{"port": 1234, "limits": {"fileBodyBytes": 2097152}}', '/etc/x.json'), {
    port: 1234,
    limits: { fileBodyBytes: 2097152 },
  });
  t.like(
    t.throws(() => parseConfigFile('{"port": 1234,}', '/etc/x.json'), {
      code: 'CONFIG_INVALID',
      message: /^\/etc\/x\.json: not valid JSON/,
    }),
    { field: 'file' },
  );
  t.like(
    t.throws(() => parseConfigFile('{"prot": 1234}', '/etc/x.json'), {
      code: 'CONFIG_INVALID',
      message: /unknown setting prot/,
    }),
    { field: 'prot' },
  );
  t.like(
    t.throws(() => parseConfigFile('{"limits": {"bodyByte": 1}}', '/etc/x.json'), {
      code: 'CONFIG_INVALID',
      message: /unknown setting limits\.bodyByte/,
    }),
    { field: 'limits.bodyByte' },
  );
  t.like(
    t.throws(() => parseConfigFile('{"port": "1234"}', '/etc/x.json'), {
      code: 'CONFIG_INVALID',
      message: /invalid port/,
    }),
    { field: 'port' },
  );
  t.like(
    t.throws(() => parseConfigFile('{"stateDirectory": "relative/dir"}', '/etc/x.json'), { code: 'CONFIG_INVALID' }),
    { field: 'stateDirectory' },
  );
});

test('the shipped deploy/config.json is valid and matches the defaults it documents', (t) => {
  const shipped = parseConfigFile(
    fs.readFileSync(new URL('../../../deploy/config.json', import.meta.url), 'utf8'),
    'deploy/config.json',
  );
  t.like(resolveServeConfig({}, {}, shipped), {
    host: '127.0.0.1',
    port: 7878,
    stateDirectory: '/var/lib/lockstep',
    logLevel: 'info',
  });
});

test('a named configuration file must exist; the default one may be absent', (t) => {
  const dir = tempDir(t);
  t.throws(() => loadConfigFile(path.join(dir, 'missing.json')), {
    code: 'CONFIG_INVALID',
    message: /cannot read the configuration file/,
  });
  fs.writeFileSync(path.join(dir, 'c.json'), '{"port": 4242}');
  t.deepEqual(loadConfigFile(path.join(dir, 'c.json')), { file: path.join(dir, 'c.json'), config: { port: 4242 } });
});

test('the metrics token file is read, but refused when others may read it', (t) => {
  const dir = tempDir(t);
  const file = path.join(dir, 'metrics-token');
  fs.writeFileSync(file, 'tok_abc123\n', { mode: 0o600 });
  t.is(resolveServeConfig({}, {}, { metricsTokenFile: file }).metricsToken, 'tok_abc123');
  t.is(resolveServeConfig({}, { LOCKSTEP_METRICS_TOKEN_FILE: file }, {}).sources.metricsToken, 'env');
  fs.chmodSync(file, 0o644);
  t.throws(() => resolveServeConfig({ 'metrics-token-file': file }, {}, {}), {
    code: 'CONFIG_INVALID',
    message: /readable by other users \(mode 644\)/,
  });
  fs.chmodSync(file, 0o600);
  fs.writeFileSync(file, 'two words\n');
  t.throws(() => resolveServeConfig({}, {}, { metricsTokenFile: file }), {
    code: 'CONFIG_INVALID',
    message: /one token on one line/,
  });
});

test('under journald each JSON line gets its syslog priority prefix, and only there', (t) => {
  const out: string[] = [];
  const dest = journalDestination({ write: (s: string) => void out.push(s) });
  dest.write('{"level":50,"msg":"x"}\n');
  dest.write('{"level":30,"msg":"y"}\n');
  dest.write('{"level":40,"msg":"z"}\n');
  t.deepEqual(out, ['<3>{"level":50,"msg":"x"}\n', '<6>{"level":30,"msg":"y"}\n', '<4>{"level":40,"msg":"z"}\n']);
  t.false(stderrIsJournal({}));
  t.false(stderrIsJournal({ JOURNAL_STREAM: '1:2' }));
  const st = fs.fstatSync(2, { bigint: true });
  t.true(stderrIsJournal({ JOURNAL_STREAM: `${st.dev}:${st.ino}` }));
});
