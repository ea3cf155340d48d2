# shellcheck shell=bash
# Shared helpers for the sandbox image recipes (sandbox-images/*/build.sh) and
# scripts/provision-host.sh. Source it; it defines functions only.
#
# Callers set LOCKSTEP_LOG_TAG (e.g. "image base", "provision") before using
# log/die.

log() { printf '[%s] %s\n' "${LOCKSTEP_LOG_TAG:-lockstep}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# debian_mirror_uri: print the URI of the machine's main Debian archive (the
# one that serves the host's own release, e.g. bookworm), read from the apt
# sources at run time so that no mirror host name is ever written into the repo.
# Reads deb822 files (/etc/apt/sources.list.d/*.sources) first, then the
# classic one-line format (/etc/apt/sources.list, sources.list.d/*.list).
# If no stanza names the host's codename, falls back to the first "deb" URI that
# is not a security archive.
debian_mirror_uri() {
	local codename="" uri="" f
	if [[ -r /etc/os-release ]]; then
		# shellcheck disable=SC1091
		codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
	fi
	local -a deb822=() oneline=()
	for f in /etc/apt/sources.list.d/*.sources; do [[ -r $f ]] && deb822+=("$f"); done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do [[ -r $f ]] && oneline+=("$f"); done

	if ((${#deb822[@]})); then
		# Paragraph mode: one record per stanza, one field per line.
		uri=$(awk -v want="$codename" '
			BEGIN { RS = ""; FS = "\n" }
			{
				types = ""; uris = ""; suites = ""; enabled = "yes"; key = ""
				for (i = 1; i <= NF; i++) {
					line = $i
					if (line ~ /^[ \t]*#/) continue
					if (match(line, /^[A-Za-z0-9-]+:/)) {
						key = tolower(substr(line, 1, RLENGTH - 1)); val = substr(line, RLENGTH + 1)
					} else if (line ~ /^[ \t]/ && key != "") {
						val = line   # continuation line of the previous field
					} else continue
					if (key == "types") types = types " " val
					else if (key == "uris") uris = uris " " val
					else if (key == "suites") suites = suites " " val
					else if (key == "enabled") enabled = tolower(val)
				}
				if (enabled ~ /no/ || (" " types " ") !~ /[ \t]deb[ \t]/) next
				n = split(uris, u, /[ \t]+/); first = ""
				for (j = 1; j <= n; j++) if (u[j] != "") { first = u[j]; break }
				if (first == "") next
				m = split(suites, s, /[ \t]+/)
				for (j = 1; j <= m; j++) if (want != "" && s[j] == want) { print first; found = 1; exit }
				if (fallback == "" && first !~ /security/) fallback = first
			}
			END { if (!found && fallback != "") print fallback }
		' "${deb822[@]}")
	fi
	if [[ -z $uri ]] && ((${#oneline[@]})); then
		uri=$(awk -v want="$codename" '
			/^[ \t]*#/ || $1 != "deb" { next }
			{
				i = 2
				if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }   # skip [options]
				if (i + 1 > NF) next
				if (want != "" && $(i + 1) == want) { print $i; found = 1; exit }
				if (fallback == "" && $i !~ /security/) fallback = $i
			}
			END { if (!found && fallback != "") print fallback }
		' "${oneline[@]}")
	fi
	[[ -n $uri ]] || return 1
	printf '%s\n' "${uri%/}"
}

# require_empty_outdir DIR: the recipe contract says OUTDIR exists and is empty.
require_empty_outdir() {
	local dir=${1:-}
	[[ -n $dir ]] || die "usage: $0 OUTDIR (an existing, empty directory)"
	[[ -d $dir ]] || die "OUTDIR '$dir' does not exist or is not a directory"
	[[ -z $(ls -A -- "$dir") ]] || die "OUTDIR '$dir' is not empty"
}

# require_root: the recipes and provisioning need root (chown, mknod-free
# extraction with correct ownership, debootstrap's chroot).
require_root() {
	[[ $(id -u) -eq 0 ]] || die "must run as root"
}

# rootfs_finish DIR: add what every Lockstep rootfs must have and check it.
#  - empty mount points /proc /sys /dev, /tmp (1777), /workspace, /root, /run,
#    /.lockstep (0755, empty: the runtime overlays its init there)
#  - /etc/hosts with localhost; root and nobody in /etc/passwd, root in /etc/group
#  - no device nodes anywhere (the runtime builds /dev itself)
rootfs_finish() {
	local root=$1 d
	chmod 0755 -- "$root"
	for d in proc sys dev run workspace .lockstep etc; do
		mkdir -p -- "$root/$d"
		chmod 0755 -- "$root/$d"
	done
	mkdir -p -- "$root/tmp" "$root/root"
	chmod 1777 -- "$root/tmp"
	chmod 0700 -- "$root/root"

	# /dev, /proc and /sys must be empty mount points; debootstrap leaves
	# device nodes and symlinks in /dev.
	find "$root/dev" "$root/proc" "$root/sys" -mindepth 1 -delete
	# Any other device node or fifo would leak host-style devices into sandboxes.
	find "$root" -xdev \( -type b -o -type c -o -type p \) -delete

	[[ -z $(ls -A -- "$root/.lockstep") ]] || die "$root/.lockstep is not empty"

	cat >"$root/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
	chmod 0644 -- "$root/etc/hosts"

	if [[ ! -e $root/etc/passwd ]]; then
		cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
	fi
	if [[ ! -e $root/etc/group ]]; then
		# 65534 is "nogroup" on Debian; keep the same name here.
		cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
	fi
	chmod 0644 -- "$root/etc/passwd" "$root/etc/group"

	# Sanity checks of the contract.
	[[ -x $root/bin/sh || -L $root/bin/sh ]] || die "rootfs has no /bin/sh"
	grep -q '^root:' "$root/etc/passwd" || die "rootfs /etc/passwd has no root"
	grep -q '^nobody:' "$root/etc/passwd" || die "rootfs /etc/passwd has no nobody"
	grep -q '^root:' "$root/etc/group" || die "rootfs /etc/group has no root"
}
