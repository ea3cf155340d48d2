#!/usr/bin/env bash
# Build the "base" sandbox image: a tiny busybox userland.
#
#   sandbox-images/base/build.sh OUTDIR
#
# Runs as root and fills the existing, empty OUTDIR with a root filesystem made
# from Debian's busybox-static package (downloaded from the machine's configured
# Debian mirror with apt-get download). Touches nothing outside OUTDIR except a
# temporary directory that it removes.
set -euo pipefail

LOCKSTEP_LOG_TAG="image base"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh
. "$here/../lib.sh"

require_root
out=${1:-}
require_empty_outdir "$out"
out=$(cd "$out" && pwd)

tmp=$(mktemp -d /tmp/lockstep-image-base.XXXXXX)
trap 'rm -rf -- "$tmp"' EXIT

log "fetching busybox-static"
deb=""
# apt drops to the _apt user for downloads; let it write into the temp dir.
if id _apt >/dev/null 2>&1; then chown _apt: "$tmp"; fi
if (cd "$tmp" && apt-get download -q busybox-static >"$tmp/download.log" 2>&1); then
	deb=$(find "$tmp" -maxdepth 1 -name 'busybox-static_*.deb' -print -quit)
fi
if [[ -n $deb ]]; then
	dpkg -x "$deb" "$tmp/pkg"
	bb_src=$tmp/pkg/bin/busybox
elif [[ $(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null) == "install ok installed" && -x /bin/busybox ]]; then
	# The mirror is unreachable (or the package lists are stale): the host's
	# own busybox-static package (installed by scripts/provision-host.sh) is
	# the same Debian binary.
	log "apt-get download failed ($(tail -n 1 "$tmp/download.log")); using the host's busybox-static"
	bb_src=/bin/busybox
else
	cat "$tmp/download.log" >&2 || true
	die "could not download busybox-static (is the Debian mirror reachable? try apt-get update)"
fi
[[ -f $bb_src ]] || die "busybox-static package has no bin/busybox"

log "installing busybox and its applet links"
mkdir -p "$out/bin"
install -m 0755 "$bb_src" "$out/bin/busybox"
# --list-full prints paths such as bin/sh, usr/bin/wget, sbin/ifconfig; make
# each a relative symlink to /bin/busybox so the rootfs works at any mount point.
count=0
while IFS= read -r applet; do
	[[ -n $applet && $applet != bin/busybox ]] || continue
	if [[ $applet != */* ]]; then
		dir=.; target=bin/busybox     # top-level entries such as /linuxrc
	else
		dir=${applet%/*}
	fi
	mkdir -p "$out/$dir"
	if [[ $dir == . ]]; then
		:
	elif [[ $dir == bin ]]; then
		target=busybox
	else
		# one "../" per path component of the applet's directory
		up=${dir//[!\/]/}
		target=$(printf '../%.0s' $(seq 0 "${#up}"))bin/busybox
	fi
	[[ -e $out/$applet || -L $out/$applet ]] || { ln -s "$target" "$out/$applet"; count=$((count + 1)); }
done < <("$out/bin/busybox" --list-full)
log "linked $count applets"

rootfs_finish "$out"

# Make sure the tools the sandboxes rely on are there.
for tool in sh ls cat sleep wget sha256sum dd head; do
	[[ -L $out/bin/$tool || -L $out/usr/bin/$tool || -L $out/sbin/$tool || -L $out/usr/sbin/$tool ]] ||
		die "busybox has no '$tool' applet"
done
log "done: $(du -sh "$out" | cut -f1) in $out"
