/** One configuration object: options beat the environment, which beats the defaults; docs/configuration.md's table is the list. */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULTS, ENVIRONMENT, resolveConfig } from '../../src/config.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** docs/configuration.md's table: each variable with its default cell. */
function documentedVariables(): Map<string, string> {
  const text = fs.readFileSync(path.join(root, 'docs', 'configuration.md'), 'utf8');
  const table = text.slice(text.indexOf('# Configuration\n'));
  const out = new Map<string, string>();
  for (const line of table.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    if (cells.length < 4 || !cells[1]!.startsWith('`')) continue;
    for (const m of cells[1]!.matchAll(/`([A-Z][A-Z0-9_]*)`/g)) out.set(m[1]!, cells[3]!);
  }
  return out;
}

test("docs/configuration.md's table lists exactly the variables Lockstep reads", (t) => {
  const documented = [...documentedVariables().keys()].sort();
  t.true(documented.length > 10, 'the table was not found');
  t.deepEqual(documented, Object.keys(ENVIRONMENT).sort());
});

test("docs/configuration.md's defaults are the manager's defaults", (t) => {
  const table = documentedVariables();
  const defaults = resolveConfig({}, {});
  for (const [name, v] of Object.entries(ENVIRONMENT)) {
    if (!('key' in v) || !(v.key in DEFAULTS)) continue;
    t.true(
      table.get(name)!.includes(String(defaults[v.key])),
      `${name}: docs/configuration.md says ${table.get(name)}, the code ${String(defaults[v.key])}`,
    );
  }
});

// lockstep/client runs in the caller's process, often on another machine, and may
// import nothing of the server (test/unit/client-transport.test.ts): it reads its
// own two variables, which ENVIRONMENT lists with reader 'client'.
const OWN_READERS = [`src${path.sep}config.ts`, `src${path.sep}client${path.sep}transport.ts`];

test('every variable named in src/ and bin/ is in the list, and only src/config.ts (and the remote client) reads process.env.LOCKSTEP_*', (t) => {
  const files = (dir: string): string[] =>
    fs
      .readdirSync(dir, { withFileTypes: true })
      .flatMap((e) => (e.isDirectory() ? files(path.join(dir, e.name)) : [path.join(dir, e.name)]));
  const unknown = new Set<string>();
  const direct: string[] = [];
  for (const file of [...files(path.join(root, 'src')), ...files(path.join(root, 'bin'))]) {
    const text = fs.readFileSync(file, 'utf8');
    for (const m of text.matchAll(/\bLOCKSTEP_[A-Z0-9_]+/g)) if (!(m[0] in ENVIRONMENT)) unknown.add(m[0]);
    if (!OWN_READERS.some((f) => file.endsWith(f)) && /process\.env\.LOCKSTEP_/.test(text))
      direct.push(path.relative(root, file));
  }
  t.deepEqual([...unknown], []);
  t.deepEqual(direct, []);
});

test('options beat the environment, which beats the defaults', (t) => {
  const env = {
    LOCKSTEP_HOME: '/srv/ls',
    LOCKSTEP_STANDBY: 'off',
    LOCKSTEP_CRIU_LOG_LEVEL: '4',
    LOCKSTEP_DISK_QUOTA: 'on',
    LOCKSTEP_KEEP_CRIU_LOGS: '1',
  };
  const fromEnv = resolveConfig({}, env);
  t.like(fromEnv, {
    home: '/srv/ls',
    standby: false,
    criuLogLevel: 4,
    diskQuota: 'on',
    keepCriuLogs: true,
    storeGib: 64,
  });
  const fromOptions = resolveConfig({ home: 'rel/dir', standby: true, criuLogLevel: 1 }, env);
  t.like(fromOptions, { home: path.resolve('rel/dir'), standby: true, criuLogLevel: 1, diskQuota: 'on' });
  t.like(resolveConfig({}, {}), {
    home: DEFAULTS.home,
    standby: true,
    diskQuota: 'auto',
    keepCriuLogs: false,
    fault: undefined,
  });
  // An empty variable is unset, as a shell's `VAR= cmd` means.
  t.is(resolveConfig({}, { LOCKSTEP_HOME: '' }).home, DEFAULTS.home);
});

test('a setting that cannot be used is refused, naming the option and the variable', (t) => {
  const e1 = t.throws(() => resolveConfig({}, { LOCKSTEP_CRIU_LOG_LEVEL: 'loud' }));
  t.is((e1 as { code?: string }).code, 'CONFIG_INVALID');
  t.regex(e1!.message, /criuLogLevel \(LOCKSTEP_CRIU_LOG_LEVEL\)/);
  const e2 = t.throws(() => resolveConfig({ storeGib: -1 }, {}));
  t.regex(e2!.message, /storeGib \(LOCKSTEP_STORE_GIB\)/);
  // Values other than on/off have always meant "unset" for the disk quota.
  t.is(resolveConfig({}, { LOCKSTEP_DISK_QUOTA: 'maybe' }).diskQuota, 'auto');
});

test('trusted bundle keys and the snapshot store come through the manager configuration', (t) => {
  const key = `ed25519:${'A'.repeat(43)}`;
  const c = resolveConfig({}, { LOCKSTEP_TRUSTED_BUNDLE_KEYS: ` ${key} ,`, LOCKSTEP_SNAPSHOT_STORE: '/srv/bundles' });
  t.deepEqual(c.trustedBundleKeys, [key]);
  t.is(c.snapshotStore.url, '/srv/bundles');
  t.deepEqual(resolveConfig({}, {}).trustedBundleKeys, [], 'none but the host’s own by default');
  t.is(resolveConfig({}, {}).snapshotStore.url, undefined);
  for (const bad of ['ed25519:short', 'rsa:' + 'A'.repeat(43), key + 'x']) {
    const e = t.throws(() => resolveConfig({}, { LOCKSTEP_TRUSTED_BUNDLE_KEYS: bad }));
    t.is((e as { code?: string }).code, 'CONFIG_INVALID');
    t.regex(e!.message, /trustedBundleKeys \(LOCKSTEP_TRUSTED_BUNDLE_KEYS\)/);
  }
  const e = t.throws(() => resolveConfig({}, { LOCKSTEP_STORE_CHUNK_MIB: '0' }));
  t.regex(e!.message, /LOCKSTEP_STORE_CHUNK_MIB/);
});
