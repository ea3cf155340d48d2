#!/usr/bin/env bash
# Install everything a Lockstep host needs. Idempotent; must run as root.
# `lockstep setup` runs it (it ships in the npm package); `--check` only
# reports what is missing (exit 0: nothing; 1: something) and changes nothing.
#
# Called at the start of every `npm test` and `npm run demo`, so the common
# case (everything already in place) is a handful of file tests and one read,
# with no forks. Real work is done only when something is missing or this
# script's PROVISION_VERSION changed; progress then goes to stderr with a
# "[provision]" prefix.
#
# What it installs:
#  - Debian (bookworm) packages: btrfs-progs, busybox-static, debootstrap,
#    protobuf-c headers/compiler, iproute2, iptables, docker.io (pulls in
#    containerd, runc, tini), e2fsprogs, xz-utils, zstd, ca-certificates,
#    libseccomp-dev and libcap-dev (the helper's syscall filter and
#    capability sets), nftables (egress sandboxes' policy) and libmnl-dev
#    (the addon moves a restored sandbox's veth over netlink), and the toolchain the native build needs (g++, make,
#    python3 for node-gyp, libc6-dev for the static init), and clang-format
#    (`npm run lint` checks the C and C++ sources with it).
#  - CRIU 4.2 from Debian forky (testing) into a private prefix, /opt/lockstep/criu,
#    together with its libc and criu's other runtime libraries: bookworm's
#    criu 3.17 fails `criu check` on this kernel; trixie's 4.1.1 cannot dump
#    an IPv4/IPv6 socket on Linux >= 6.16 ("Can't get 1:16 opt": SO_PASSCRED
#    is refused on inet sockets since 6.16, fixed in CRIU 4.2); and a newer
#    criu needs a newer libc, so it must not be installed system-wide.
#    LOCKSTEP_CRIU_SUITE picks another Debian suite. It runs through
#    the private dynamic loader via the wrapper /opt/lockstep/bin/criu, which
#    is linked as /usr/local/sbin/criu for Docker/runc.
#  - /opt/lockstep/libcriu/{libcriu.so.2,libcriu.so,include/}: trixie's libcriu
#    (needs only GLIBC_2.14, so it links into a bookworm-built addon; its
#    libprotobuf-c.so.1 comes from bookworm). The addon builds with
#    -I/opt/lockstep/libcriu/include -L/opt/lockstep/libcriu -lcriu
#    -Wl,-rpath,/opt/lockstep/libcriu.
# It starts no daemons (see scripts/start-dockerd.sh).
set -euo pipefail

# Bump whenever what this script installs changes: a different stamp forces
# the slow path once on every machine.
CRIU_SUITE=${LOCKSTEP_CRIU_SUITE:-forky}
PROVISION_VERSION="lockstep-provision 3 (criu 4.2 from $CRIU_SUITE, criu-wp)"

LS=/opt/lockstep
STAMP=$LS/provisioned
CRIU_PREFIX=$LS/criu
LIBCRIU_DIR=$LS/libcriu
APT_DIR=$LS/apt
# Lockstep's CRIU build with written-page tracking (native/criu/build-criu.sh):
# what checkpoints dump with. Its sources ship with the package.
CRIU_WP=$LS/criu-wp
CRIU_WP_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../native/criu" && pwd)

# package:file pairs; the file proves the package is usable. The lib* ones at
# the end are the shared libraries Lockstep's CRIU build (native/criu/) links
# against, so that it runs wherever this list is installed (the test
# container's image is made from it: scripts/test-container.sh). No comments
# inside the list: that script reads it with awk.
PKGS=(
	btrfs-progs:/bin/btrfs
	busybox-static:/bin/busybox
	debootstrap:/usr/sbin/debootstrap
	libprotobuf-c-dev:/usr/include/protobuf-c/protobuf-c.h
	protobuf-c-compiler:/usr/bin/protoc-c
	iproute2:/sbin/ip
	iptables:/usr/sbin/iptables
	docker.io:/usr/sbin/dockerd
	e2fsprogs:/sbin/mkfs.ext4
	xz-utils:/usr/bin/xz
	zstd:/usr/bin/zstd
	ca-certificates:/etc/ssl/certs/ca-certificates.crt
	g++:/usr/bin/g++
	make:/usr/bin/make
	python3:/usr/bin/python3
	python3-pytest:/usr/bin/pytest-3
	libc6-dev:/usr/lib/x86_64-linux-gnu/libc.a
	libseccomp-dev:/usr/include/seccomp.h
	libcap-dev:/usr/include/sys/capability.h
	nftables:/usr/sbin/nft
	libmnl-dev:/usr/include/libmnl/libmnl.h
	clang-format:/usr/bin/clang-format
	libbsd0:/usr/lib/x86_64-linux-gnu/libbsd.so.0
	libgnutls30:/usr/lib/x86_64-linux-gnu/libgnutls.so.30
	libnet1:/usr/lib/x86_64-linux-gnu/libnet.so.1
	libnftables1:/usr/lib/x86_64-linux-gnu/libnftables.so.1
	libnl-3-200:/usr/lib/x86_64-linux-gnu/libnl-3.so.200
	libprotobuf-c1:/usr/lib/x86_64-linux-gnu/libprotobuf-c.so.1
	libuuid1:/usr/lib/x86_64-linux-gnu/libuuid.so.1
)
PROVIDED=(
	/usr/bin/containerd /usr/sbin/runc
	"$LS/bin/criu" /usr/local/sbin/criu
	"$LIBCRIU_DIR/libcriu.so.2" "$LIBCRIU_DIR/libcriu.so" "$LIBCRIU_DIR/include/criu.h"
	"$CRIU_WP/criu" "$CRIU_WP/wp-keeper"
)

CHECK_ONLY=0
if [[ ${1:-} == --check ]]; then CHECK_ONLY=1; fi

# ---- host tuning (every run; a read and at most one write) -----------------
# CRIU walks the kernel's global conntrack hash table twice per dump (it dumps
# conntrack entries of the sandbox's network namespace, even an empty one):
# with the 262144 buckets the kernel picks for a 24 GiB machine that costs
# ~9 ms per walk, more than half of an idle sandbox's checkpoint; 16384
# buckets cost ~0.6 ms (measured, docs/decisions/conntrack-hashsize.md). The table resizes
# live and this host runs Docker with --iptables=false. Not persistent across
# reboots; set LOCKSTEP_KEEP_CONNTRACK_HASHSIZE=1 to leave the host's value.
CT_HASHSIZE=/sys/module/nf_conntrack/parameters/hashsize
CT_TARGET=16384
if ((!CHECK_ONLY)) && [[ -z ${LOCKSTEP_KEEP_CONNTRACK_HASHSIZE:-} && -w $CT_HASHSIZE && $(id -u) -eq 0 ]]; then
	read -r ct_now <"$CT_HASHSIZE" || ct_now=0
	if ((ct_now > CT_TARGET)); then
		echo "$CT_TARGET" >"$CT_HASHSIZE" && echo "[provision] conntrack hash table: $ct_now -> $CT_TARGET buckets (faster CRIU dumps)" >&2
	fi
fi

# Every network namespace shares the host's TCP established table (262144
# buckets on this machine) unless tcp_child_ehash_entries says otherwise:
# reading /proc/<pid>/net/tcp of a sandbox (an egress rollback reads it) walks
# all of it (5.3-5.9 ms with no socket), and so does CRIU's socket dump on
# every checkpoint. Namespaces made after this get tables of their own, sized
# like the conntrack table above; the host's own is untouched. Set
# LOCKSTEP_KEEP_SOCKET_HASHES=1 to leave both values as they are.
if ((!CHECK_ONLY)) && [[ -z ${LOCKSTEP_KEEP_SOCKET_HASHES:-} && $(id -u) -eq 0 ]]; then
	for knob in tcp_child_ehash_entries udp_child_hash_entries; do
		f=/proc/sys/net/ipv4/$knob
		[[ -w $f ]] || continue
		read -r now <"$f" || now=1
		if ((now == 0)); then
			echo 4096 >"$f" && echo "[provision] $knob: shared -> 4096 buckets per sandbox namespace (faster socket walks)" >&2
		fi
	done
fi

# ---- fast path: no forks --------------------------------------------------
all_present() {
	local p line=""
	for p in "${PKGS[@]}"; do [[ -e ${p#*:} ]] || return 1; done
	for p in "${PROVIDED[@]}"; do [[ -e $p ]] || return 1; done
	[[ -r $STAMP ]] && read -r line <"$STAMP" && [[ $line == "$PROVISION_VERSION" ]]
}
# The CRIU build is current when its stamp is newer than its sources
# (build-criu.sh compares their checksums, and touches the stamp when they match).
criu_wp_current() {
	local f
	for f in "$CRIU_WP_SRC/build-criu.sh" "$CRIU_WP_SRC"/*.patch "$CRIU_WP_SRC/wp-keeper.c"; do
		[[ $CRIU_WP/.criu-wp-track -nt $f ]] || return 1
	done
}
if all_present; then
	criu_wp_current && exit 0
	((CHECK_ONLY)) && { echo "not current: $CRIU_WP (sources in $CRIU_WP_SRC changed)" >&2; exit 1; }
	exec 9>"$LS/.provision.lock"
	flock 9
	bash "$CRIU_WP_SRC/build-criu.sh" "$CRIU_WP" || { echo "[provision] building Lockstep's CRIU (native/criu) failed" >&2; exit 1; }
	exit 0
fi
if ((CHECK_ONLY)); then
	for p in "${PKGS[@]}"; do [[ -e ${p#*:} ]] || echo "missing: ${p#*:} (Debian package ${p%%:*})" >&2; done
	for p in "${PROVIDED[@]}"; do [[ -e $p ]] || echo "missing: $p" >&2; done
	line=""
	[[ -r $STAMP ]] && read -r line <"$STAMP"
	[[ $line == "$PROVISION_VERSION" ]] || echo "not provisioned by this version: ${STAMP} says \"${line:-nothing}\", expected \"$PROVISION_VERSION\"" >&2
	exit 1
fi

# ---- slow path --------------------------------------------------------------
LOCKSTEP_LOG_TAG=provision
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../sandbox-images/lib.sh
. "$here/../sandbox-images/lib.sh"

[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages into the system and /opt/lockstep)"
export DEBIAN_FRONTEND=noninteractive

install -d -m 0755 -o root -g root "$LS" "$LS/bin"

# Serialise concurrent runs (npm test and npm run demo at once); once we hold
# the lock, another run may have finished everything.
exec 9>"$LS/.provision.lock"
flock 9
if all_present; then exit 0; fi
log "provisioning host ($PROVISION_VERSION)"

tmp=$(mktemp -d /tmp/lockstep-provision.XXXXXX)
chmod 0755 "$tmp"   # apt-get download runs as _apt and writes below it
policy_rc_created=0
cleanup() {
	rm -rf -- "$tmp"
	if ((policy_rc_created)); then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT

# Run a command quietly; on failure show its output and die.
run_quiet() {
	local what=$1 logf
	shift
	logf=$(mktemp "$tmp/log.XXXXXX")
	if ! "$@" >"$logf" 2>&1; then
		tail -n 40 "$logf" >&2
		die "$what failed: $*"
	fi
}

# ---- a. Debian packages -------------------------------------------------------
missing=()
names=()
for p in "${PKGS[@]}"; do names+=("${p%%:*}"); done
# dpkg-query prints nothing (and complains on stderr) for unknown packages.
declare -A status=()
while IFS=' ' read -r name st; do
	status[$name]=$st
done < <(dpkg-query -W -f='${Package} ${Status}\n' "${names[@]}" 2>/dev/null || true)
for p in "${PKGS[@]}"; do
	name=${p%%:*}
	if [[ ${status[$name]:-} != "install ok installed" || ! -e ${p#*:} ]]; then missing+=("$name"); fi
done
if ((${#missing[@]})); then
	log "installing Debian packages: ${missing[*]}"
	# Package postinsts (docker.io, containerd) would start their daemons
	# through invoke-rc.d; policy-rc.d exit 101 forbids that. Many images
	# already ship one; only add (and later remove) ours if none exists.
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\n# lockstep provision-host.sh: do not start services\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		policy_rc_created=1
	fi
	run_quiet "apt-get update" apt-get update -q
	run_quiet "apt-get install" apt-get install -y -q --no-install-recommends "${missing[@]}"
	if ((policy_rc_created)); then rm -f /usr/sbin/policy-rc.d; policy_rc_created=0; fi
	for p in "${PKGS[@]}"; do
		[[ -e ${p#*:} ]] || die "package ${p%%:*} installed but ${p#*:} is missing"
	done
fi
for f in /usr/bin/containerd /usr/sbin/runc; do
	[[ -e $f ]] || die "$f is missing (it should come with docker.io)"
done

# ---- b. CRIU 4.x from trixie into a private prefix ---------------------------
CRIU_PKGS=(criu libcompel1 libcriu2)   # their runtime closure is resolved below
CRIU_DEV_PKGS=(libcriu-dev)            # headers only; its own deps are not needed
CRIU_STAMP="criu-prefix 2: ${CRIU_PKGS[*]} ${CRIU_DEV_PKGS[*]} + closure, $CRIU_SUITE"
LIBDIRS="$CRIU_PREFIX/usr/lib/x86_64-linux-gnu:$CRIU_PREFIX/lib/x86_64-linux-gnu"

# find_ldso PREFIX: trixie is usr-merged, the loader may live in several places.
find_ldso() {
	local c
	for c in "$1/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$1/usr/lib64/ld-linux-x86-64.so.2" \
		"$1/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$1/lib64/ld-linux-x86-64.so.2"; do
		# must resolve inside the prefix: the package's symlinks are relative
		if [[ -f $c ]]; then printf '%s\n' "$c"; return 0; fi
	done
	return 1
}

criu_prefix_ok() {
	local line=""
	[[ -r $CRIU_PREFIX/.lockstep-criu ]] && read -r line <"$CRIU_PREFIX/.lockstep-criu" &&
		[[ $line == "$CRIU_STAMP" && -x $CRIU_PREFIX/usr/sbin/criu ]] && find_ldso "$CRIU_PREFIX" >/dev/null
}

if ! criu_prefix_ok; then
	mirror=$(debian_mirror_uri) || die "cannot find the Debian mirror URI in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"
	log "fetching CRIU from $CRIU_SUITE (mirror read from apt sources)"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	# bookworm's debian-archive-keyring (2023.3+deb12u1 and later) already
	# holds the trixie archive keys, so trixie's InRelease verifies with it.
	[[ -r $keyring ]] || die "$keyring is missing (package debian-archive-keyring)"

	# A private apt configuration: its own sources, lists, caches and an empty
	# dpkg status, so the system's apt state is never read or written.
	install -d -m 0755 "$APT_DIR" "$APT_DIR/state" "$APT_DIR/cache" \
		"$APT_DIR/lists/partial" "$APT_DIR/archives/partial"
	printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$CRIU_SUITE" >"$APT_DIR/sources.list"
	: >"$APT_DIR/state/status"
	cat >"$APT_DIR/apt.conf" <<EOF
// Private apt configuration of scripts/provision-host.sh (CRIU from trixie).
Dir::Etc::SourceList "$APT_DIR/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "/dev/null";
Dir::State "$APT_DIR/state";
Dir::State::Lists "$APT_DIR/lists";
Dir::State::status "$APT_DIR/state/status";
Dir::Cache "$APT_DIR/cache";
Dir::Cache::Archives "$APT_DIR/archives";
// The system's hooks (PackageKit, AppStream refresh) are about the system
// package state, not ours.
#clear APT::Update::Post-Invoke-Success;
#clear APT::Update::Post-Invoke;
#clear DPkg::Post-Invoke;
EOF
	apt_priv=(-c "$APT_DIR/apt.conf")

	run_quiet "apt-get update (private trixie lists)" apt-get "${apt_priv[@]}" update -q

	# Runtime closure: Depends and Pre-Depends, recursively. Virtual packages
	# appear as <name> and are skipped (their providers are listed too).
	mapfile -t closure < <(
		apt-cache "${apt_priv[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
			--no-breaks --no-replaces --no-enhances "${CRIU_PKGS[@]}" |
			awk '/^[a-z0-9]/ { print $1 }' | sort -u
	)
	((${#closure[@]} >= ${#CRIU_PKGS[@]})) || die "could not resolve the dependency closure of criu"
	log "criu closure: ${closure[*]} ${CRIU_DEV_PKGS[*]}"

	dl=$tmp/debs
	mkdir -p "$dl"
	# apt downloads as the _apt user
	if id _apt >/dev/null 2>&1; then chown _apt: "$dl"; fi
	(cd "$dl" && run_quiet "apt-get download (trixie)" apt-get "${apt_priv[@]}" download -q "${closure[@]}" "${CRIU_DEV_PKGS[@]}")

	# Extract into a fresh directory, then swap it in.
	new=$CRIU_PREFIX.new
	rm -rf -- "$new"
	install -d -m 0755 "$new"
	for deb in "$dl"/*.deb; do dpkg -x "$deb" "$new"; done
	chmod 0755 "$new"
	ldso=$(find_ldso "$new") || die "trixie's libc6 has no ld-linux-x86-64.so.2"
	[[ -x $new/usr/sbin/criu ]] || die "criu package has no usr/sbin/criu"
	printf '%s\n' "$CRIU_STAMP" >"$new/.lockstep-criu"
	rm -rf -- "$CRIU_PREFIX"
	mv -- "$new" "$CRIU_PREFIX"
	# The lists are only needed while downloading.
	rm -rf -- "$APT_DIR/lists" "$APT_DIR/cache" "$APT_DIR/archives"
fi
ldso=$(find_ldso "$CRIU_PREFIX")

# ---- c. wrapper on PATH -----------------------------------------------------------
wrapper=$LS/bin/criu
cat >"$wrapper.tmp" <<EOF
#!/bin/sh
# Written by Lockstep's scripts/provision-host.sh: trixie's criu with its own
# libc, loaded through its own dynamic loader (never installed system-wide).
exec "$ldso" --library-path "$LIBDIRS" "$CRIU_PREFIX/usr/sbin/criu" "\$@"
EOF
chmod 0755 "$wrapper.tmp"
mv -f "$wrapper.tmp" "$wrapper"
install -d -m 0755 /usr/local/sbin
ln -sfn "$wrapper" /usr/local/sbin/criu

# criu prints this on every call here (no CAP_SYS_RESOURCE); it is harmless.
criu_noise='RLIMIT_NOFILE'
version=$("$wrapper" --version 2>&1 | grep -v "$criu_noise" || true)
[[ $version =~ Version:\ 4\. ]] || die "criu --version did not report 4.x: $version"
log "criu: $(printf '%s' "$version" | tr '\n' ' ')"
if check=$("$wrapper" check 2>&1); then
	log "criu check: $(printf '%s\n' "$check" | grep -v "$criu_noise" | tail -n 1)"
else
	log "WARNING: criu check reported problems (continuing):"
	printf '%s\n' "$check" | grep -v "$criu_noise" | sed 's/^/[provision]   /' >&2
fi

# ---- d. libcriu for the native addon -----------------------------------------------
triplet_lib=$CRIU_PREFIX/usr/lib/x86_64-linux-gnu
[[ -e $triplet_lib/libcriu.so.2 ]] || die "libcriu2 has no libcriu.so.2"
[[ -f $CRIU_PREFIX/usr/include/criu/criu.h ]] || die "libcriu-dev has no include/criu/criu.h"
newlib=$LIBCRIU_DIR.new
rm -rf -- "$newlib"
install -d -m 0755 "$newlib" "$newlib/include"
cp -L -- "$triplet_lib/libcriu.so.2" "$newlib/libcriu.so.2"   # a copy, not a link into the prefix
chmod 0644 "$newlib/libcriu.so.2"
ln -s libcriu.so.2 "$newlib/libcriu.so"
# criu.h, rpc.pb-c.h, version.h, rpc.proto, ...: whatever libcriu-dev ships.
cp -L -- "$CRIU_PREFIX"/usr/include/criu/* "$newlib/include/"
if [[ ! -e $newlib/include/rpc.proto ]]; then
	proto=$(find "$CRIU_PREFIX/usr" -name rpc.proto -print -quit)
	if [[ -n $proto ]]; then cp -- "$proto" "$newlib/include/"; fi
fi
chmod 0644 "$newlib"/include/*
rm -rf -- "$LIBCRIU_DIR"
mv -- "$newlib" "$LIBCRIU_DIR"

# Link and run a tiny client exactly the way the addon is built.
if command -v gcc >/dev/null 2>&1; then
	cat >"$tmp/criuver.c" <<'EOF'
#include <stdio.h>
#include <criu.h>
int main(void)
{
	if (criu_init_opts() < 0)
		return 2;
	int v = criu_get_version();
	printf("%d\n", v);
	return v > 0 ? 0 : 1;
}
EOF
	run_quiet "compiling a libcriu test program" gcc -Wall -o "$tmp/criuver" "$tmp/criuver.c" \
		-I"$LIBCRIU_DIR/include" -L"$LIBCRIU_DIR" -lcriu -Wl,-rpath,"$LIBCRIU_DIR"
	# criu_get_version() runs `criu swrk` found on PATH.
	if ! libver=$(PATH="/usr/local/sbin:$PATH" "$tmp/criuver" 2>"$tmp/criuver.err"); then
		cat "$tmp/criuver.err" >&2
		die "libcriu test program failed (criu_get_version: ${libver:-none})"
	fi
	((libver >= 40000)) || die "libcriu reports criu version $libver, expected 4.x"
	log "libcriu: criu_get_version() = $libver"
	rm -f -- "$tmp/criuver" "$tmp/criuver.c"
else
	log "WARNING: gcc not found; skipped the libcriu link test"
fi

# ---- e. Lockstep's CRIU build (written-page tracking) ----------------------------------
# Needs the bookworm -dev packages it lists (apt-get) and criu's source package
# (a private deb-src line); about 30 s on 2 cores here, nothing when current.
bash "$CRIU_WP_SRC/build-criu.sh" "$CRIU_WP" || die "building Lockstep's CRIU (native/criu) failed"

# ---- f. permissions, stamp -------------------------------------------------------------
chown root:root "$LS"
chmod 0755 "$LS"
all_present_but_stamp() {
	local p
	for p in "${PKGS[@]}"; do [[ -e ${p#*:} ]] || return 1; done
	for p in "${PROVIDED[@]}"; do [[ -e $p ]] || return 1; done
}
all_present_but_stamp || die "provisioning finished but something is still missing"
printf '%s\n' "$PROVISION_VERSION" >"$STAMP.tmp"
mv -f "$STAMP.tmp" "$STAMP"
log "done"
