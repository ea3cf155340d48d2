#!/usr/bin/env bash
# Builds CRIU 4.2.1 with Lockstep's write-protect tracking patch
# (criu-4.2.1-wp-track.patch) and the fd keeper (wp-keeper.c), and installs
# OUTDIR/criu and OUTDIR/wp-keeper.
#
#   native/criu/build-criu.sh OUTDIR
#
# The source is Debian forky's source package, fetched with a private apt
# configuration whose one deb-src line uses the URIs of the machine's
# /etc/apt/sources.list.d/debian.sources (no mirror host is written here).
# The orig tarball is checked against a pinned sha256. The build links
# against bookworm's -dev packages (installed with apt-get when missing).
# A second run with the same tarball, patch and keeper source does nothing.
set -euo pipefail

CRIU_VERSION=4.2.1
ORIG_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
ORIG_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
SUITE=forky
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# bookworm packages CRIU's Makefiles need.
BUILD_DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev uuid-dev)

die() { echo "build-criu: $*" >&2; exit 1; }
log() { echo "build-criu: $*" >&2; }

(($# == 1)) || die "usage: $0 OUTDIR"
HERE=$(cd "$(dirname "$0")" && pwd)
PATCH=$HERE/criu-${CRIU_VERSION}-wp-track.patch
KEEPER_SRC=$HERE/wp-keeper.c
[[ -r $PATCH ]] || die "missing $PATCH"
[[ -r $KEEPER_SRC ]] || die "missing $KEEPER_SRC"
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
WORK=$OUT/.build
STAMP=$OUT/.criu-wp-track
# RUNDIR: where CRIU caches its kernel-feature probe (criu.kdat). /run, as in
# Debian's build: the CRIU service runs with a tmpfs /run of its own
# (the supervisor's daemon-isolated), so the cache works there.
RUNDIR=/run
want_stamp="criu $CRIU_VERSION $ORIG_SHA256 rundir $RUNDIR patch $(sha256sum <"$PATCH" | cut -d' ' -f1) keeper $(sha256sum <"$KEEPER_SRC" | cut -d' ' -f1)"
if [[ -x $OUT/criu && -x $OUT/wp-keeper && -r $STAMP && $(<"$STAMP") == "$want_stamp" ]]; then
	touch "$STAMP" # newer than the sources again: provision-host.sh's fast path checks that
	log "up to date in $OUT"
	exit 0
fi

# ---- build dependencies (bookworm -dev packages only) ----
missing=()
for p in "${BUILD_DEPS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing build dependencies: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
fi

# ---- source: private apt configuration, one deb-src line ----
mkdir -p "$WORK"
SRC=$WORK/criu-$CRIU_VERSION
orig=$WORK/dl/$ORIG_TARBALL
if [[ ! -r $orig ]] || ! echo "$ORIG_SHA256  $orig" | sha256sum -c --quiet >/dev/null 2>&1; then
	# The URIs of the stanza that carries the main Debian suites (not -security).
	uris=$(awk '
		/^[[:space:]]*$/ { if (u != "" && s !~ /security/) { print u; exit } u = ""; s = ""; next }
		/^URIs:/ { sub(/^URIs:[[:space:]]*/, ""); u = $0 }
		/^Suites:/ { s = $0 }
		END { if (u != "" && s !~ /security/) print u }' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
	[[ -n $uris ]] || die "no URIs found in /etc/apt/sources.list.d/debian.sources"
	[[ -r $KEYRING ]] || die "$KEYRING is missing (package debian-archive-keyring)"
	apt_dir=$WORK/apt
	rm -rf "$apt_dir"
	mkdir -p "$apt_dir/lists/partial" "$WORK/dl"
	printf 'deb-src [signed-by=%s] %s %s main\n' "$KEYRING" "$uris" "$SUITE" >"$apt_dir/sources.list"
	apt_priv=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
	log "fetching criu's source package from $SUITE (URIs read from debian.sources)"
	apt-get "${apt_priv[@]}" update -q >&2 || die "apt-get update of the private $SUITE deb-src list failed"
	if id _apt >/dev/null 2>&1; then chown _apt: "$WORK/dl"; fi
	# Only the orig tarball is used: the Debian tarball of the indexed revision
	# has answered 404 when the pool had moved on, so apt-get's status is not
	# decisive; the tarball's presence and checksum are.
	(cd "$WORK/dl" && apt-get "${apt_priv[@]}" source --download-only -q criu >&2) ||
		log "apt-get source reported errors; checking whether $ORIG_TARBALL arrived"
	[[ -r $orig ]] || die "the source package fetched has no $ORIG_TARBALL (did $SUITE move past $CRIU_VERSION? found: $(ls "$WORK/dl" | tr '\n' ' '))"
	got=$(sha256sum <"$orig" | cut -d' ' -f1)
	[[ $got == "$ORIG_SHA256" ]] || die "$ORIG_TARBALL has sha256 $got, expected $ORIG_SHA256: not the tarball this patch was made for"
	rm -rf "$apt_dir"
fi

# ---- unpack, patch, build ----
rm -rf "$SRC"
mkdir -p "$SRC"
tar -xJf "$orig" -C "$SRC" --strip-components=1
(cd "$SRC" && patch -p1 --quiet --no-backup-if-mismatch <"$PATCH") || die "the patch does not apply to criu $CRIU_VERSION"
log "building criu (make -j2 criu)"
make -C "$SRC" -j2 RUNDIR="$RUNDIR" criu >"$WORK/make.log" 2>&1 ||
	{ tail -n 40 "$WORK/make.log" >&2; die "make criu failed (full log: $WORK/make.log)"; }
cc -O2 -Wall -Werror -o "$WORK/wp-keeper" "$KEEPER_SRC" || die "wp-keeper.c does not compile"
install -m 0755 "$SRC/criu/criu" "$OUT/criu"
install -m 0755 "$WORK/wp-keeper" "$OUT/wp-keeper"
printf '%s\n' "$want_stamp" >"$STAMP"
log "installed $OUT/criu ($("$OUT/criu" --version | tr '\n' ' ')) and $OUT/wp-keeper"
