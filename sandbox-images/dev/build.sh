#!/usr/bin/env bash
# Build the "dev" sandbox image: Debian bookworm minbase with python3, git,
# gcc, libc6-dev, make, procps and ca-certificates.
#
#   sandbox-images/dev/build.sh OUTDIR
#
# Runs as root and fills the existing, empty OUTDIR with a root filesystem made
# by debootstrap from the machine's configured Debian mirror (read from the apt
# sources at run time). Outside OUTDIR it only uses a temporary directory that
# it removes and apt's package cache (/var/cache/apt/archives, via
# debootstrap --cache-dir, so rebuilds do not download again).
set -euo pipefail

LOCKSTEP_LOG_TAG="image dev"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh
. "$here/../lib.sh"

SUITE=bookworm
INCLUDE=python3,git,gcc,libc6-dev,make,procps,ca-certificates
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

require_root
out=${1:-}
require_empty_outdir "$out"
out=$(cd "$out" && pwd)
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: run scripts/provision-host.sh"
[[ -r $KEYRING ]] || die "$KEYRING is missing (package debian-archive-keyring)"
mirror=$(debian_mirror_uri) || die "cannot find the Debian mirror URI in the apt sources"

tmp=$(mktemp -d /tmp/lockstep-image-dev.XXXXXX)
# debootstrap mounts /proc and /sys inside the target and normally unmounts
# them itself; make sure nothing stays mounted below OUTDIR if it dies.
unmount_below() {
	local m
	# deepest first
	awk -v r="$out/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r |
		while IFS= read -r m; do umount -l -- "$m" 2>/dev/null || true; done
}
trap 'unmount_below; rm -rf -- "$tmp"' EXIT

cache_args=()
if [[ -d /var/cache/apt/archives ]]; then cache_args=(--cache-dir=/var/cache/apt/archives); fi

start=$SECONDS
log "debootstrap --variant=minbase $SUITE (+ $INCLUDE); this takes a few minutes"
# The full output (one line per package) goes to a log; only the stage
# headlines are shown.
set +e
debootstrap --variant=minbase --include="$INCLUDE" --keyring="$KEYRING" "${cache_args[@]}" \
	"$SUITE" "$out" "$mirror" 2>&1 |
	tee "$tmp/debootstrap.log" |
	{
		grep --line-buffered -E '^(I: (Retrieving (In)?Release|Resolving dependencies|Checking component|Installing (core|base)|Base system installed)|E: |W: )' |
			sed -u "s/^/[$LOCKSTEP_LOG_TAG] /" >&2
		true
	}
rc=${PIPESTATUS[0]}
set -e
if ((rc != 0)) || ! grep -q '^I: Base system installed successfully' "$tmp/debootstrap.log"; then
	log "debootstrap failed; last lines of its output:"
	tail -n 30 "$tmp/debootstrap.log" | sed "s/^/[$LOCKSTEP_LOG_TAG]   /" >&2
	if [[ -f $out/debootstrap/debootstrap.log ]]; then
		log "last lines of $out/debootstrap/debootstrap.log:"
		tail -n 30 "$out/debootstrap/debootstrap.log" | sed "s/^/[$LOCKSTEP_LOG_TAG]   /" >&2
	fi
	die "debootstrap of $SUITE into $out failed"
fi
unmount_below
log "debootstrap done in $((SECONDS - start)) s"

log "cleaning up"
# Package caches and lists are only useful with network access, which
# sandboxes do not have; they are most of the size otherwise.
rm -rf "$out"/var/cache/apt/archives/*.deb "$out"/var/cache/apt/archives/partial/* \
	"$out"/var/cache/apt/*.bin "$out"/var/lib/apt/lists/* "$out/debootstrap"
mkdir -p "$out/var/lib/apt/lists/partial"
# Host-specific files that debootstrap copies from the host.
rm -f "$out/etc/hostname" "$out/etc/resolv.conf"
# Logs of the bootstrap itself.
find "$out/var/log" -type f -delete
# Documentation, manual pages and message translations are ~90 MB of the
# image and of no use to an agent in a sandbox (they would be copied up or
# snapshotted with every sandbox). Copyright files stay.
find "$out/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$out/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$out"/usr/share/man/* "$out"/usr/share/info/* "$out"/usr/share/locale/*/

rootfs_finish "$out"

# Smoke test without running anything from the image on the host: the tools
# must be there.
for f in usr/bin/python3 usr/bin/git usr/bin/gcc usr/bin/make usr/bin/ps usr/include/stdio.h \
	etc/ssl/certs/ca-certificates.crt; do
	[[ -e $out/$f ]] || die "image is missing /$f"
done
log "done in $((SECONDS - start)) s: $(du -sh "$out" | cut -f1) in $out"
