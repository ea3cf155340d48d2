#!/usr/bin/env bash
# Everything `npm test`, `npm run demo` and `npm run bench` need, on a fresh
# clone of a fresh Debian 12 machine, as root. A clone needs two things an
# installed package already has, its npm dependencies and the TypeScript
# build; everything else is `lockstep setup` (src/cli/host-setup.ts): host
# packages and CRIU, the native build, and images (here into the build cache
# only: every test file makes its own state directory). Each step checks
# first and is skipped when already done, so a second run takes well under
# 5 seconds.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

log() { printf '[setup] %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
	echo "lockstep: setup needs root (it installs host packages and manages namespaces, cgroups and mounts)" >&2
	exit 1
fi

# 1. Host packages first: on a fresh machine npm ci needs the toolchain
# (`lockstep setup` runs this again below, in its fast path).
bash scripts/provision-host.sh

# true when any file under the given paths is newer than the stamp file
newer_than() {
	local stamp=$1
	shift
	[[ ! -e $stamp ]] && return 0
	[[ -n $(find "$@" -newer "$stamp" -print -quit 2>/dev/null) ]]
}

# 2. npm dependencies (npm ci keeps package-lock.json authoritative; it also
# runs scripts/install.js, the native build). Keyed by the lock file's
# content, so editing scripts in package.json does not reinstall everything.
lock_hash=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -d node_modules || $(cat node_modules/.lockstep-lock-hash 2>/dev/null) != "$lock_hash" ]]; then
	log "installing npm dependencies"
	npm ci --no-audit --no-fund >&2
	echo "$lock_hash" >node_modules/.lockstep-lock-hash
fi

# 3. TypeScript.
if newer_than dist/.tsbuildinfo src test bench demo tsconfig.json package.json; then
	log "compiling TypeScript"
	npx --no-install tsc -p tsconfig.json
	touch dist/.tsbuildinfo
fi

# 4. The rest: host packages, native build (rebuilt when binding.gyp or
# native/ changed), images: base always; more with --images a,b (npm test
# asks for dev too, so that no test has to build it).
images=base
if [[ ${1:-} == --images ]]; then images=${2:?--images needs a comma-separated list}; fi
node bin/lockstep.js setup --cache-only --images "$images"
