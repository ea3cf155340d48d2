#!/usr/bin/env python3
"""Dumps a chain of incremental checkpoints of memload (memload.c) with the
patched CRIU and its keeper, restores each checkpoint of the chain and checks
every byte the workload holds against what it recorded at that checkpoint.
With --stock, also dumps the same workload with a stock CRIU (full dumps) for
the numbers. Prints one JSON line per checkpoint and a summary.

  chain-test.py --criu OUT/criu --keeper OUT/wp-keeper [--stock /usr/local/sbin/criu]
                [--restore-criu CRIU] [--mib 64] [--mode mixed|bench] [--steps 8] [--verify all|last|none]
                [--workdir /dev/shm/lockstep-criu-test] [--after-restore J [--after-steps 3]]

With --after-restore J: after the chain, the workload is killed and checkpoint
J is restored with the patched criu and --wp-keeper (the restore arms the
tracking), checked against step J, then stepped and dumped --after-steps
times, the first dump with --prev-images-dir ../ckpt-J (it must be
incremental), the next ones on the new chain; then every new checkpoint is
restored and checked like the chain's (the chain's own checkpoints are
checked too unless --verify says otherwise).

Needs root. The original workload is killed before the restores, so the
restored tasks get their old pids back. This process is the subreaper of all
it starts (the VM's pid 1 does not reap orphans)."""
import argparse
import ctypes
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PR_SET_CHILD_SUBREAPER = 36


WORKDIR = None
KEEPERS = []


def die(msg):
    print("chain-test: " + msg, file=sys.stderr)
    cleanup()
    sys.exit(1)


def cleanup():
    """Kills what this test started: keepers, and the workloads (their cwd is in WORKDIR)."""
    for k in KEEPERS:
        if k.poll() is None:
            k.kill()
            k.wait()
    if not WORKDIR:
        return
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink("/proc/%s/cwd" % entry)
            except OSError:
                continue
            if cwd.startswith(WORKDIR + "/"):
                mine.append(int(entry))
    for pid in mine:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.1)
    reap()


def wait_for(paths, timeout=120.0):
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > end:
            die("timed out waiting for " + ", ".join(p for p in paths if not os.path.exists(p)))
        reap()
        time.sleep(0.01)


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_wait(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 10
    while any(os.path.exists("/proc/%d" % p) and not is_zombie(p) for p in pids):
        if time.monotonic() > end:
            die("processes %s did not die" % pids)
        time.sleep(0.01)
    reap()


def is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def pages_bytes(d):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, "pages-*.img")))


def varints(buf):
    """(field number, value) of a protobuf message holding only varints and one nested message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        if key & 7 == 0:
            v, i = varint(buf, i)
            yield key >> 3, v
        elif key & 7 == 2:
            n, i = varint(buf, i)
            yield key >> 3, buf[i : i + n]
            i += n
        else:
            return


def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def dump_stats(d):
    """CRIU's stats-dump.img: frozen time and page counts of the dump."""
    try:
        with open(os.path.join(d, "stats-dump"), "rb") as f:
            data = f.read()
    except OSError:
        return {}
    size = int.from_bytes(data[8:12], "little")
    names = {2: "frozen_ms", 3: "memdump_ms", 4: "memwrite_ms", 6: "pages_skipped_parent", 7: "pages_written"}
    out = {}
    for field, value in varints(data[12 : 12 + size]):
        if field == 1 and isinstance(value, bytes):
            for f2, v2 in varints(value):
                if f2 in names:
                    out[names[f2]] = round(v2 / 1000, 2) if names[f2].endswith("_ms") else v2
    return out


def children_of(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def run_chain(a, label, criu, incremental, base):
    """Starts memload, takes a.steps + 1 checkpoints; returns (rows, pids, dirs)."""
    os.makedirs(base)
    keeper = None
    sock = os.path.join(base, "keeper.sock")
    if incremental:
        keeper = subprocess.Popen([a.keeper, sock])
        KEEPERS.append(keeper)
        wait_for([sock])
    wl = subprocess.Popen(
        ["setsid", a.memload, base, str(a.mib), a.mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=base,
    )
    pid = wl.pid
    wait_for([os.path.join(base, "step-0-main.sums")])
    rows, dirs = [], []
    child = None
    for k in range(a.steps + 1):
        if k > 0:
            child = step(a, base, pid, child, k)
        d = os.path.join(base, "ckpt-%d" % k)
        os.makedirs(d)
        cmd = [criu, "dump", "-t", str(pid), "-D", d, "-R", "-v%d" % a.log_level, "-o", "dump.log"]
        if incremental:
            cmd += ["--track-mem", "--wp-keeper", sock]
            if k > 0:
                cmd += ["--prev-images-dir", "../ckpt-%d" % (k - 1)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        dt = time.monotonic() - t0
        if r.returncode != 0:
            os.system("grep -h Error %s/dump.log | tail -5 >&2" % d)
            die("%s dump %d failed (log: %s/dump.log)" % (label, k, d))
        row = {"run": label, "mib": a.mib, "ckpt": k, "dump_s": round(dt, 4), "pages_bytes": pages_bytes(d)}
        row.update(dump_stats(d))
        rows.append(row)
        print(json.dumps(row), flush=True)
        dirs.append(d)
        if not incremental:
            # Full dumps need no parent: free the memory at once. (Keeping
            # GiBs of images in /dev/shm makes later dumps write to guest
            # memory never touched before, 3-5x slower on this VM.)
            shutil.rmtree(d)
    pids = [pid] + ([child] if child else [])
    kill_wait(pids)
    if keeper:
        keeper.terminate()
        keeper.wait()
    return rows, pids, dirs


def verify(a, criu, base, pids, dirs, which, steps=None):
    """Restores dirs[i] (plain restore) and compares with step-<steps[i]> (default: i)."""
    picks = range(len(dirs)) if which == "all" else ([len(dirs) - 1] if which == "last" else [])
    for i in picks:
        k = steps[i] if steps else i
        for f in glob.glob(os.path.join(base, "verify-*.sums")):
            os.unlink(f)
        r = subprocess.run(
            [criu, "restore", "-D", dirs[i], "-d", "-v4", "-o", "restore.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if r.returncode != 0:
            os.system("grep -h Error %s/restore.log | tail -5 >&2" % dirs[i])
            die("restore of checkpoint %s failed (log: %s/restore.log)" % (os.path.basename(dirs[i]), dirs[i]))
        roles = check_sums(base, pids, k, os.path.basename(dirs[i]))
        kill_wait(pids[: len(roles)])


def check_sums(base, pids, k, name):
    """Has the running (restored) workload write its sums now; compares them with step k's."""
    for f in glob.glob(os.path.join(base, "verify-*.sums")):
        os.unlink(f)
    roles = ["main"] + (["child"] if os.path.exists(os.path.join(base, "step-%d-child.sums" % k)) else [])
    os.kill(pids[0], signal.SIGUSR2)
    wait_for([os.path.join(base, "verify-%s.sums" % role) for role in roles])
    for role in roles:
        want = open(os.path.join(base, "step-%d-%s.sums" % (k, role))).read()
        got = open(os.path.join(base, "verify-%s.sums" % role)).read()
        if want != got:
            bad = [(w, g) for w, g in zip(want.splitlines(), got.splitlines()) if w != g]
            die("checkpoint %s (step %d), %s: memory differs after restore, e.g. %s" % (name, k, role, bad[:3]))
    print(json.dumps({"verified_ckpt": name, "step": k, "roles": roles, "mib_checked": want.count("\n") - 1}), flush=True)
    return roles


def after_restore(a, criu, base, pids, dirs, rows):
    """Restores checkpoint J with --wp-keeper, steps and dumps on top of it; returns (rows, dirs, steps)."""
    j = a.after_restore
    if not 0 <= j < len(dirs):
        die("--after-restore %d: no such checkpoint" % j)
    sock = os.path.join(base, "keeper-ar.sock")
    keeper = subprocess.Popen([a.keeper, sock])
    KEEPERS.append(keeper)
    wait_for([sock])
    # The restored workload counts its steps from J again: keep the chain's later sums apart.
    stash = os.path.join(base, "chain-sums")
    os.makedirs(stash)
    for f in glob.glob(os.path.join(base, "step-*.sums")):
        if int(os.path.basename(f).split("-")[1]) > j:
            os.rename(f, os.path.join(stash, os.path.basename(f)))
    t0 = time.monotonic()
    r = subprocess.run(
        [criu, "restore", "-D", dirs[j], "-d", "-v4", "-o", "restore-ar.log", "--wp-keeper", sock],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    dt = time.monotonic() - t0
    if r.returncode != 0:
        os.system("grep -h Error %s/restore-ar.log | tail -5 >&2" % dirs[j])
        die("restore of checkpoint %d with --wp-keeper failed (log: %s/restore-ar.log)" % (j, dirs[j]))
    armed = subprocess.run(["grep", "-h", "wp-track", os.path.join(dirs[j], "restore-ar.log")],
                           stdout=subprocess.PIPE, text=True).stdout
    print(json.dumps({"restored_ckpt": j, "restore_s": round(dt, 4),
                      "wp_track_log": [l.split("wp-track: ", 1)[-1] for l in armed.splitlines()
                                       if "armed" in l or "handed" in l or "not" in l]}), flush=True)
    live = [p for p in pids if os.path.exists("/proc/%d" % p)]
    # The restored memory is the image's (reads here populate untouched pages: zeroes).
    if not a.no_restored_check:
        check_sums(base, live, j, "ckpt-%d (restored, before the new steps)" % j)
    new_rows, new_dirs, new_steps = [], [], []
    child = pids[1] if len(pids) > 1 and os.path.exists(os.path.join(base, "step-%d-child.sums" % j)) else None
    pid = pids[0]
    for m in range(1, a.after_steps + 1):
        k = j + m
        child = step(a, base, pid, child, k)
        d = os.path.join(base, "ar-ckpt-%d" % m)
        os.makedirs(d)
        parent = "../ckpt-%d" % j if m == 1 else "../ar-ckpt-%d" % (m - 1)
        # -v3 at least: the log says which tasks were dumped incrementally
        cmd = [criu, "dump", "-t", str(pid), "-D", d, "-R", "-v%d" % max(a.log_level, 3), "-o", "dump.log",
               "--track-mem", "--wp-keeper", sock, "--prev-images-dir", parent]
        t0 = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        dt = time.monotonic() - t0
        if r.returncode != 0:
            os.system("grep -h Error %s/dump.log | tail -5 >&2" % d)
            die("after-restore dump %d failed (log: %s/dump.log)" % (m, d))
        kinds = subprocess.run(["grep", "-ho", "keeper holds a userfaultfd tagged.*\\|new userfaultfd, full dump",
                                os.path.join(d, "dump.log")], stdout=subprocess.PIPE, text=True).stdout
        row = {"run": "after-restore", "mib": a.mib, "ckpt": "ar-ckpt-%d" % m, "parent": parent, "step": k,
               "dump_s": round(dt, 4), "pages_bytes": pages_bytes(d),
               "incremental_tasks": kinds.count("(the parent: incremental)"),
               "full_tasks": kinds.count("full dump")}
        row.update(dump_stats(d))
        new_rows.append(row)
        print(json.dumps(row), flush=True)
        new_dirs.append(d)
        new_steps.append(k)
    pids2 = [pid] + ([child] if child else [])
    kill_wait(pids2)
    keeper.terminate()
    keeper.wait()
    return new_rows, new_dirs, new_steps, pids2


def step(a, base, pid, child, k):
    """Signals memload to make step k and waits for its sums (and its child's,
    once it has one: the mixed mode forks it at step 2). Returns the child's pid."""
    os.kill(pid, signal.SIGUSR1)
    want = [os.path.join(base, "step-%d-main.sums" % k)]
    if child:
        want.append(os.path.join(base, "step-%d-child.sums" % k))
    wait_for(want)
    if child is None and a.mode == "mixed" and k >= 2:
        kids = children_of(pid)
        if kids:
            child = kids[0]
            wait_for([os.path.join(base, "step-%d-child.sums" % k)])
    return child


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--criu", required=True)
    p.add_argument("--keeper", required=True)
    p.add_argument("--stock", help="a stock criu: also measure full dumps of the same workload with it")
    p.add_argument("--restore-criu", help="restore with this criu (default: --criu)")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--mode", choices=["mixed", "bench"], default="mixed")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--verify", choices=["all", "last", "none"], default="all")
    p.add_argument("--workdir", default="/dev/shm/lockstep-criu-test")
    p.add_argument("--keep", action="store_true", help="keep the images")
    p.add_argument("--log-level", type=int, default=4, help="criu dump -v level (4 logs every page run: slower)")
    p.add_argument("--after-restore", type=int, default=-1, metavar="J",
                   help="then restore checkpoint J with --wp-keeper and dump incrementally on top of it")
    p.add_argument("--after-steps", type=int, default=3, help="dumps after the --after-restore restore")
    p.add_argument("--no-restored-check", action="store_true",
                   help="do not check the restored checkpoint J before the new steps (for negative controls: "
                   "leaves the finding to the verification of the new checkpoints)")
    a = p.parse_args()
    if os.geteuid() != 0:
        die("needs root")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        die("PR_SET_CHILD_SUBREAPER failed")

    global WORKDIR
    a.workdir = os.path.abspath(a.workdir)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    WORKDIR = a.workdir
    a.memload = os.path.join(a.workdir, "memload")
    subprocess.run(["cc", "-O2", "-o", a.memload, os.path.join(HERE, "memload.c")], check=True)

    summary = {}
    base = os.path.join(a.workdir, "patched")
    rows, pids, dirs = run_chain(a, "patched", a.criu, True, base)
    ar = None
    if a.after_restore >= 0:
        ar_rows, ar_dirs, ar_steps, ar_pids = after_restore(a, a.criu, base, pids, dirs, rows)
        verify(a, a.restore_criu or a.criu, base, ar_pids, ar_dirs, "all", ar_steps)
        full = rows[0]["pages_bytes"]
        first = ar_rows[0]
        ar = {
            "restored_ckpt": a.after_restore,
            "whole_dump_pages_bytes": full,
            "first_after_restore_pages_bytes": first["pages_bytes"],
            "first_after_restore_ratio": round(first["pages_bytes"] / full, 4),
            "first_after_restore_incremental_tasks": first["incremental_tasks"],
            "first_after_restore_full_tasks": first["full_tasks"],
            "chain_median_incremental_pages_bytes": statistics.median(r["pages_bytes"] for r in rows[1:] or rows),
            "after_restore_pages_bytes": [r["pages_bytes"] for r in ar_rows],
            "verified": [os.path.basename(d) for d in ar_dirs],
        }
        if first["full_tasks"] or first["pages_bytes"] > full / 4:
            die("the first dump after the restore is not incremental: %s" % json.dumps(ar))
        # The chain's own checkpoints: their sums for steps after J were kept apart.
        for f in glob.glob(os.path.join(base, "step-*.sums")):
            if int(os.path.basename(f).split("-")[1]) > a.after_restore:
                os.unlink(f)
        for f in glob.glob(os.path.join(base, "chain-sums", "*.sums")):
            os.rename(f, os.path.join(base, os.path.basename(f)))
    verify(a, a.restore_criu or a.criu, base, pids, dirs, a.verify)
    summary["patched"] = rows
    if not a.keep:
        shutil.rmtree(base)
    if a.stock:
        base = os.path.join(a.workdir, "stock")
        rows, pids, dirs = run_chain(a, "stock", a.stock, False, base)
        summary["stock"] = rows
        if not a.keep:
            shutil.rmtree(base)
    out = {"mib": a.mib, "mode": a.mode, "steps": a.steps}
    for label, rs in summary.items():
        inc = rs[1:] or rs
        out[label] = {
            "first_dump_s": rs[0]["dump_s"],
            "first_pages_bytes": rs[0]["pages_bytes"],
            "median_dump_s": statistics.median(r["dump_s"] for r in inc),
            "median_pages_bytes": statistics.median(r["pages_bytes"] for r in inc),
        }
        if all("frozen_ms" in r for r in rs):
            out[label]["first_frozen_ms"] = rs[0]["frozen_ms"]
            out[label]["median_frozen_ms"] = statistics.median(r["frozen_ms"] for r in inc)
    if ar:
        out["after_restore"] = ar
    print("SUMMARY " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
