/**
 * Escape attempts from inside a sandbox, one test per attack, each pinned to
 * the exact refusal (an errno from a raw syscall made with python3's ctypes,
 * or a command's exit status and message): namespaces, mounts, keyrings,
 * io_uring, bpf, perf, raw and packet sockets (packet rings are host memory
 * outside the memory cgroup), sysctls, masked /proc files, /dev and
 * /dev/shm, a file a host uid owns, and the confinement itself (capability sets,
 * no_new_privs, seccomp, rlimits, the user namespace's id map) of the init
 * and of commands, also after a rollback through both paths and in a fork.
 * Syscall numbers are x86_64's.
 */
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { FIRST_ID_BASE, ID_RANGE_SIZE } from '../../src/instances/id-ranges.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import { hostPath } from '../fixtures/stub-workloads.js';

/**
 * Prelude of every probe: sc(nr, *args) makes a raw syscall and answers 'ok'
 * or the errno's name; probes fill `out` and it is printed as JSON.
 */
const PRELUDE = String.raw`
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def arg(a):
    if isinstance(a, int): return ctypes.c_long(a)
    if isinstance(a, bytes): return ctypes.c_char_p(a)
    return a
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    if r == 0 and nr in (56, 435):  # a clone that went through: the child leaves at once
        os._exit(0)
    return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]
def oserr(fn):
    try:
        fn()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
out = {}
`;

/** Runs a probe in the sandbox and returns its `out` object. */
async function probe(sb: Sandbox, body: string): Promise<Record<string, unknown>> {
  const r = await sb.commands.run(['python3', '-c', `${PRELUDE}\n${body}\nprint(json.dumps(out))`]);
  if (r.exitCode !== 0) throw new Error(`probe failed (${r.exitCode}): ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

// Docker's default capability set without CAP_MKNOD and CAP_NET_RAW (13), by bit number.
const CAP_NET_RAW = 13;
const SANDBOX_CAPS = {
  CAP_CHOWN: 0,
  CAP_DAC_OVERRIDE: 1,
  CAP_FOWNER: 3,
  CAP_FSETID: 4,
  CAP_KILL: 5,
  CAP_SETGID: 6,
  CAP_SETUID: 7,
  CAP_SETPCAP: 8,
  CAP_NET_BIND_SERVICE: 10,
  CAP_SYS_CHROOT: 18,
  CAP_AUDIT_WRITE: 29,
  CAP_SETFCAP: 31,
};
const SANDBOX_CAP_MASK = Object.values(SANDBOX_CAPS).reduce((m, bit) => m | (1n << BigInt(bit)), 0n);

/** The confinement fields of a /proc/<pid>/status. */
function confinement(status: string): Record<string, string | bigint> {
  const field = (name: string) => {
    const m = new RegExp(`^${name}:\\s*(\\S+)$`, 'm').exec(status);
    if (!m) throw new Error(`${name} missing from status:\n${status}`);
    return m[1]!;
  };
  const caps = Object.fromEntries(
    ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'].map((f) => [f, BigInt(`0x${field(f)}`)]),
  );
  return { ...caps, NoNewPrivs: field('NoNewPrivs'), Seccomp: field('Seccomp') };
}

const CONFINED = {
  CapInh: 0n,
  CapPrm: SANDBOX_CAP_MASK,
  CapEff: SANDBOX_CAP_MASK,
  CapBnd: SANDBOX_CAP_MASK,
  CapAmb: 0n,
  NoNewPrivs: '1',
  Seccomp: '2',
};

/** runc's masked paths, as the helper masks them. */
const MASKED = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
];

/**
 * Probe body: the raw and packet sockets a sandbox must not open (and, if
 * one opened, whether a packet receive ring could be set on it: 256 MiB of
 * kernel memory the memory cgroup does not see), beside the ordinary sockets
 * that must still work. Fills out['sockets'].
 */
const SOCKET_PROBE = String.raw`
import socket, struct
def sock(fam, typ, proto=0):
    try:
        return 'ok', socket.socket(fam, typ, proto)
    except OSError as e:
        return errno.errorcode[e.errno], None
def opened(fam, typ, proto=0):
    r, s = sock(fam, typ, proto)
    if s: s.close()
    return r
r, pkt = sock(socket.AF_PACKET, socket.SOCK_RAW, 0)
ring = 'no socket'
if pkt:
    # tpacket_req: 64 blocks of 4 MiB, 2 KiB frames.
    ring = oserr(lambda: pkt.setsockopt(263, 5, struct.pack('IIII', 4 << 20, 64, 2048, 64 * 2048)))  # SOL_PACKET, PACKET_RX_RING
    pkt.close()
out['sockets'] = {
    'AF_PACKET SOCK_RAW': r,
    'PACKET_RX_RING': ring,
    'AF_PACKET SOCK_DGRAM': opened(socket.AF_PACKET, socket.SOCK_DGRAM, 0),
    'AF_PACKET, high bits set': sc(41, (1 << 32) | 17, 3, 0),
    'AF_INET SOCK_RAW ICMP': opened(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    'AF_INET SOCK_RAW|NONBLOCK|CLOEXEC': opened(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 255),
    'AF_INET6 SOCK_RAW ICMPV6': opened(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    'AF_INET SOCK_STREAM': opened(socket.AF_INET, socket.SOCK_STREAM),
    'AF_INET SOCK_DGRAM|NONBLOCK': opened(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK),
    'AF_INET6 SOCK_STREAM': opened(socket.AF_INET6, socket.SOCK_STREAM),
    'AF_UNIX SOCK_STREAM': opened(socket.AF_UNIX, socket.SOCK_STREAM),
    'AF_NETLINK SOCK_RAW': opened(socket.AF_NETLINK, socket.SOCK_RAW, 0),
}
out['CapEff'] = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff:')][0]
`;

const SOCKETS_REFUSED = {
  'AF_PACKET SOCK_RAW': 'EPERM',
  PACKET_RX_RING: 'no socket',
  'AF_PACKET SOCK_DGRAM': 'EPERM',
  'AF_PACKET, high bits set': 'EPERM',
  'AF_INET SOCK_RAW ICMP': 'EPERM',
  'AF_INET SOCK_RAW|NONBLOCK|CLOEXEC': 'EPERM',
  'AF_INET6 SOCK_RAW ICMPV6': 'EPERM',
  'AF_INET SOCK_STREAM': 'ok',
  'AF_INET SOCK_DGRAM|NONBLOCK': 'ok',
  'AF_INET6 SOCK_STREAM': 'ok',
  'AF_UNIX SOCK_STREAM': 'ok',
  'AF_NETLINK SOCK_RAW': 'ok',
};

/** Checks a SOCKET_PROBE's `out`: the refusals, and no CAP_NET_RAW in the effective set. */
function assertNoRawSockets(t: ExecutionContext, out: Record<string, unknown>, who: string): void {
  t.deepEqual(out['sockets'], SOCKETS_REFUSED, who);
  t.is((BigInt(`0x${String(out['CapEff'])}`) >> BigInt(CAP_NET_RAW)) & 1n, 0n, `${who}: CapEff lacks CAP_NET_RAW`);
}

function memAvailableKiB(): number {
  return Number(/^MemAvailable:\s+(\d+) kB$/m.exec(fs.readFileSync('/proc/meminfo', 'utf8'))![1]);
}

const hostPython = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['dev'] });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext): Promise<Sandbox> {
    const sb = await ls.create({ image: 'dev' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  test.serial('creating a user namespace with `unshare -Ur` fails with EPERM', async (t) => {
    const sb = await sandbox(t);
    const r = await sb.commands.run(['unshare', '-Ur', 'id', '-u']);
    t.is(r.exitCode, 1);
    t.is(r.stdout, '');
    t.regex(r.stderr, /unshare failed: Operation not permitted/);
  });

  test.serial('raw unshare, clone with CLONE_NEW* and setns fail with EPERM; clone3 with ENOSYS', async (t) => {
    const sb = await sandbox(t);
    const out = await probe(
      sb,
      String.raw`
SIGCHLD = 17
out['unshare(CLONE_NEWUSER)'] = sc(272, 0x10000000)
out['unshare(CLONE_NEWNS)'] = sc(272, 0x00020000)
out['unshare(CLONE_NEWNET)'] = sc(272, 0x40000000)
out['clone(CLONE_NEWUSER)'] = sc(56, 0x10000000 | SIGCHLD, 0, 0, 0, 0)
out['clone(CLONE_NEWPID)'] = sc(56, 0x20000000 | SIGCHLD, 0, 0, 0, 0)
out['clone3'] = sc(435, ctypes.create_string_buffer(88), 88)
fd = os.open('/proc/1/ns/mnt', os.O_RDONLY)
out['setns(mnt)'] = sc(308, fd, 0)
pid = os.fork()
if pid == 0: os._exit(7)
out['fork still works'] = os.waitpid(pid, 0)[1] >> 8
`,
    );
    t.deepEqual(out, {
      'unshare(CLONE_NEWUSER)': 'EPERM',
      'unshare(CLONE_NEWNS)': 'EPERM',
      'unshare(CLONE_NEWNET)': 'EPERM',
      'clone(CLONE_NEWUSER)': 'EPERM',
      'clone(CLONE_NEWPID)': 'EPERM',
      clone3: 'ENOSYS',
      'setns(mnt)': 'EPERM',
      'fork still works': 7,
    });
  });

  test.serial('mounting (mount, umount2, pivot_root and the new mount API) fails with EPERM', async (t) => {
    const sb = await sandbox(t);
    const out = await probe(
      sb,
      String.raw`
os.makedirs('/mnt/x', exist_ok=True)
out['mount(tmpfs)'] = sc(165, b'none', b'/mnt/x', b'tmpfs', 0, 0)
out['mount(remount /dev rw)'] = sc(165, 0, b'/dev', 0, 0x20 | 0x1000, 0)
out['umount2(/proc/keys)'] = sc(166, b'/proc/keys', 2)
out['pivot_root'] = sc(155, b'/mnt', b'/mnt/x')
out['fsopen'] = sc(430, b'tmpfs', 0)
out['open_tree'] = sc(428, -100, b'/', 1)
out['move_mount'] = sc(429, -100, b'/tmp', -100, b'/mnt/x', 0)
out['mount_setattr'] = sc(442, -100, b'/dev', 0, ctypes.create_string_buffer(32), 32)
out['mounts'] = open('/proc/self/mounts').read().count(' /mnt/x ')
`,
    );
    t.deepEqual(out, {
      'mount(tmpfs)': 'EPERM',
      'mount(remount /dev rw)': 'EPERM',
      'umount2(/proc/keys)': 'EPERM',
      pivot_root: 'EPERM',
      fsopen: 'EPERM',
      open_tree: 'EPERM',
      move_mount: 'EPERM',
      mount_setattr: 'EPERM',
      mounts: 0,
    });
  });

  test.serial(
    'keyrings: add_key, keyctl and request_key fail with EPERM, and no key of the host or of another sandbox is visible',
    async (t) => {
      // A key in host root's user keyring, which every uid-0 process of the
      // host's user namespace could reach if keyctl were allowed.
      const desc = `lockstep-escape-${randomBytes(4).toString('hex')}`;
      const hostKey = execFileSync(hostPython, [
        '-c',
        `import ctypes; l = ctypes.CDLL(None, use_errno=True); l.syscall.restype = ctypes.c_long; print(l.syscall(ctypes.c_long(248), b"user", b"${desc}", b"host secret", ctypes.c_long(11), ctypes.c_long(-4)))`,
      ])
        .toString()
        .trim();
      t.true(Number(hostKey) > 0, `control: the host added its key (${hostKey})`);
      t.teardown(() => {
        execFileSync(hostPython, [
          '-c',
          `import ctypes; l = ctypes.CDLL(None); l.syscall(ctypes.c_long(250), ctypes.c_long(9), ctypes.c_long(${hostKey}), ctypes.c_long(-4))`,
        ]);
      });
      t.true(fs.readFileSync('/proc/keys', 'utf8').includes(desc), 'control: the host sees its key in /proc/keys');

      const a = await sandbox(t);
      const b = await sandbox(t);
      const planted = await probe(
        a,
        String.raw`
out['add_key(session)'] = sc(248, b'user', b'from-a', b'sandbox a secret', 16, -3)
out['add_key(user)'] = sc(248, b'user', b'from-a', b'sandbox a secret', 16, -4)
out['keyctl(JOIN_SESSION_KEYRING)'] = sc(250, 1, b'shared')
`,
      );
      t.deepEqual(planted, {
        'add_key(session)': 'EPERM',
        'add_key(user)': 'EPERM',
        'keyctl(JOIN_SESSION_KEYRING)': 'EPERM',
      });
      const seen = await probe(
        b,
        String.raw`
out['keyctl(GET_KEYRING_ID session)'] = sc(250, 0, -3, 0)
out['keyctl(SEARCH user keyring)'] = sc(250, 10, -4, b'user', b'${desc}', 0)
out['keyctl(READ host key)'] = sc(250, 11, ${hostKey}, 0, 0)
out['request_key'] = sc(249, b'user', b'${desc}', 0, 0)
out['/proc/keys'] = open('/proc/keys').read()
`,
      );
      t.deepEqual(seen, {
        'keyctl(GET_KEYRING_ID session)': 'EPERM',
        'keyctl(SEARCH user keyring)': 'EPERM',
        'keyctl(READ host key)': 'EPERM',
        request_key: 'EPERM',
        '/proc/keys': '',
      });
    },
  );

  test.serial('io_uring_setup, bpf, perf_event_open and userfaultfd fail with EPERM', async (t) => {
    const sb = await sandbox(t);
    const out = await probe(
      sb,
      String.raw`
out['io_uring_setup'] = sc(425, 1, ctypes.create_string_buffer(120))
out['io_uring_enter'] = sc(426, 0, 1, 0, 0, 0, 0)
out['io_uring_register'] = sc(427, 0, 0, 0, 0)
out['bpf(BPF_MAP_CREATE)'] = sc(321, 0, ctypes.create_string_buffer(72), 72)
attr = ctypes.create_string_buffer(128)
attr[0:4] = (1).to_bytes(4, 'little')    # PERF_TYPE_SOFTWARE
attr[4:8] = (128).to_bytes(4, 'little')  # size
out['perf_event_open'] = sc(298, attr, 0, -1, -1, 0)
out['userfaultfd'] = sc(323, 0)
`,
    );
    t.deepEqual(out, {
      io_uring_setup: 'EPERM',
      io_uring_enter: 'EPERM',
      io_uring_register: 'EPERM',
      'bpf(BPF_MAP_CREATE)': 'EPERM',
      perf_event_open: 'EPERM',
      userfaultfd: 'EPERM',
    });
  });

  test.serial(
    'loading kernel modules, kexec, open_by_handle_at, reboot and socket(AF_VSOCK) fail with EPERM',
    async (t) => {
      const sb = await sandbox(t);
      const out = await probe(
        sb,
        String.raw`
out['init_module'] = sc(175, 0, 0, b'')
out['finit_module'] = sc(313, 0, b'', 0)
out['delete_module'] = sc(176, b'ext4', 0)
out['kexec_load'] = sc(246, 0, 0, 0, 0)
out['open_by_handle_at'] = sc(304, -100, ctypes.create_string_buffer(16), 0)
out['name_to_handle_at'] = sc(303, -100, b'/', ctypes.create_string_buffer(136), ctypes.create_string_buffer(4), 0)
out['reboot'] = sc(169, 0xfee1dead, 672274793, 0x4321fedc, 0)
out['socket(AF_VSOCK)'] = sc(41, 40, 1, 0)
out['socket(AF_VSOCK | high bits)'] = sc(41, (1 << 32) | 40, 1, 0)
out['socket(AF_INET) still works'] = sc(41, 2, 1, 0)
out['sethostname'] = sc(170, b'evil', 4)
`,
      );
      t.deepEqual(out, {
        init_module: 'EPERM',
        finit_module: 'EPERM',
        delete_module: 'EPERM',
        kexec_load: 'EPERM',
        open_by_handle_at: 'EPERM',
        name_to_handle_at: 'EPERM',
        reboot: 'EPERM',
        'socket(AF_VSOCK)': 'EPERM',
        'socket(AF_VSOCK | high bits)': 'EPERM',
        'socket(AF_INET) still works': 'ok',
        sethostname: 'EPERM',
      });
    },
  );

  test.serial('writing a sysctl fails with EROFS and the host value stays', async (t) => {
    const file = '/proc/sys/kernel/printk_ratelimit';
    const before = fs.readFileSync(file, 'utf8');
    const sb = await sandbox(t);
    const out = await probe(
      sb,
      String.raw`
out['write'] = oserr(lambda: open('${file}', 'w').write('${Number(before) + 1}'))
out['write core_pattern'] = oserr(lambda: open('/proc/sys/kernel/core_pattern', 'w').write('|/tmp/x'))
out['sysrq-trigger'] = oserr(lambda: open('/proc/sysrq-trigger', 'w').write('h'))
`,
    );
    // sysrq-trigger exists only on kernels built with CONFIG_MAGIC_SYSRQ.
    t.deepEqual(out, {
      write: 'EROFS',
      'write core_pattern': 'EROFS',
      'sysrq-trigger': fs.existsSync('/proc/sysrq-trigger') ? 'EROFS' : 'ENOENT',
    });
    t.is(fs.readFileSync(file, 'utf8'), before);
  });

  test.serial(
    'reading masked /proc files gives nothing: kcore, keys, timer_list, sched_debug, acpi, ...',
    async (t) => {
      t.true(fs.readFileSync('/proc/timer_list').length > 0, 'control: the host’s timer_list has content');
      const sb = await sandbox(t);
      const out = await probe(
        sb,
        String.raw`
for p in ${JSON.stringify(MASKED)}:
    if not os.path.lexists(p): out[p] = 'missing'
    elif os.path.isdir(p): out[p] = 'dir:%d' % len(os.listdir(p))
    else:
        with open(p, 'rb') as f: out[p] = 'file:%d' % len(f.read())
out['write /proc/acpi'] = oserr(lambda: open('/proc/acpi/x', 'w'))
`,
      );
      const expected: Record<string, string> = { 'write /proc/acpi': fs.existsSync('/proc/acpi') ? 'EROFS' : 'ENOENT' };
      for (const p of MASKED) {
        // What the host has is masked; what it lacks the sandbox lacks too.
        expected[p] = !fs.existsSync(p) ? 'missing' : fs.statSync(p).isDirectory() ? 'dir:0' : 'file:0';
      }
      t.deepEqual(out, expected);
      t.true(
        Object.values(expected).some((v) => v === 'file:0'),
        'at least one masked file exists on this kernel',
      );
    },
  );

  test.serial(
    'filling /dev fails with EROFS; its device nodes still work and the host folder is unchanged',
    async (t) => {
      const sb = await sandbox(t);
      const devDir = ls.engine.paths.sandboxDev(ls.engine.catalog.sandbox(sb.id)!.instance);
      const hostBefore = fs.readdirSync(devDir).sort();
      const out = await probe(
        sb,
        String.raw`
out['create file'] = oserr(lambda: open('/dev/fill', 'wb').write(b'x' * 4096))
out['mkdir'] = oserr(lambda: os.mkdir('/dev/dir'))
out['mkfifo'] = oserr(lambda: os.mkfifo('/dev/fifo'))
out['symlink'] = oserr(lambda: os.symlink('/etc/passwd', '/dev/link'))
out['unlink null'] = oserr(lambda: os.unlink('/dev/null'))
out['chmod null'] = oserr(lambda: os.chmod('/dev/null', 0o600))
out['write /dev/null'] = oserr(lambda: open('/dev/null', 'wb').write(b'x'))
out['read /dev/zero'] = open('/dev/zero', 'rb').read(4) == b'\0' * 4
m, s = os.openpty()
out['new terminal'] = os.ttyname(s)
`,
      );
      t.deepEqual(out, {
        'create file': 'EROFS',
        mkdir: 'EROFS',
        mkfifo: 'EROFS',
        symlink: 'EROFS',
        'unlink null': 'EROFS',
        'chmod null': 'EROFS',
        'write /dev/null': 'ok',
        'read /dev/zero': true,
        'new terminal': '/dev/pts/0',
      });
      t.deepEqual(fs.readdirSync(devDir).sort(), hostBefore);
    },
  );

  test.serial(
    'filling /dev/shm stops at the disk quota with EDQUOT: it is a folder of the writable layer, where nothing can be executed',
    async (t) => {
      const sb = await ls.create({ image: 'dev', diskMb: 8 });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const row = ls.engine.catalog.sandbox(sb.id)!;
      const out = await probe(
        sb,
        String.raw`
import shutil
shutil.copy('/bin/true', '/dev/shm/true')
os.chmod('/dev/shm/true', 0o755)
out['exec'] = oserr(lambda: os.execv('/dev/shm/true', ['true']))
fd = os.open('/dev/shm/fill', os.O_WRONLY | os.O_CREAT, 0o644)
chunk = b'x' * (1 << 20)
written = 0
try:
    while written < (64 << 20):
        written += os.write(fd, chunk)
    out['error'] = None
except OSError as e:
    out['error'] = errno.errorcode[e.errno]
out['written'] = written
os.close(fd)
out['in root fs'] = os.path.exists('/shm/fill')
`,
      );
      const written = out.written as number;
      t.true(written > 4 * 1024 * 1024 && written <= 8 * 1024 * 1024, `wrote ${written} bytes before the quota`);
      t.deepEqual({ ...out, written: 0 }, { error: 'EDQUOT', written: 0, exec: 'EACCES', 'in root fs': false });
      // On the host it is the sandbox's own file, in its layer's subvolume, owned by its root.
      const st = fs.statSync(`${ls.engine.layers.shmDir(row.instance)}/fill`);
      t.deepEqual([st.size, st.uid], [written, row.id_base ?? 0]);
    },
  );

  test.serial(
    'a file owned by a host uid shows as nobody inside and cannot be chowned, chmodded or written as its owner',
    async (t) => {
      const sb = await sandbox(t);
      const base = ls.engine.catalog.sandbox(sb.id)!.id_base!;
      // 4242 is below every sandbox's range, i.e. a host user's id.
      const hostUid = 4242;
      t.true(hostUid < base);
      const file = hostPath(ls, sb.id, '/root/host-owned.txt');
      fs.writeFileSync(file, 'host data\n', { mode: 0o644 });
      fs.chownSync(file, hostUid, hostUid);
      const out = await probe(
        sb,
        String.raw`
p = '/root/host-owned.txt'
st = os.stat(p)
out['owner'] = '%d:%d' % (st.st_uid, st.st_gid)
out['read'] = open(p).read()
out['write'] = oserr(lambda: open(p, 'a').write('tampered'))
out['chown'] = oserr(lambda: os.chown(p, 0, 0))
out['chmod'] = oserr(lambda: os.chmod(p, 0o666))
out['setxattr'] = oserr(lambda: os.setxattr(p, 'user.x', b'1'))
`,
      );
      t.deepEqual(out, {
        owner: '65534:65534',
        read: 'host data\n',
        write: 'EACCES',
        chown: 'EPERM',
        chmod: 'EPERM',
        setxattr: 'EACCES',
      });
      const st = fs.statSync(file);
      t.deepEqual([st.uid, st.gid, st.mode & 0o7777], [hostUid, hostUid, 0o644]);
      t.is(fs.readFileSync(file, 'utf8'), 'host data\n');
    },
  );

  test.serial(
    'a command and the init have the sandbox capability set in every set, no_new_privs, seccomp and no core dumps',
    async (t) => {
      const sb = await sandbox(t);
      const detached = await sb.commands.spawn(['sleep', '1000']);
      const r = await sb.commands.run([
        'sh',
        '-c',
        `cat /proc/self/status; echo ===; cat /proc/1/status; echo ===; cat /proc/${detached}/status; echo ===; grep 'core file' /proc/self/limits`,
      ]);
      t.is(r.exitCode, 0, r.stderr);
      const [self, init, spawned, limits] = r.stdout.split('===\n');
      t.deepEqual(confinement(self!), CONFINED, 'a command');
      t.deepEqual(confinement(init!), CONFINED, 'the init');
      t.deepEqual(confinement(spawned!), CONFINED, 'a detached command');
      t.regex(limits!, /^Max core file size\s+0\s+0\s+bytes\s*$/);
    },
  );

  test.serial('ptrace within the sandbox is allowed (as under Docker), and the tracee stays filtered', async (t) => {
    const sb = await sandbox(t);
    const out = await probe(
      sb,
      String.raw`
import subprocess, time
child = subprocess.Popen(['sleep', '1000'])
time.sleep(0.1)
out['PTRACE_SEIZE'] = sc(101, 0x4206, child.pid, 0, 0)
out['tracee seccomp'] = [l.split()[1] for l in open('/proc/%d/status' % child.pid) if l.startswith('Seccomp:')][0]
child.kill()
child.wait()
`,
    );
    t.deepEqual(out, { PTRACE_SEIZE: 'ok', 'tracee seccomp': '2' });
  });

  test.serial(
    'no packet or raw socket, so no packet receive ring: socket(AF_PACKET) and SOCK_RAW fail with EPERM, CapEff lacks CAP_NET_RAW',
    async (t) => {
      // The sandbox of the finding: 64 MiB of memory cgroup, which the
      // kernel does not charge packet rings to.
      const sb = await ls.create({ image: 'dev', memoryMb: 64 });
      t.teardown(() => ls.remove(sb.id).catch(() => undefined));
      const before = memAvailableKiB();
      const out = await probe(sb, SOCKET_PROBE);
      const after = memAvailableKiB();
      t.log(`host MemAvailable: ${before} KiB before the probe, ${after} KiB after`);
      assertNoRawSockets(t, out, 'a command');
      // The init and a detached command: the same sets.
      const detached = await sb.commands.spawn(['sleep', '1000']);
      const r = await sb.commands.run(['sh', '-c', `grep CapEff /proc/1/status /proc/${detached}/status`]);
      const effs = [...r.stdout.matchAll(/CapEff:\s+([0-9a-f]+)/g)].map((m) => BigInt(`0x${m[1]!}`));
      t.is(effs.length, 2, r.stdout);
      for (const eff of effs) t.is((eff >> BigInt(CAP_NET_RAW)) & 1n, 0n, `CapEff ${eff.toString(16)}`);
    },
  );

  /** Checks a sandbox's /proc/self/mountinfo names nothing of the host's state directory. */
  async function assertNoHostPaths(t: ExecutionContext, s: Sandbox, who: string): Promise<void> {
    const r = await s.commands.run(['cat', '/proc/self/mountinfo']);
    t.is(r.exitCode, 0, r.stderr);
    const home = ls.home;
    const leaks = r.stdout.split('\n').filter((l) => l.includes(home) || l.includes('/var/lib/lockstep'));
    t.deepEqual(leaks, [], `${who}: mountinfo lines naming ${home}`);
    // The overlay's layers show as descriptors of the manager's mount call.
    t.regex(
      r.stdout,
      /^\S+ \S+ \S+ \/ \/ \S+ - overlay overlay \S*lowerdir=\/proc\/self\/fd\/\d+:\/proc\/self\/fd\/\d+,upperdir=\/proc\/self\/fd\/\d+,workdir=\/proc\/self\/fd\/\d+/m,
      who,
    );
  }

  test.serial('mountinfo inside names no host path: the overlay layers show as /proc/self/fd/N', async (t) => {
    const sb = await sandbox(t);
    await assertNoHostPaths(t, sb, 'a new sandbox');
  });

  const confinedAfter = test.macro({
    title: (_, how: 'standby' | 'restore' | 'fork') =>
      ({
        standby:
          'confinement, no raw or packet socket, no host path in mountinfo, and /dev, /proc mounts are the same after a rollback through the warm standby',
        restore:
          'confinement, no raw or packet socket, no host path in mountinfo, and /dev, /proc mounts are the same after a rollback through a CRIU restore',
        fork: 'confinement, no raw or packet socket, no host path in mountinfo, and /dev, /proc mounts are the same in a fork',
      })[how],
    async exec(t, how: 'standby' | 'restore' | 'fork') {
      const sb = await sandbox(t);
      const sleeper = await sb.commands.spawn(['sleep', '1000']);
      // A process from before the checkpoint that tries the sockets once told
      // to (after the restore): restored processes keep the dumped
      // capabilities and filter, so this is what a restored tree can do.
      await sb.commands.spawn([
        'python3',
        '-c',
        `${PRELUDE}
import time
deadline = time.time() + 120
while not os.path.exists('/tmp/go-sockets'):
    if time.time() > deadline: sys.exit(3)  # never told: no result, so the test fails rather than read a stale one
    time.sleep(0.05)
${SOCKET_PROBE}
open('/tmp/sockets.tmp', 'w').write(json.dumps(out))
os.rename('/tmp/sockets.tmp', '/tmp/sockets.json')
`,
      ]);
      t.is((await sb.commands.run(['sh', '-c', 'echo in-shm > /dev/shm/kept'])).exitCode, 0);
      // CRIU may restore sibling mounts in another order: compare them sorted.
      // tmpfs and devpts show their owner as a host id: a fork has a range
      // of its own, so owners are compared as ids inside the sandbox.
      const mountsOf = async (s: Sandbox) => {
        const base = ls.engine.catalog.sandbox(s.id)!.id_base ?? 0;
        const text = (
          await s.commands.run(['sh', '-c', "awk '{print $2, $3, $4}' /proc/self/mounts | grep -v '^/ ' | sort"])
        ).stdout;
        // /dev/shm is a folder of the instance's own layer subvolume.
        const own = `subvol=/uppers/${ls.engine.catalog.sandbox(s.id)!.instance}`;
        return text
          .replace(/\b([ug]id)=(\d+)/g, (_, k: string, v: string) => `${k}=${Number(v) - base}`)
          .replace(/subvolid=\d+,/g, '')
          .replaceAll(own, 'subvol=<own layer>');
      };
      const mountsBefore = await mountsOf(sb);
      const ckpt = await sb.checkpoint({ label: 'confined' });
      await sb.settled();

      let target: Sandbox = sb;
      if (how === 'fork') {
        const [res] = await sb.fork(ckpt.id);
        if (!res?.ok) return t.fail(JSON.stringify(res));
        target = ls.get(res.id);
        t.teardown(() => ls.remove(res.id).catch(() => undefined));
      } else {
        if (how === 'restore') await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
        const report = await sb.rollback(ckpt.id);
        t.is(report.path, how);
      }
      const r = await target.commands.run([
        'sh',
        '-c',
        `cat /proc/1/status; echo ===; cat /proc/${sleeper}/status; echo ===; cat /proc/self/status; echo ===; cat /dev/shm/kept; touch /dev/x 2>&1; cat /proc/keys | wc -c; unshare -Ur true 2>&1; echo unshare=$?`,
      ]);
      const [init, restored, fresh, rest] = r.stdout.split('===\n');
      t.deepEqual(confinement(init!), CONFINED, 'the restored init');
      t.deepEqual(confinement(restored!), CONFINED, 'a restored process');
      t.deepEqual(confinement(fresh!), CONFINED, 'a command after the restore');
      t.is(
        rest,
        "in-shm\ntouch: cannot touch '/dev/x': Read-only file system\n0\nunshare: unshare failed: Operation not permitted\nunshare=1\n",
      );
      await target.files.write('/tmp/go-sockets', '');
      const restoredSockets = await eventually(
        async () => (await target.files.read('/tmp/sockets.json')).content.toString(),
        30_000,
        50,
      ).catch((e: unknown) => {
        throw new Error(`the restored socket probe wrote no result: ${String(e)}`);
      });
      assertNoRawSockets(t, JSON.parse(restoredSockets) as Record<string, unknown>, 'a restored process');
      assertNoRawSockets(t, await probe(target, SOCKET_PROBE), 'a command after the restore');
      await assertNoHostPaths(t, target, how);
      const mountsAfter = await mountsOf(target);
      t.is(mountsAfter, mountsBefore);
      t.regex(mountsAfter, /^\/dev \S+ ro,/m);
      t.regex(mountsAfter, /^\/dev\/shm \S+ rw,nosuid,nodev,noexec,.*subvol=<own layer>$/m);
      t.regex(mountsAfter, /^\/dev\/pts devpts rw,nosuid,noexec/m);
      t.regex(mountsAfter, /^\/proc\/keys /m);
      // Still in a user namespace of its own: root inside is the sandbox's range, never host root.
      const base = ls.engine.catalog.sandbox(target.id)!.id_base;
      t.true(base !== null && base >= FIRST_ID_BASE, `id range ${base}`);
      const maps = await target.commands.run(['sh', '-c', 'cat /proc/1/uid_map /proc/1/gid_map']);
      t.deepEqual(
        maps.stdout
          .trim()
          .split('\n')
          .map((l) => l.trim().split(/\s+/).join(' ')),
        [`0 ${base} ${ID_RANGE_SIZE}`, `0 ${base} ${ID_RANGE_SIZE}`],
      );
    },
  });
  test.serial(confinedAfter, 'standby');
  test.serial(confinedAfter, 'restore');
  test.serial(confinedAfter, 'fork');
});
