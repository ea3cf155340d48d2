#!/usr/bin/env node
// Builds Lockstep's native parts (the addon, lockstep-helper and the static
// lockstep-init, lockstep-relay) with node-gyp. npm runs it as the package's `install`
// script; `lockstep setup` runs it with --required after provisioning the
// host. Why a build at install time and not prebuilt binaries:
// docs/decisions/install-build.md, "Installing: a build at install time".
//
// Under npm it never fails for something `lockstep setup` provides (a C/C++
// toolchain, CRIU's library): it records why it did not build in
// build/install-skipped.txt, which the error of Lockstep.open() quotes, and
// exits 0 so that `npx lockstep setup` can then be run from the installed
// package. A compile error is a real failure and fails the install.
// Plain JavaScript with no dependencies: it runs before anything is compiled.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const required = process.argv.includes('--required');
const force = process.argv.includes('--force');
const note = path.join(root, 'build', 'install-skipped.txt');
const outputs = ['lockstep.node', 'lockstep-helper', 'lockstep-init', 'lockstep-relay'].map((f) =>
  path.join(root, 'build', 'Release', f),
);
// The gyp variable of binding.gyp; scripts/provision-host.sh installs it there.
const libcriuDir = process.env.npm_config_libcriu_dir || '/opt/lockstep/libcriu';
const SETUP = '`npx lockstep setup` as root';

const say = (line) => process.stderr.write(`lockstep: ${line}\n`);

/** Not building now: say why, remember it for Lockstep.open(), and let npm carry on. */
function skip(reason, fix = `run ${SETUP}: it installs what is missing and builds them`) {
  if (required) {
    say(`cannot build the native parts: ${reason}`);
    process.exit(1);
  }
  fs.mkdirSync(path.dirname(note), { recursive: true });
  fs.writeFileSync(note, `${reason}\n`);
  say(`not building the native parts now: ${reason}.`);
  say(fix);
  process.exit(0);
}

function onPath(cmd) {
  return (process.env.PATH || '').split(':').some((dir) => {
    try {
      fs.accessSync(path.join(dir || '.', cmd), fs.constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** Newest modification time under the given paths (the build's inputs). */
function newestInput(paths) {
  let newest = 0;
  const walk = (p) => {
    const st = fs.statSync(p, { throwIfNoEntry: false });
    if (!st) return;
    if (st.isDirectory()) for (const e of fs.readdirSync(p)) walk(path.join(p, e));
    else newest = Math.max(newest, st.mtimeMs);
  };
  for (const p of paths) walk(p);
  return newest;
}

function upToDate() {
  const built = outputs.map((f) => fs.statSync(f, { throwIfNoEntry: false }));
  if (built.some((st) => !st)) return false;
  const oldestOutput = Math.min(...built.map((st) => st.mtimeMs));
  return newestInput([path.join(root, 'binding.gyp'), path.join(root, 'native')]) <= oldestOutput;
}

if (process.platform !== 'linux' || process.arch !== 'x64') {
  skip(
    `Lockstep runs on Linux x86_64 only (this is ${process.platform}-${process.arch})`,
    'Lockstep.open() will refuse with UNSUPPORTED_PLATFORM; the package is installed for its types only',
  );
}
if (!force && upToDate()) {
  if (required) say('native parts already built');
  process.exit(0);
}

const missing = [];
for (const [cmd, pkg] of [
  ['python3', 'python3'],
  ['make', 'make'],
  ['g++', 'g++'],
  ['cc', 'gcc'],
])
  if (!onPath(cmd)) missing.push(pkg);
// lockstep-init and lockstep-relay are linked statically.
if (!['/usr/lib/x86_64-linux-gnu/libc.a', '/usr/lib64/libc.a', '/usr/lib/libc.a'].some((f) => fs.existsSync(f)))
  missing.push('libc6-dev');
// The helper's syscall filter is compiled with libseccomp at build time; its capability sets use libcap.
if (!fs.existsSync('/usr/include/seccomp.h')) missing.push('libseccomp-dev');
if (!fs.existsSync('/usr/include/sys/capability.h')) missing.push('libcap-dev');
if (missing.length) skip(`the build tools are missing (Debian packages: ${missing.join(', ')})`);
if (!fs.existsSync(path.join(libcriuDir, 'include', 'criu.h')) || !fs.existsSync(path.join(libcriuDir, 'libcriu.so'))) {
  skip(
    `CRIU's library is not installed yet (${libcriuDir}; the addon links it)`,
    `run ${SETUP}: it installs CRIU first, then builds them`,
  );
}

let nodeGyp;
try {
  nodeGyp = createRequire(path.join(root, 'package.json')).resolve('node-gyp/bin/node-gyp.js');
} catch {
  nodeGyp = process.env.npm_config_node_gyp; // npm's own copy, set for lifecycle scripts
}
if (!nodeGyp || !fs.existsSync(nodeGyp))
  skip('node-gyp is not installed (a dependency of lockstep)', 'reinstall lockstep without --omit=prod');

const args = [nodeGyp, 'rebuild'];
// The headers of the running Node, when they ship next to it (official
// tarballs, NodeSource packages): node-gyp would otherwise download them.
const prefix = path.resolve(path.dirname(process.execPath), '..');
if (!process.env.npm_config_nodedir && fs.existsSync(path.join(prefix, 'include', 'node', 'node_api.h')))
  args.push(`--nodedir=${prefix}`);

const logFile = path.join(os.tmpdir(), `lockstep-build-${process.pid}.log`);
const log = fs.openSync(logFile, 'w', 0o600);
say('building the native parts (addon, helper, init, relay) with node-gyp');
const started = Date.now();
const r = spawnSync(process.execPath, args, { cwd: root, stdio: ['ignore', log, log] });
fs.closeSync(log);
if (r.status !== 0) {
  const tail = fs.readFileSync(logFile, 'utf8').trimEnd().split('\n').slice(-30).join('\n');
  process.stderr.write(`${tail}\n`);
  say(`building the native parts failed (node-gyp exited with ${r.status ?? r.signal}); the whole log is ${logFile}`);
  process.exit(1);
}
fs.rmSync(logFile, { force: true });
fs.rmSync(note, { force: true });
say(`native parts built in ${((Date.now() - started) / 1000).toFixed(1)} s`);
