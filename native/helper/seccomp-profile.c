/*
 * The syscall filter of every sandbox process, as data: an allow-list, the
 * argument rules, and nothing else. Anything not listed fails with EPERM.
 *
 * Semantics follow Docker's default seccomp profile (moby
 * profiles/seccomp/default.json) resolved for the capability set a sandbox
 * has (Docker's defaults minus CAP_MKNOD and CAP_NET_RAW: no CAP_SYS_ADMIN, CAP_SYS_PTRACE,
 * CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYS_NICE, CAP_BPF, CAP_PERFMON, ...), so
 * the profile's capability-conditional entries are either in or out here.
 * The table is our own; where it differs from Docker's, the comment says so:
 *
 *  - only the native ABI (x86_64): 32-bit x86 and x32 system calls kill the
 *    process (seccomp-compile.c), since their compat paths are extra kernel surface
 *    and nothing a sandbox runs needs them;
 *  - io_uring_{setup,enter,register} refused (Docker >= 25 does the same): a
 *    large share of recent kernel exploits, and io_uring work bypasses
 *    seccomp for the operations it performs;
 *  - name_to_handle_at refused (newer Docker profiles also require
 *    CAP_SYS_ADMIN; its pair open_by_handle_at is refused by both);
 *  - socket(AF_VSOCK) refused: vsock is not network-namespaced and reaches
 *    the hypervisor of this VM; families are compared as 64-bit values so
 *    high garbage bits cannot alias a refused family after the kernel's
 *    truncation to int;
 *  - socket(AF_PACKET) and SOCK_RAW sockets of AF_INET and AF_INET6 refused
 *    (the kernel would refuse them too: no sandbox has CAP_NET_RAW, see
 *    confine.c): packet receive rings are host memory outside the memory
 *    cgroup;
 *  - syscalls newer than Docker's table that only do what allowed ones do
 *    (fchmodat2, futex_wake/wait/requeue, cachestat, map_shadow_stack, mseal,
 *    the *xattrat family, file_getattr/setattr) are allowed, so a new libc
 *    does not meet EPERM where it expects success or ENOSYS.
 *
 * Refused (EPERM unless said otherwise), because they are not in the table:
 *  - namespaces: unshare, setns, clone with any CLONE_NEW* flag; clone3 fails
 *    with ENOSYS instead (see the rule). A user namespace hands out a full
 *    capability set over new namespaces: the entry point of most escapes;
 *  - mounts: mount, umount2, pivot_root and the new mount API (fsopen,
 *    fsconfig, fsmount, fspick, move_mount, open_tree, open_tree_attr,
 *    mount_setattr, statmount, listmount);
 *  - keyrings: keyctl, add_key, request_key (keyrings are not namespaced);
 *  - kernel attack surface: bpf, perf_event_open, userfaultfd, io_uring_*,
 *    lsm_*, listns;
 *  - the machine: init_module, finit_module, delete_module, kexec_load,
 *    kexec_file_load, reboot, swapon, swapoff, acct, quotactl, syslog, iopl,
 *    ioperm, vhangup, settimeofday, clock_settime, sethostname, setdomainname;
 *  - file handles: open_by_handle_at (the "shocker" escape), name_to_handle_at;
 *  - what Docker grants only with a capability a sandbox lacks: kcmp,
 *    pidfd_getfd, process_madvise (CAP_SYS_PTRACE); mbind, set_mempolicy,
 *    get_mempolicy, move_pages, migrate_pages (CAP_SYS_NICE); fanotify_init,
 *    lookup_dcookie (CAP_SYS_ADMIN);
 *  - personality() other than the values the rules allow.
 * chroot is allowed (CAP_SYS_CHROOT is in the set), and adjtimex and
 * clock_adjtime, which only read without CAP_SYS_TIME.
 *
 * ptrace, process_vm_readv and process_vm_writev are ALLOWED, as Docker does
 * on kernels >= 4.8: since 4.8 the kernel re-runs the filter after a tracer
 * changes a syscall, so tracing cannot bypass it; without CAP_SYS_PTRACE a
 * process can only trace same-uid, dumpable processes of its own sandbox
 * (its pid namespace), and agents use strace and gdb. A helper process is not
 * dumpable from the moment it is confined until its exec (confine.c).
 */
#include <errno.h>
#include <seccomp.h>
#include <stddef.h>
#include <sys/socket.h>

#include "seccomp-profile.h"

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif

const char *const seccomp_allowed[] = {
    /* files and directories */
    "access",
    "chdir",
    "chmod",
    "chown",
    "close",
    "close_range",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "flock",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futimesat",
    "getcwd",
    "getdents",
    "getdents64",
    "lchown",
    "link",
    "linkat",
    "lseek",
    "lstat",
    "mkdir",
    "mkdirat",
    "mknod", /* creating device nodes still needs CAP_MKNOD, which no sandbox has; FIFOs are fine */
    "mknodat",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pread64",
    "preadv",
    "preadv2",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "rename",
    "renameat",
    "renameat2",
    "rmdir",
    "sendfile",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "tee",
    "truncate",
    "umask",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vmsplice",
    "write",
    "writev",
    "cachestat",
    "file_getattr",
    "file_setattr",
    /* extended attributes */
    "fgetxattr",
    "flistxattr",
    "fremovexattr",
    "fsetxattr",
    "getxattr",
    "lgetxattr",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lsetxattr",
    "removexattr",
    "setxattr",
    "getxattrat",
    "listxattrat",
    "removexattrat",
    "setxattrat",
    /* events, polling, timers */
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "fanotify_mark",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "pause",
    "poll",
    "ppoll",
    "pselect6",
    "select",
    "signalfd",
    "signalfd4",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "alarm",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "pipe",
    "pipe2",
    /* asynchronous I/O (not io_uring: see above) */
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_setup",
    "io_submit",
    /* time */
    "adjtimex",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "gettimeofday",
    "nanosleep",
    "time",
    "times",
    /* memory */
    "brk",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mremap",
    "mseal",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "remap_file_pages",
    /* processes and threads (clone and clone3: argument rules below) */
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "fork",
    "vfork",
    "wait4",
    "waitid",
    "kill",
    "tgkill",
    "tkill",
    "getpid",
    "getppid",
    "gettid",
    "getpgid",
    "getpgrp",
    "setpgid",
    "getsid",
    "setsid",
    "getpriority",
    "setpriority",
    "getrusage",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "prctl",
    "arch_prctl",
    "modify_ldt",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "rseq",
    "get_thread_area",
    "set_thread_area",
    "restart_syscall",
    "getcpu",
    "sysinfo",
    "uname",
    "getrandom",
    "pidfd_open",
    "pidfd_send_signal",
    "process_mrelease",
    "capget",
    "capset",
    "seccomp",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "chroot",
    /* tracing within the sandbox (see above) */
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    /* futexes */
    "futex",
    "futex_waitv",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    /* scheduling */
    "ioprio_get",
    "ioprio_set",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    /* signals */
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sigaltstack",
    /* credentials (within the capability set) */
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getresgid",
    "getresuid",
    "getuid",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setuid",
    /* sockets (socket itself: argument rules below) */
    "accept",
    "accept4",
    "bind",
    "connect",
    "getpeername",
    "getsockname",
    "getsockopt",
    "listen",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setsockopt",
    "shutdown",
    "socketpair",
    /* System V and POSIX IPC (the sandbox has its own IPC namespace) */
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    /* devices: ioctl on what the sandbox may open (its /dev holds a few nodes) */
    "ioctl",
    NULL,
};

/* clone flags that create namespaces; clone() may not carry any of them. */
#define CLONE_NEW_ANY                                                                       \
  (0x00020000ULL /* NEWNS */ | 0x02000000ULL /* NEWCGROUP */ | 0x04000000ULL /* NEWUTS */ | \
   0x08000000ULL /* NEWIPC */ | 0x10000000ULL /* NEWUSER */ | 0x20000000ULL /* NEWPID */ | 0x40000000ULL /* NEWNET */)

#define ALLOW_IF_EQ(sys, v, reason) \
  { sys, 0, 1, {{0, SCMP_CMP_EQ, (v), 0}}, reason }

/* socket(family, ...) for one family, whatever the type. */
#define ALLOW_FAMILY(family) ALLOW_IF_EQ("socket", family, #family)

/* socket(family, type, ...) when the type's low four bits (SOCK_TYPE_MASK:
 * the kernel refuses any other bit but SOCK_NONBLOCK and SOCK_CLOEXEC) name
 * `type`. */
#define ALLOW_INET(family, type) \
  { "socket", 0, 2, {{0, SCMP_CMP_EQ, (family), 0}, {1, SCMP_CMP_MASKED_EQ, 0xf, (type)}}, #family " " #type }

const struct seccomp_rule seccomp_rules[] = {
    {"clone", 0, 1, {{0, SCMP_CMP_MASKED_EQ, CLONE_NEW_ANY, 0}}, "threads and processes, never new namespaces"},
    /* clone3 passes its flags in memory, which a filter cannot read: refuse it
     * as "not implemented", and glibc falls back to clone. */
    {"clone3", ENOSYS, 0, {{0}}, "flags are out of the filter's reach"},
    /* personality: only the values Docker allows (query, PER_LINUX,
     * PER_LINUX32 and their UNAME26 variants); not ADDR_NO_RANDOMIZE & co. */
    ALLOW_IF_EQ("personality", 0x0, "PER_LINUX"),
    ALLOW_IF_EQ("personality", 0x0008, "PER_LINUX32"),
    ALLOW_IF_EQ("personality", 0x20000, "UNAME26"),
    ALLOW_IF_EQ("personality", 0x20008, "UNAME26 | PER_LINUX32"),
    ALLOW_IF_EQ("personality", 0xffffffff, "query"),
    /* socket: every family but AF_PACKET (17) and AF_VSOCK (40), and for
     * AF_INET and AF_INET6 only stream, datagram and seqpacket sockets (not
     * SOCK_RAW). One comparison per argument in a rule, so the families are
     * listed one by one, and a value with high bits set matches nothing. */
    {"socket", 0, 1, {{0, SCMP_CMP_LT, AF_INET, 0}}, "AF_UNSPEC, AF_UNIX"},
    ALLOW_INET(AF_INET, SOCK_STREAM),
    ALLOW_INET(AF_INET, SOCK_DGRAM),
    ALLOW_INET(AF_INET, SOCK_SEQPACKET),
    ALLOW_FAMILY(AF_AX25),
    ALLOW_FAMILY(AF_IPX),
    ALLOW_FAMILY(AF_APPLETALK),
    ALLOW_FAMILY(AF_NETROM),
    ALLOW_FAMILY(AF_BRIDGE),
    ALLOW_FAMILY(AF_ATMPVC),
    ALLOW_FAMILY(AF_X25),
    ALLOW_INET(AF_INET6, SOCK_STREAM),
    ALLOW_INET(AF_INET6, SOCK_DGRAM),
    ALLOW_INET(AF_INET6, SOCK_SEQPACKET),
    ALLOW_FAMILY(AF_ROSE),
    ALLOW_FAMILY(AF_DECnet),
    ALLOW_FAMILY(AF_NETBEUI),
    ALLOW_FAMILY(AF_SECURITY),
    ALLOW_FAMILY(AF_KEY),
    ALLOW_FAMILY(AF_NETLINK),
    /* not AF_PACKET (17) */
    ALLOW_FAMILY(AF_ASH),
    ALLOW_FAMILY(AF_ECONET),
    ALLOW_FAMILY(AF_ATMSVC),
    ALLOW_FAMILY(AF_RDS),
    ALLOW_FAMILY(AF_SNA),
    ALLOW_FAMILY(AF_IRDA),
    ALLOW_FAMILY(AF_PPPOX),
    ALLOW_FAMILY(AF_WANPIPE),
    ALLOW_FAMILY(AF_LLC),
    ALLOW_FAMILY(AF_IB),
    ALLOW_FAMILY(AF_MPLS),
    ALLOW_FAMILY(AF_CAN),
    ALLOW_FAMILY(AF_TIPC),
    ALLOW_FAMILY(AF_BLUETOOTH),
    ALLOW_FAMILY(AF_IUCV),
    ALLOW_FAMILY(AF_RXRPC),
    ALLOW_FAMILY(AF_ISDN),
    ALLOW_FAMILY(AF_PHONET),
    ALLOW_FAMILY(AF_IEEE802154),
    ALLOW_FAMILY(AF_CAIF),
    ALLOW_FAMILY(AF_ALG),
    ALLOW_FAMILY(AF_NFC),
    /* not AF_VSOCK (40) */
    ALLOW_IF_EQ("socket", 41, "AF_KCM"),
    ALLOW_IF_EQ("socket", 42, "AF_QIPCRTR"),
    ALLOW_IF_EQ("socket", 43, "AF_SMC"),
    ALLOW_IF_EQ("socket", 44, "AF_XDP"),
    ALLOW_IF_EQ("socket", 45, "AF_MCTP"),
};
const unsigned int seccomp_rule_count = sizeof(seccomp_rules) / sizeof(seccomp_rules[0]);

/* From the kernel's arch/x86/entry/syscalls/syscall_64.tbl. */
const struct seccomp_syscall_number seccomp_newer_syscalls[] = {
    {"mseal", 462},         {"setxattrat", 463},   {"getxattrat", 464},   {"listxattrat", 465},
    {"removexattrat", 466}, {"file_getattr", 468}, {"file_setattr", 469},
};
const unsigned int seccomp_newer_syscall_count = sizeof(seccomp_newer_syscalls) / sizeof(seccomp_newer_syscalls[0]);
