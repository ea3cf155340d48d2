#!/usr/bin/env bash
# `npm run test:container`: the integration tests inside a privileged Docker
# container, the container route of docs/testing.md run for real.
#
#   scripts/test-container.sh [ava arguments]   # default: every integration test file
#   scripts/test-container.sh --image-only      # build (or find) the image, run nothing
#
# 1. The image. No registry is reachable, so it is made here: a Debian
#    bookworm root filesystem by debootstrap from the machine's own apt
#    sources (as sandbox-images/dev does) with the packages
#    scripts/provision-host.sh lists, the host's Node.js (the files of its
#    `nodejs` package) and the host's private CRIU prefix (/opt/lockstep,
#    built by provision-host.sh) copied in, then `docker import`. Its tag is
#    a hash of what went into it, so a second run reuses it; a change to the
#    recipe (RECIPE_VERSION), to provision-host.sh, to the CRIU provisioning
#    or to the Node version builds a new one.
# 2. The engine: scripts/start-dockerd.sh, the one the image tests use.
# 3. The run: `docker run --privileged` (where the host allows it, see below) with
#      --cgroupns=host -v /sys/fs/cgroup   sandbox cgroups are made (and frozen)
#                                          in the host's hierarchy, v1 and v2;
#      -v /dev:/dev                        loop devices for the btrfs store are
#                                          created on demand, after the
#                                          container started (a privileged
#                                          container's own /dev is a copy made
#                                          at start), and /dev/btrfs-control;
#      --init                              a pid 1 that reaps orphans;
#      --network host                      the image recipes (debootstrap of
#                                          "dev") reach the Debian mirror;
#                                          tests listen on loopback ports;
#      -v /var/run/docker.sock             the Docker import/export tests talk
#                                          to the host's engine (no Docker in
#                                          Docker);
#      a volume for /var/tmp               the tests' state directories (loop
#                                          files) on the host's disk, not on
#                                          overlay2; dropped with the container;
#      -v /var/cache/lockstep              the host's build cache of recipe
#                                          images (base, dev), which `npm test`
#                                          on the host has filled: the same
#                                          recipes give the same keys, so the
#                                          container builds none of them again;
#    the repository bind-mounted at /src. Inside, `scripts/setup.sh --images
#    base,dev` (everything already provisioned: it only checks, and builds
#    the images into the cache the first time), then ava.
# CI=true is passed through: a skipped integration test is then a failure.
#
# `--privileged` asks runc for every capability, CAP_SYS_RESOURCE included; a
# host whose root lacks it (these VMs: root has
# every capability except CAP_SYS_RESOURCE) refuses to start such a
# container ("unable to apply caps: operation not permitted"). There the
# script grants what --privileged grants, less that one capability: every
# other capability, no seccomp or AppArmor profile, unmasked /proc paths, and
# every device (-v /dev plus a device-cgroup rule). Lockstep itself never
# raises an rlimit, so the tests need nothing more.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCKSTEP_LOG_TAG="test:container"
# shellcheck source-path=SCRIPTDIR source=../sandbox-images/lib.sh
. "$root/sandbox-images/lib.sh"

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, docker run --privileged)"
[[ -x /opt/lockstep/bin/criu && -r /opt/lockstep/provisioned ]] || die "CRIU is not provisioned on this host: run scripts/provision-host.sh (or npm run setup) first"
command -v debootstrap >/dev/null || die "debootstrap not found: run scripts/provision-host.sh"
dpkg-query -W -f='${Status}' nodejs 2>/dev/null | grep -q 'install ok installed' ||
	die "the host's Node.js is not Debian's nodejs package; this script copies that package's files into the image"

SUITE=bookworm
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
REPO=lockstep-test-runner
CACHE=${LOCKSTEP_CACHE:-/var/cache/lockstep}

# The Debian packages provision-host.sh installs (its PKGS table, "name:file"),
# plus what a shell in the container uses.
mapfile -t provision_pkgs < <(awk '/^PKGS=\(/ { on = 1; next } on && /^\)/ { exit } on { sub(/^[ \t]+/, ""); split($0, a, ":"); if (a[1] != "") print a[1] }' "$root/scripts/provision-host.sh")
((${#provision_pkgs[@]} > 5)) || die "could not read the package list (PKGS) from scripts/provision-host.sh"
extra_pkgs=(util-linux mount procps kmod curl git)
include=$(IFS=,; printf '%s' "${provision_pkgs[*]},${extra_pkgs[*]}")

# Bump when the image's recipe below changes (the run options do not count).
RECIPE_VERSION=2
node_version=$(node --version)
key=$({
	printf 'recipe %s\n%s\n%s\n' "$RECIPE_VERSION" "$node_version" "$include"
	cat "$root/scripts/provision-host.sh" /opt/lockstep/provisioned
	cat /opt/lockstep/criu/.lockstep-criu 2>/dev/null || true
	cat /opt/lockstep/criu-wp/.criu-wp-track 2>/dev/null || true
} | sha256sum | cut -c1-16)
image="$REPO:$key"

bash "$root/scripts/start-dockerd.sh"
install -d -m 0755 "$CACHE"

if docker image inspect "$image" >/dev/null 2>&1; then
	log "reusing image $image"
else
	mirror=$(debian_mirror_uri) || die "cannot find the Debian mirror URI in the apt sources"
	rootfs=$(mktemp -d /var/tmp/lockstep-test-runner.XXXXXX)
	unmount_below() {
		awk -v r="$rootfs/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r |
			while IFS= read -r m; do umount -l -- "$m" 2>/dev/null || true; done
	}
	trap 'unmount_below; rm -rf -- "$rootfs"' EXIT
	cache_args=()
	if [[ -d /var/cache/apt/archives ]]; then cache_args=(--cache-dir=/var/cache/apt/archives); fi
	start=$SECONDS
	log "building $image: debootstrap --variant=minbase $SUITE (+ ${#provision_pkgs[@]} provisioned packages); a few minutes, once"
	if ! debootstrap --variant=minbase --include="$include" --keyring="$KEYRING" "${cache_args[@]}" \
		"$SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
		tail -n 30 "$rootfs.log" | sed "s/^/[$LOCKSTEP_LOG_TAG]   /" >&2
		die "debootstrap of $SUITE failed (whole log: $rootfs.log)"
	fi
	rm -f -- "$rootfs.log"
	unmount_below
	log "copying in the host's Node.js $node_version and /opt/lockstep (CRIU $(/opt/lockstep/bin/criu --version 2>/dev/null | awk '/Version/ { print $2 }'))"
	# Files (not directories) of the nodejs package, paths kept.
	dpkg -L nodejs | while IFS= read -r f; do [[ -f $f || -L $f ]] && printf '%s\n' "${f#/}"; done |
		tar -C / -cf - --no-recursion -T - | tar -C "$rootfs" -xf -
	# npm as the host has it: an `npm install -g npm` leaves files the package does not list.
	rm -rf -- "$rootfs/usr/lib/node_modules/npm"
	cp -a /usr/lib/node_modules/npm "$rootfs/usr/lib/node_modules/"
	cp -a /opt/lockstep "$rootfs/opt/"
	# Lockstep's CRIU build: the binaries and stamp, not its build tree.
	rm -rf -- "$rootfs/opt/lockstep/.provision.lock" "$rootfs/opt/lockstep/criu-wp/.build"
	install -d -m 0755 "$rootfs/usr/local/sbin"
	ln -sfn /opt/lockstep/bin/criu "$rootfs/usr/local/sbin/criu"
	# apt inside the container reads the same sources as the host.
	cp -a /etc/apt/sources.list.d/. "$rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
	[[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$rootfs/etc/apt/sources.list"
	rm -rf -- "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
	tar -C "$rootfs" --numeric-owner -cf - . |
		docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'CMD ["/bin/bash"]' --message "lockstep integration-test runner ($key)" - "$image" >/dev/null
	log "built $image in $((SECONDS - start)) s"
fi

# Images of earlier keys are stale: drop them (a running container keeps its own).
docker image ls --format '{{.Repository}}:{{.Tag}}' "$REPO" | grep -vxF "$image" | xargs -r docker image rm >/dev/null 2>&1 || true

if [[ ${1:-} == --image-only ]]; then
	printf '%s\n' "$image"
	exit 0
fi
if (($# == 0)); then set -- 'dist/test/integration/**/*.test.js'; fi

# --privileged, or the same less CAP_SYS_RESOURCE where the host cannot grant it.
if docker run --rm --privileged --network none "$image" true >/dev/null 2>&1; then
	priv_args=(--privileged)
else
	log "this host cannot grant --privileged (its root lacks CAP_SYS_RESOURCE): every other capability, unconfined, all devices"
	priv_args=(--cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined
		--security-opt systempaths=unconfined --device-cgroup-rule 'a *:* rwm')
fi

tty_args=()
if [[ -t 0 && -t 1 ]]; then tty_args=(-t); fi
# Settings the tests read, passed through when set.
env_args=(-e "LOCKSTEP_LOG_LEVEL=${LOCKSTEP_LOG_LEVEL:-error}")
for v in CI LOCKSTEP_STANDBY LOCKSTEP_CRIU_LOG_LEVEL LOCKSTEP_KEEP_CRIU_LOGS; do
	if [[ -n ${!v:-} ]]; then env_args+=(-e "$v=${!v}"); fi
done
name="lockstep-test-$$"
log "running the integration tests in $image (container $name)"
start=$SECONDS
set +e
docker run --rm "${tty_args[@]}" --name "$name" \
	"${priv_args[@]}" --init --network host --cgroupns host \
	-v /sys/fs/cgroup:/sys/fs/cgroup \
	-v /dev:/dev \
	-v /lib/modules:/lib/modules:ro \
	-v /var/run/docker.sock:/var/run/docker.sock \
	--mount type=volume,dst=/var/tmp \
	-v "$CACHE:/var/cache/lockstep" \
	-v "$root:/src" -w /src \
	"${env_args[@]}" \
	"$image" bash -c 'npm --version >/dev/null && bash scripts/setup.sh --images base,dev && exec node_modules/.bin/ava "$@"' test-container "$@"
rc=$?
set -e
log "container run finished in $((SECONDS - start)) s (exit $rc)"
exit "$rc"
