#!/usr/bin/env bash
# Make sure a Docker engine (Debian's docker.io, installed by
# scripts/provision-host.sh) is running. Idempotent: if /var/run/docker.sock
# answers, exits 0 at once; otherwise starts dockerd detached and waits for it.
#
# dockerd flags:
#   --iptables=false --bridge=none  this host has no use for Docker networking
#                                   (and nothing to reach); sandboxes get
#                                   --network none.
#   --experimental                  enables `docker checkpoint` (CRIU; the
#                                   trixie criu wrapper is /usr/local/sbin/criu).
# containerd: with no --containerd flag, dockerd 20.10 uses a system containerd
# if /run/containerd/containerd.sock is up, and otherwise starts and supervises
# its own (state under /var/run/docker/containerd). So nothing else needs
# starting here; the daemon stops when dockerd stops.
set -euo pipefail

SOCK=/var/run/docker.sock
LOG=/var/log/lockstep-dockerd.log
TIMEOUT=30

say() { printf '[dockerd] %s\n' "$*" >&2; }
fail() {
	say "ERROR: $*"
	if [[ -s $LOG ]]; then
		say "last lines of $LOG:"
		tail -n 25 "$LOG" | sed 's/^/[dockerd]   /' >&2
	fi
	exit 1
}

engine_up() {
	[[ -S $SOCK ]] || return 1
	if command -v curl >/dev/null 2>&1; then
		[[ $(curl -s --max-time 2 --unix-socket "$SOCK" http://localhost/_ping 2>/dev/null) == OK ]]
	else
		docker -H "unix://$SOCK" version >/dev/null 2>&1
	fi
}

if engine_up; then exit 0; fi

[[ $(id -u) -eq 0 ]] || fail "must run as root to start dockerd"
command -v dockerd >/dev/null 2>&1 || [[ -x /usr/sbin/dockerd ]] ||
	fail "dockerd not found: run scripts/provision-host.sh first"

# runc looks criu up on PATH; make sure the wrapper's directory is on it, and
# that the sbin directories are there even when called from a minimal env.
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"

# Two callers at once must not both start a daemon.
exec 9>/run/lockstep-dockerd.lock
flock 9
if engine_up; then exit 0; fi

# A dockerd that is still starting up (pid file with a live process): wait for
# it rather than start a second one, which would fail on the pid file.
pid=""
if [[ -r /var/run/docker.pid ]]; then
	read -r pid </var/run/docker.pid || true
	if [[ -n $pid ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]]; then
		say "dockerd (pid $pid) is already running; waiting for its socket"
	else
		pid=""
	fi
fi

if [[ -z $pid ]]; then
	say "starting dockerd (log: $LOG)"
	printf '\n==== %s start-dockerd.sh\n' "$(date -u '+%F %T')" >>"$LOG"
	# setsid + nohup: fully detached from our session and terminal, so it
	# outlives the npm process that started it. 9>&-: the daemon must not
	# inherit (and so hold forever) the start lock.
	setsid nohup dockerd --iptables=false --bridge=none --experimental \
		</dev/null >>"$LOG" 2>&1 9>&- &
	pid=$!
fi

deadline=$((SECONDS + TIMEOUT))
while ((SECONDS < deadline)); do
	if engine_up; then
		say "dockerd is up (pid $pid)"
		exit 0
	fi
	kill -0 "$pid" 2>/dev/null || fail "dockerd exited during start-up"
	sleep 0.2
done
fail "dockerd did not answer on $SOCK within ${TIMEOUT}s"
