#!/usr/bin/env python3
"""What one request to the written-page keeper costs with N processes tracked
(native/criu/wp-keeper.c; a dump makes a TAKE and a PUT per process, and the
keeper serves one request at a time for every sandbox of a state directory).

    python3 bench/keeper-requests.py [KEEPER] [N]   (root not needed; default
    /opt/lockstep/criu-wp/wp-keeper, 1000)

Starts the keeper and N `sleep` processes, PUTs an fd for each, then TAKEs
each, and prints the mean time per request, client round trip included."""
import os, socket, subprocess, sys, tempfile, time

keeper = sys.argv[1] if len(sys.argv) > 1 else "/opt/lockstep/criu-wp/wp-keeper"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
work = tempfile.mkdtemp(prefix="keeper-bench-")
sock = os.path.join(work, "keeper.sock")
k = subprocess.Popen([keeper, sock])
procs = []
try:
    while not os.path.exists(sock):
        time.sleep(0.01)
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
    starts = {}
    for p in procs:
        s = open("/proc/%d/stat" % p.pid).read()
        starts[p.pid] = s[s.rindex(")") + 2 :].split()[19]

    def req(text, fd=None):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(sock)
        if fd is None:
            c.send(text.encode())
        else:
            socket.send_fds(c, [text.encode()], [fd])
        msg, fds, _, _ = socket.recv_fds(c, 8192, 1)
        c.close()
        for f in fds:
            os.close(f)
        return msg.decode()

    null = os.open("/dev/null", os.O_RDONLY)
    t = time.perf_counter()
    for p in procs:
        assert req("PUT %d %s tag" % (p.pid, starts[p.pid]), null) == "OK"
    put = (time.perf_counter() - t) * 1000 / n
    t = time.perf_counter()
    for p in procs:
        assert req("TAKE %d %s" % (p.pid, starts[p.pid])).startswith("OK")
    take = (time.perf_counter() - t) * 1000 / n
    print("%s, %d processes tracked: PUT %.3f ms, TAKE %.3f ms per request (load %.2f)" % (keeper, n, put, take, os.getloadavg()[0]))
finally:
    for p in procs:
        p.kill()
    k.terminate()
    k.wait()
    os.rmdir(work) if not os.listdir(work) else None
