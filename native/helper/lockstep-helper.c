/*
 * lockstep-helper: the small executable that does what a multithreaded Node
 * process must not do itself (unshare, setns, pivot_root, fork-and-exec into
 * namespaces). It has three verbs:
 *
 *   supervise  per-state-directory daemon and child subreaper: the parent of
 *              every sandbox init and of the CRIU service, so that sandboxes
 *              outlive the manager process and nothing is left a zombie.
 *   create     make a sandbox: new pid/mount/uts/ipc/net/cgroup namespaces,
 *              owned by a new user namespace when given an id range, the
 *              overlay root with its own /proc (sensitive files masked) and
 *              read-only /dev (own /dev/shm and /dev/pts), pivot_root, then
 *              confinement (confine.c: capabilities, no_new_privs, session
 *              keyring, rlimits, seccomp) and exec of the sandbox's init.
 *   enter      run one command inside a running sandbox (setns), in the
 *              foreground or detached as a child of the sandbox's init,
 *              confined exactly as the init is.
 *
 * Results and errors go out as one JSON object per line, errors shaped like
 * Node's SystemError ({code, errno, syscall, path}).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "confine.h"

#include "userns.h"

#define MAX_LIST 64

/* ---- small utilities ---------------------------------------------------- */

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc(c, f);
    } else if (c < 0x20) {
      fprintf(f, "\\u%04x", c);
    } else {
      fputc(c, f);
    }
  }
  fputc('"', f);
}

/* Write {"error":{...}} to fd; used from forked children, so no stdio buffers. */
void report_error_fd(int fd, int err, const char *syscall_name, const char *path) {
  char buf[PATH_MAX + 512];
  FILE *f = fmemopen(buf, sizeof(buf) - 2, "w");
  if (!f) return;
  fprintf(f, "{\"error\":{\"code\":");
  json_string(f, strerrorname_np(err) ? strerrorname_np(err) : "EUNKNOWN");
  fprintf(f, ",\"errno\":%d,\"syscall\":", -err);
  json_string(f, syscall_name);
  if (path) {
    fprintf(f, ",\"path\":");
    json_string(f, path);
  }
  fprintf(f, ",\"message\":");
  json_string(f, strerror(err));
  fprintf(f, "}}\n");
  long n = ftell(f);
  fclose(f);
  if (n > 0) {
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w;
  }
}

static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    buf += n;
    len -= (size_t)n;
  }
}

static void writef(int fd, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0) write_all(fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static int write_file(const char *path, const char *value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, value, strlen(value));
  int saved = errno;
  close(fd);
  errno = saved;
  return n < 0 ? -1 : 0;
}

static int join_cgroups(char **procs, int n) {
  char pid[32];
  snprintf(pid, sizeof(pid), "%d\n", getpid());
  for (int i = 0; i < n; i++) {
    if (write_file(procs[i], pid) != 0) return i;
  }
  return -1;
}

/* Bounding set only; the full confinement (confine.c) comes just before exec. */
static int drop_capabilities(void) { return confine_drop_bounding_set(); }

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

static int close_fds_from(int lowfd) {
  if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0) return 0;
  for (int fd = lowfd; fd < 65536; fd++) close(fd);
  return 0;
}

/* Closes every fd from 3 up, except `keep` (-1: none). No host fd may reach
 * a sandbox: it would be a way out, and CRIU could not dump it. */
static void close_fds_except(int keep) {
  if (keep < 3) {
    close_fds_from(3);
    return;
  }
  if (keep > 3 && syscall(SYS_close_range, 3, keep - 1, 0) != 0)
    for (int fd = 3; fd < keep; fd++) close(fd);
  close_fds_from(keep + 1);
}

/* Marks every fd from 3 up close-on-exec (the foreground command must not
 * inherit the manager's descriptors, but we still report errors until exec). */
static void cloexec_fds_from(int lowfd) {
  if (syscall(SYS_close_range, lowfd, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = lowfd; fd < 65536; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* execve with a PATH search that uses the sandbox's PATH, not ours. */
static void exec_in_path(char **argv, char **envp) {
  if (strchr(argv[0], '/')) {
    execve(argv[0], argv, envp);
    return;
  }
  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (char **e = envp; e && *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  int saved = ENOENT;
  char buf[PATH_MAX];
  const char *p = path;
  while (*p) {
    const char *end = strchrnul(p, ':');
    int len = (int)(end - p);
    snprintf(buf, sizeof(buf), "%.*s/%s", len, len ? p : ".", argv[0]);
    execve(buf, argv, envp);
    if (errno != ENOENT && errno != ENOTDIR) saved = errno;
    p = *end ? end + 1 : end;
  }
  errno = saved;
}

/* ---- argument parsing --------------------------------------------------- */

struct opts {
  const char *root, *hostname, *init, *cwd, *stdout_path, *stderr_path, *socket_path, *pidfile, *dev, *shm;
  char *cgroups[MAX_LIST];
  int ncgroups;
  char *envs[MAX_LIST * 4 + 1];
  int nenvs;
  int pid;
  unsigned long long start; /* the init's start time (clock ticks since boot), from the catalog */
  int status_fd;
  unsigned long id_base, id_count; /* user namespace: host ids base..base+count-1 (count 0: none) */
  bool detach;
  char **argv;
};

static void usage(void) {
  fprintf(stderr,
          "usage: lockstep-helper supervise --socket PATH --pidfile PATH\n"
          "       lockstep-helper create --root DIR --dev DIR --shm DIR --hostname NAME [--init PATH] "
          "[--cgroup PROCS]... [--env K=V]... [--id-base N --id-count N]\n"
          "       lockstep-helper prepare --dev DIR\n"
          "       lockstep-helper enter --pid PID --start TICKS [--cgroup PROCS]... [--cwd DIR] [--env K=V]... "
          "[--status-fd N] [--detach --stdout PATH --stderr PATH] -- CMD [ARG...]\n"
          "       lockstep-helper VERB --request-fd N   (the options above, NUL-terminated, read from fd N)\n");
  exit(2);
}

static void parse(int argc, char **argv, struct opts *o) {
  memset(o, 0, sizeof(*o));
  o->status_fd = -1;
  o->init = "/.lockstep/init";
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (usage(), (char *)NULL))
    if (strcmp(a, "--") == 0) {
      o->argv = &argv[i + 1];
      break;
    } else if (strcmp(a, "--root") == 0)
      o->root = NEXT();
    else if (strcmp(a, "--hostname") == 0)
      o->hostname = NEXT();
    else if (strcmp(a, "--dev") == 0)
      o->dev = NEXT();
    else if (strcmp(a, "--shm") == 0)
      o->shm = NEXT();
    else if (strcmp(a, "--init") == 0)
      o->init = NEXT();
    else if (strcmp(a, "--cwd") == 0)
      o->cwd = NEXT();
    else if (strcmp(a, "--stdout") == 0)
      o->stdout_path = NEXT();
    else if (strcmp(a, "--stderr") == 0)
      o->stderr_path = NEXT();
    else if (strcmp(a, "--socket") == 0)
      o->socket_path = NEXT();
    else if (strcmp(a, "--pidfile") == 0)
      o->pidfile = NEXT();
    else if (strcmp(a, "--pid") == 0)
      o->pid = atoi(NEXT());
    else if (strcmp(a, "--start") == 0)
      o->start = strtoull(NEXT(), NULL, 10);
    else if (strcmp(a, "--status-fd") == 0)
      o->status_fd = atoi(NEXT());
    else if (strcmp(a, "--detach") == 0)
      o->detach = true;
    else if (strcmp(a, "--id-base") == 0)
      o->id_base = strtoul(NEXT(), NULL, 10);
    else if (strcmp(a, "--id-count") == 0)
      o->id_count = strtoul(NEXT(), NULL, 10);
    else if (strcmp(a, "--cgroup") == 0) {
      if (o->ncgroups >= MAX_LIST) usage();
      o->cgroups[o->ncgroups++] = NEXT();
    } else if (strcmp(a, "--env") == 0) {
      if (o->nenvs >= MAX_LIST * 4) usage();
      o->envs[o->nenvs++] = NEXT();
    } else {
      fprintf(stderr, "lockstep-helper: unknown option %s\n", a);
      usage();
    }
#undef NEXT
  }
  o->envs[o->nenvs] = NULL;
}

/* ---- create ------------------------------------------------------------- */

struct devnode {
  const char *name;
  unsigned maj, min;
};
static const struct devnode devnodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                                          {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};

/* Loopback up in the calling process's (new) network namespace: a sandbox
 * has no other network. */
static int loopback_up(int errfd) {
  int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sk < 0) {
    report_error_fd(errfd, errno, "socket", NULL);
    return -1;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  int r = ioctl(sk, SIOCSIFFLAGS, &ifr);
  if (r != 0) report_error_fd(errfd, errno, "ioctl(SIOCSIFFLAGS)", "lo");
  close(sk);
  return r;
}

/* runc's masked paths: kernel memory, host-wide timers and scheduler
 * state, keys, hardware; paths this kernel lacks are skipped. A file is
 * covered by a bind of /dev/null. A directory is covered by a read-only bind
 * of /dev/pts taken before devpts is mounted there, i.e. of the empty host
 * directory under it: runc uses an empty tmpfs, but CRIU archives every
 * tmpfs with tar on each dump and restore (measured ~60-140 ms each on this
 * loaded VM), while a bind of a path inside the external /dev costs nothing. */
static const char *const masked_paths[] = {"/proc/acpi",
                                           "/proc/asound",
                                           "/proc/kcore",
                                           "/proc/keys",
                                           "/proc/latency_stats",
                                           "/proc/timer_list",
                                           "/proc/timer_stats",
                                           "/proc/sched_debug",
                                           "/proc/scsi",
                                           "/sys/firmware",
                                           "/sys/devices/virtual/powercap"};

/* True when the image's /etc/group has gid 5 (tty, on Debian, Alpine,
 * busybox): only then do new terminals belong to it. Runs after pivot_root,
 * so the path resolves inside the sandbox; the file is the image's, so only
 * a regular file is read (not a symlink to /dev/zero, not a FIFO), and at
 * most 64 KiB of it. */
static bool image_has_tty_group(void) {
  int fd = open("/etc/group", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
  if (!f) {
    close(fd);
    return false;
  }
  char line[512];
  bool found = false;
  while (!found && ftell(f) < 65536 && fgets(line, sizeof(line), f)) {
    char *gid = strchr(line, ':');
    if (gid) gid = strchr(gid + 1, ':');
    if (gid && strncmp(gid + 1, "5:", 2) == 0) found = true;
  }
  fclose(f);
  return found;
}

/* Runs after pivot_root: masks /proc (before /dev/pts is mounted: see
 * masked_paths), mounts /dev/pts, then makes /dev read-only, so
 * nothing can be created in the host directory behind it while its device
 * nodes stay usable. */
static int mount_dev_and_mask_proc(int errfd) {
  for (size_t i = 0; i < sizeof(masked_paths) / sizeof(masked_paths[0]); i++) {
    struct stat st;
    const char *p = masked_paths[i];
    if (lstat(p, &st) != 0) continue;
    int r =
        S_ISDIR(st.st_mode) ? mount("/dev/pts", p, NULL, MS_BIND, NULL) : mount("/dev/null", p, NULL, MS_BIND, NULL);
    if (r == 0 && S_ISDIR(st.st_mode))
      r = mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (r != 0) {
      report_error_fd(errfd, errno, "mount(bind mask)", p);
      return -1;
    }
  }
  /* A devpts instance of its own: the sandbox's terminals are not the host's. */
  const char *pts_opts =
      image_has_tty_group() ? "newinstance,ptmxmode=0666,mode=0620,gid=5" : "newinstance,ptmxmode=0666,mode=0620";
  if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts_opts) != 0) {
    report_error_fd(errfd, errno, "mount(devpts)", "/dev/pts");
    return -1;
  }
  if (mount(NULL, "/dev", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL) != 0) {
    report_error_fd(errfd, errno, "mount(remount /dev read-only)", "/dev");
    return -1;
  }
  return 0;
}

/* Runs as pid 1 of the new pid namespace, in the new mount namespace. Any
 * failure is reported on errfd and ends the child.
 * The caller has made the sandbox root its working directory and cloned the
 * mounts of its /dev and /dev/shm folders as devfd and shmfd (open_tree):
 * with a user namespace, root
 * here may not search the host folders on the way to either. Nor may it
 * pivot_root into a mount it inherited (those are locked to their parent),
 * so the root is cloned here and the clone attached over it first. */
static void setup_sandbox_and_exec(const struct opts *o, int errfd, int devfd, int shmfd) {
  char path[PATH_MAX];
#define FAIL(sc, p)                           \
  do {                                        \
    report_error_fd(errfd, errno, (sc), (p)); \
    _exit(1);                                 \
  } while (0)

  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) FAIL("mount(MS_PRIVATE)", "/");
  int rootfd = (int)syscall(SYS_open_tree, AT_FDCWD, ".", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (rootfd < 0) FAIL("open_tree(root)", o->root);
  if (syscall(SYS_move_mount, rootfd, "", AT_FDCWD, ".", MOVE_MOUNT_F_EMPTY_PATH) != 0)
    FAIL("move_mount(root)", o->root);
  if (fchdir(rootfd) != 0) FAIL("fchdir", o->root);
  snprintf(path, sizeof(path), "proc");
  if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) FAIL("mount(proc)", path);
  /* The sandbox's own /proc still exposes host-wide knobs (/proc/sys is not
   * per-namespace for most entries: kernel.core_pattern would run a program
   * as host root). Make them read-only, as runc does. */
  static const char *ro_proc[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};
  for (size_t i = 0; i < sizeof(ro_proc) / sizeof(ro_proc[0]); i++) {
    struct stat st;
    snprintf(path, sizeof(path), "proc/%s", ro_proc[i]);
    if (stat(path, &st) != 0) continue;
    if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) != 0) FAIL("mount(bind /proc)", path);
    if (mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
      FAIL("mount(remount /proc read-only)", path);
  }
  /* /dev is a bind mount of a host directory that holds only the few
   * device nodes a sandbox needs. CRIU treats it as an external mount, so a
   * checkpoint does not tar up a tmpfs every time. It is made read-only once
   * its submounts are in place (mount_dev_and_mask_proc). */
  if (syscall(SYS_move_mount, devfd, "", AT_FDCWD, "dev", MOVE_MOUNT_F_EMPTY_PATH) != 0)
    FAIL("move_mount(/dev)", o->dev);
  /* The clone was taken in the host's namespace, so it joined the peer group
   * of the host mount it came from: left shared, /dev/shm and /dev/pts
   * mounted below would propagate to the host's copy of the folder (where
   * they outlive the sandbox and make CRIU's open_tree of the folder fail
   * with EINVAL: locked children), and devpts would also appear on every
   * mask bound from /dev. */
  if (mount(NULL, "dev", NULL, MS_REC | MS_PRIVATE, NULL) != 0) FAIL("mount(MS_PRIVATE)", "dev");
  /* /dev/shm is a folder of the sandbox's writable layer, beside the
   * overlay's upper directory: the disk quota bounds it, a checkpoint's
   * layer snapshot holds it, and CRIU treats it as external, where a tmpfs
   * would be archived with tar on every dump and unpacked on every restore
   * (measured: the largest single cost of a checkpoint). */
  if (syscall(SYS_move_mount, shmfd, "", AT_FDCWD, "dev/shm", MOVE_MOUNT_F_EMPTY_PATH) != 0)
    FAIL("move_mount(/dev/shm)", o->shm);
  if (mount(NULL, "dev/shm", NULL, MS_PRIVATE, NULL) != 0) FAIL("mount(MS_PRIVATE)", "dev/shm");

  if (o->hostname && sethostname(o->hostname, strlen(o->hostname)) != 0) FAIL("sethostname", o->hostname);
  if (loopback_up(errfd) != 0) _exit(1);

  /* pivot_root(".", ".") stacks the old root under the new one; detaching it
   * leaves the sandbox with no path back to the host (runc does the same). */
  if (syscall(SYS_pivot_root, ".", ".") != 0) FAIL("pivot_root", o->root);
  if (umount2(".", MNT_DETACH) != 0) FAIL("umount2(old root)", "/");
  if (chdir("/") != 0) FAIL("chdir", "/");

  if (mount_dev_and_mask_proc(errfd) != 0) _exit(1);
  if (drop_capabilities() != 0) FAIL("prctl(PR_CAPBSET_DROP)", NULL);
  if (setsid() < 0) FAIL("setsid", NULL);

  /* Every fd must resolve inside the sandbox or CRIU cannot dump the tree. */
  int devnull = open("/dev/null", O_RDWR);
  if (devnull < 0) FAIL("open", "/dev/null");
  dup2(devnull, 0);
  dup2(devnull, 1);
  dup2(devnull, 2);
  if (devnull > 2) close(devnull);
  if (fcntl(errfd, F_SETFD, FD_CLOEXEC) != 0) FAIL("fcntl", NULL);
  close_fds_except(errfd);

  char *argv[] = {(char *)"lockstep-init", NULL};
  char *default_env[] = {(char *)"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         (char *)"HOME=/root", NULL};
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  const char *failed = NULL;
  /* Last, because the filter refuses what the set-up above needed; the init
   * and everything it starts inherit all of it. */
  if (confine_process(&failed) != 0) FAIL(failed, NULL);
  execve(o->init, argv, o->nenvs ? (char **)o->envs : default_env);
  FAIL("execve", o->init);
#undef FAIL
}

/* Device nodes for a sandbox's /dev; existing ones are left alone, so
 * preparing the same directory again (rollback) is a no-op. */
static int prepare_dev(const char *dir, int errfd) {
  char path[PATH_MAX];
  for (size_t i = 0; i < sizeof(devnodes) / sizeof(devnodes[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", dir, devnodes[i].name);
    if (mknod(path, S_IFCHR | 0666, makedev(devnodes[i].maj, devnodes[i].min)) != 0 && errno != EEXIST) {
      report_error_fd(errfd, errno, "mknod", path);
      return -1;
    }
    if (chmod(path, 0666) != 0) {
      report_error_fd(errfd, errno, "chmod", path);
      return -1;
    }
  }
  static const char *links[][2] = {{"/proc/self/fd", "fd"},
                                   {"/proc/self/fd/0", "stdin"},
                                   {"/proc/self/fd/1", "stdout"},
                                   {"/proc/self/fd/2", "stderr"},
                                   {"pts/ptmx", "ptmx"}};
  for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", dir, links[i][1]);
    if (symlink(links[i][0], path) != 0 && errno != EEXIST) {
      report_error_fd(errfd, errno, "symlink", path);
      return -1;
    }
  }
  /* Mount points of the sandbox's /dev/shm and /dev/pts: /dev itself is
   * read-only inside, so they must exist before. */
  static const char *const mountpoints[] = {"shm", "pts"};
  for (size_t i = 0; i < sizeof(mountpoints) / sizeof(mountpoints[0]); i++) {
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, mountpoints[i]);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      report_error_fd(errfd, errno, "mkdir", path);
      return -1;
    }
    int found = lstat(path, &st);
    if (found != 0 || !S_ISDIR(st.st_mode)) {
      report_error_fd(errfd, found != 0 ? errno : ENOTDIR, "lstat", path);
      return -1;
    }
  }
  return 0;
}

/* What a restored (forked) sandbox needs before CRIU runs: its /dev folder. */
static int cmd_prepare(const struct opts *o) {
  if (!o->dev) usage();
  if (prepare_dev(o->dev, 1) != 0) return 1;
  writef(1, "{\"prepared\":true}\n");
  return 0;
}

static int cmd_create(const struct opts *o) {
  if (!o->root || !o->dev || !o->shm) usage();
  if (prepare_dev(o->dev, 1) != 0) return 1;
  int devfd = (int)syscall(SYS_open_tree, AT_FDCWD, o->dev, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr devattr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC};
  if (devfd < 0 || syscall(SYS_mount_setattr, devfd, "", AT_EMPTY_PATH, &devattr, sizeof(devattr)) != 0 ||
      chdir(o->root) != 0) {
    report_error_fd(1, errno, devfd < 0 ? "open_tree" : "mount_setattr/chdir", devfd < 0 ? o->dev : o->root);
    return 1;
  }
  int shmfd = (int)syscall(SYS_open_tree, AT_FDCWD, o->shm, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr shmattr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC};
  if (shmfd < 0 || syscall(SYS_mount_setattr, shmfd, "", AT_EMPTY_PATH, &shmattr, sizeof(shmattr)) != 0) {
    report_error_fd(1, errno, shmfd < 0 ? "open_tree" : "mount_setattr", o->shm);
    return 1;
  }
  int bad = join_cgroups((char **)o->cgroups, o->ncgroups);
  if (bad >= 0) {
    report_error_fd(1, errno, "write(cgroup.procs)", o->cgroups[bad]);
    return 1;
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    report_error_fd(1, errno, "pipe2", NULL);
    return 1;
  }
  /* The cgroup namespace roots /proc/self/cgroup and a cgroup mount at the
   * sandbox's own cgroup (joined above). */
  const int ns_flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWCGROUP;
  pid_t child;
  if (o->id_count > 0) {
    /* User namespace first (userns.c): it then owns all the others. */
    child = userns_fork(o->id_base, o->id_count, ns_flags, 1, pipefd[1]);
    if (child < 0) {
      close(pipefd[1]);
      char buf[PATH_MAX + 512];
      ssize_t n = read(pipefd[0], buf, sizeof(buf));
      if (n > 0) write_all(1, buf, (size_t)n);
      return 1;
    }
  } else {
    if (unshare(ns_flags) != 0) {
      report_error_fd(1, errno, "unshare", NULL);
      return 1;
    }
    child = fork();
  }
  if (child < 0) {
    report_error_fd(1, errno, "fork", NULL);
    return 1;
  }
  if (child == 0) {
    close(pipefd[0]);
    setup_sandbox_and_exec(o, pipefd[1], devfd, shmfd);
    _exit(1);
  }
  close(pipefd[1]);
  /* EOF on the pipe means the exec succeeded (the write end is close-on-exec). */
  char buf[PATH_MAX + 512];
  ssize_t n, total = 0;
  while ((n = read(pipefd[0], buf + total, sizeof(buf) - 1 - (size_t)total)) > 0) total += n;
  if (total > 0) {
    write_all(1, buf, (size_t)total);
    waitpid(child, NULL, 0);
    return 1;
  }
  /* The init is orphaned when we exit and adopted by the supervisor. */
  writef(1, "{\"pid\":%d}\n", child);
  return 0;
}

/* ---- enter -------------------------------------------------------------- */

static pid_t fg_child = -1;

static void forward_signal(int sig) {
  if (fg_child > 0) kill(-fg_child, sig == SIGUSR1 ? SIGKILL : sig);
}

/*
 * Output relay of a foreground command. The command writes into pipes of
 * ours, never into the manager's: a background process it leaves behind
 * then holds only our pipes, so when we exit the manager's pipes close and
 * it can wait for all of the output without waiting for that process.
 */
struct relay {
  int from; /* our read end; -1 once at EOF */
  int to;   /* 1 or 2: the manager's pipe; -1 once the manager stopped reading */
};

/* Writes all of buf to r->to, waiting while the manager's pipe is full. */
static void relay_write(struct relay *r, const char *buf, size_t len) {
  while (len > 0 && r->to >= 0) {
    ssize_t n = write(r->to, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd p = {.fd = r->to, .events = POLLOUT};
        poll(&p, 1, -1);
        continue;
      }
      r->to = -1; /* EPIPE: nobody reads any more; keep draining so the command never blocks */
      return;
    }
    buf += n;
    len -= (size_t)n;
  }
}

/* Moves up to `limit` bytes (-1: what one read gives) from the pipe; false at EOF or error. */
static bool relay_some(struct relay *r, ssize_t limit) {
  static char buf[65536];
  do {
    size_t want = limit < 0 || limit > (ssize_t)sizeof(buf) ? sizeof(buf) : (size_t)limit;
    ssize_t n = read(r->from, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) {
      close(r->from);
      r->from = -1;
      return false;
    }
    relay_write(r, buf, (size_t)n);
    if (limit < 0) return true;
    limit -= n;
  } while (limit > 0);
  return true;
}

/*
 * Relays the command's output until it exits, then drains: exactly the bytes
 * that are in each pipe when its exit is seen (FIONREAD), without blocking.
 * Every byte the command wrote before exiting is among them (a write to a
 * pipe has completed once it returns). Output of processes it left behind is
 * relayed while the command runs and up to that moment; later output is not
 * this command's, and those processes get EPIPE once we are gone. Returns
 * the command's wait status.
 */
static int relay_until_exit(pid_t child, struct relay rel[2]) {
  int pidfd = (int)syscall(SYS_pidfd_open, child, 0);
  int status = 0;
  bool reaped = false;
  for (;;) {
    struct pollfd p[3] = {
        {.fd = rel[0].from, .events = POLLIN}, {.fd = rel[1].from, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    /* Without a pidfd (kernels before 5.3), look for the exit ten times a second. */
    int n = poll(p, 3, pidfd >= 0 ? -1 : 100);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0; i++)
      if (p[i].revents) relay_some(&rel[i], -1);
    if (pidfd >= 0 ? (n > 0 && p[2].revents) : (reaped = waitpid(child, &status, WNOHANG) == child)) break;
  }
  for (int i = 0; i < 2; i++) {
    int pending = 0;
    if (rel[i].from >= 0 && ioctl(rel[i].from, FIONREAD, &pending) == 0 && pending > 0) relay_some(&rel[i], pending);
    if (rel[i].from >= 0) close(rel[i].from);
  }
  if (pidfd >= 0) close(pidfd);
  while (!reaped && waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

/* The sandbox's init, pinned: a pidfd and its /proc directory, both checked
 * to be the process the catalog knows (pid and start time). */
struct pinned_init {
  int pidfd, procfd, rootfd;
};

/* Start time (field 22 of /proc/<pid>/stat) and state, read through a pinned
 * /proc/<pid> directory. The command name (field 2) may hold spaces and
 * parentheses, so fields are counted from the last ')'. */
static int read_start_time(int procfd, unsigned long long *start, char *state) {
  int fd = openat(procfd, "stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  int saved = errno;
  close(fd);
  if (n <= 0) {
    errno = n < 0 ? saved : ESRCH;
    return -1;
  }
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ') {
    errno = EINVAL;
    return -1;
  }
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (!p) {
      errno = EINVAL;
      return -1;
    }
    p++;
  }
  *start = strtoull(p, NULL, 10);
  return 0;
}

/* A sandbox is addressed by identity, never by a bare pid: once its init has
 * exited, a host process may get the same pid, and joining that process's
 * namespaces and root would run the command on the host. So: take a pidfd
 * for the pid, open its /proc directory, check the start time there, open
 * the root through that directory, and finally check that the pidfd's
 * process is still running. A running process keeps its pid, so the
 * directory opened in between is that same process; from here on nothing
 * names the init by number (setns takes the pidfd). Any mismatch is
 * reported as ESRCH with syscall "identity": the sandbox is not running. */
static int pin_init(pid_t pid, unsigned long long expected_start, int status_fd, struct pinned_init *out) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d", pid);
  out->pidfd = out->procfd = out->rootfd = -1;
  out->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (out->pidfd < 0) {
    int err = errno;
    /* No such process (ESRCH; ENOENT once it has been reaped on recent
     * kernels) or not a thread-group leader (EINVAL): either way the pid does
     * not name the init. Only resource errors are reported as such. */
    bool gone = err == ESRCH || err == ENOENT || err == EINVAL;
    report_error_fd(status_fd, err, gone ? "identity" : "pidfd_open", path);
    return -1;
  }
  out->procfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned long long start = 0;
  char state = '?';
  if (out->procfd < 0 || read_start_time(out->procfd, &start, &state) != 0 || start != expected_start || state == 'Z' ||
      state == 'X') {
    report_error_fd(status_fd, ESRCH, "identity", path);
    return -1;
  }
  out->rootfd = openat(out->procfd, "root", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (out->rootfd < 0) {
    report_error_fd(status_fd, ESRCH, "identity", path);
    return -1;
  }
  struct pollfd exited = {out->pidfd, POLLIN, 0};
  if (poll(&exited, 1, 0) != 0) { /* readable: the process has exited */
    report_error_fd(status_fd, ESRCH, "identity", path);
    return -1;
  }
  return 0;
}

static int cmd_enter(const struct opts *o) {
  int status_fd = o->status_fd >= 0 ? o->status_fd : 2;
  if (o->pid <= 0 || o->start == 0 || !o->argv || !o->argv[0]) usage();
  if (o->status_fd >= 0) fcntl(o->status_fd, F_SETFD, FD_CLOEXEC);

  struct pinned_init init;
  if (pin_init(o->pid, o->start, status_fd, &init) != 0) return 125;
  int bad = join_cgroups((char **)o->cgroups, o->ncgroups);
  if (bad >= 0) {
    report_error_fd(status_fd, errno, "write(cgroup.procs)", o->cgroups[bad]);
    return 125;
  }
  /* The user namespace is opened through the pinned /proc directory and
   * joined last (from then on we hold no host privilege). */
  int usernsfd = userns_open_at(init.procfd, status_fd);
  if (usernsfd == -2) return 125;
  /* One setns through the pidfd joins the other six namespaces at once
   * (Linux >= 5.8), or none: ESRCH if the init exited since it was pinned. */
  if (setns(init.pidfd, CLONE_NEWCGROUP | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS) !=
      0) {
    int err = errno;
    report_error_fd(status_fd, err, err == ESRCH ? "identity" : "setns", NULL);
    return 125;
  }
  if (userns_join(usernsfd, status_fd) != 0) return 125;
  if (fchdir(init.rootfd) != 0 || chroot(".") != 0) {
    report_error_fd(status_fd, errno, "chroot", "/");
    return 125;
  }
  close(init.pidfd);
  close(init.procfd);
  int rootfd = init.rootfd;
  close(rootfd);
  if (drop_capabilities() != 0) {
    report_error_fd(status_fd, errno, "prctl(PR_CAPBSET_DROP)", NULL);
    return 125;
  }

  char *default_env[] = {(char *)"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         (char *)"HOME=/root", NULL};
  char **envp = o->nenvs ? (char **)o->envs : default_env;
  const char *cwd = o->cwd ? o->cwd : "/";

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = forward_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);

  /* [0]: stdout, [1]: stderr; the write ends go to the foreground command. */
  int outp[2] = {-1, -1}, errp[2] = {-1, -1};
  if (!o->detach && (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0)) {
    report_error_fd(status_fd, errno, "pipe2", NULL);
    return 125;
  }
  /* A manager that stops reading must not kill us before the command is reaped. */
  signal(SIGPIPE, SIG_IGN);

  pid_t parent = getpid();
  pid_t child = fork(); /* the child is the first process we put in the sandbox's pid namespace */
  if (child < 0) {
    report_error_fd(status_fd, errno, "fork", NULL);
    return 125;
  }
  if (child == 0) {
    sigset_t none;
    sigemptyset(&none);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (o->detach) {
      /* Double fork: the grandchild is adopted by the sandbox's init, so it
       * is part of the process tree that checkpoints capture. */
      pid_t grandchild = fork();
      if (grandchild < 0) {
        report_error_fd(status_fd, errno, "fork", NULL);
        _exit(125);
      }
      if (grandchild > 0) _exit(0);
      setsid();
      if (chdir(cwd) != 0) {
        report_error_fd(status_fd, errno, "chdir", cwd);
        _exit(125);
      }
      int in = open("/dev/null", O_RDONLY);
      const char *outp = o->stdout_path ? o->stdout_path : "/dev/null";
      const char *errp = o->stderr_path ? o->stderr_path : "/dev/null";
      int out = open(outp, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (out < 0) {
        report_error_fd(status_fd, errno, "open", outp);
        _exit(125);
      }
      int err = open(errp, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (in < 0 || err < 0) {
        report_error_fd(status_fd, errno, "open", in < 0 ? "/dev/null" : errp);
        _exit(125);
      }
      dup2(in, 0);
      dup2(out, 1);
      dup2(err, 2);
      /* Nothing from the host may stay open, except the status fd, which is
       * close-on-exec. */
      close_fds_except(status_fd);
      writef(status_fd, "{\"nsPid\":%d}\n", getpid());
    } else {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent && getppid() != 0) _exit(125);
      if (chdir(cwd) != 0) {
        report_error_fd(status_fd, errno, "chdir", cwd);
        _exit(125);
      }
      writef(status_fd, "{\"nsPid\":%d}\n", getpid());
      if (dup2(outp[1], 1) < 0 || dup2(errp[1], 2) < 0) {
        report_error_fd(status_fd, errno, "dup2", NULL);
        _exit(125);
      }
      cloexec_fds_from(3);
    }
    const char *failed = NULL;
    if (confine_process(&failed) != 0) {
      report_error_fd(status_fd, errno, failed, NULL);
      _exit(125);
    }
    exec_in_path(o->argv, envp);
    report_error_fd(status_fd, errno, "execve", o->argv[0]);
    _exit(errno == ENOENT ? 127 : 126);
  }
  fg_child = child;
  setpgid(child, child);
  int status = 0;
  if (o->detach) {
    while (waitpid(child, &status, 0) < 0) {
      if (errno != EINTR) return 125;
    }
  } else {
    close(outp[1]);
    close(errp[1]);
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    struct relay rel[2] = {{.from = outp[0], .to = 1}, {.from = errp[0], .to = 2}};
    status = relay_until_exit(child, rel);
    if (status < 0) return 125;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 125;
}

/* ---- supervise ---------------------------------------------------------- */

#define MAX_DAEMONS 16
static pid_t daemons[MAX_DAEMONS];

/* What the supervisor will run, fixed when it starts: its own executable
 * (for the helper's verbs), the CRIU binary, and its run folder (where the
 * CRIU service's socket and log live). */
static char self_exe[PATH_MAX];
static char criu_exe[PATH_MAX];
static char run_dir[PATH_MAX];

static void refuse(int conn, int err, const char *why) {
  writef(conn, "{\"error\":{\"code\":\"%s\",\"errno\":%d,\"syscall\":\"supervise\",\"message\":", strerrorname_np(err),
         -err);
  char buf[512];
  FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
  if (!f) return;
  json_string(f, why);
  long n = ftell(f);
  fclose(f);
  if (n > 0) write_all(conn, buf, (size_t)n);
  writef(conn, "}}\n");
}

/* A path directly inside the run folder (no subfolder, no ".."). */
static bool in_run_dir(const char *p) {
  size_t n = strlen(run_dir);
  return strncmp(p, run_dir, n) == 0 && p[n] == '/' && p[n + 1] != '\0' && !strchr(p + n + 1, '/') &&
         strcmp(p + n + 1, "..") != 0 && strcmp(p + n + 1, ".") != 0;
}

/* The only requests a supervisor serves: the helper's own create/prepare
 * verbs, and the CRIU service on a socket in the run folder. Anything else
 * (another program, another helper verb) is refused, so the socket is not a
 * "run anything as root" service even for a confused or compromised client. */
static const char *disallowed(bool daemon_mode, char **argv, int argc) {
  if (daemon_mode) {
    if (argc != 4 || strcmp(argv[0], criu_exe) != 0 || strcmp(argv[1], "service") != 0 ||
        strcmp(argv[2], "--address") != 0)
      return "only the CRIU service (criu service --address SOCKET) runs as a daemon";
    if (!in_run_dir(argv[3])) return "the CRIU service socket must be in the supervisor's run folder";
    return NULL;
  }
  char real[PATH_MAX];
  if (argc < 2 || !realpath(argv[0], real) || strcmp(real, self_exe) != 0)
    return "only the supervisor's own helper executable runs";
  if (strcmp(argv[1], "create") != 0 && strcmp(argv[1], "prepare") != 0)
    return "only the helper verbs create and prepare run";
  return NULL;
}

/* Serves one whole request (read by the poll loop, see struct pending):
 * NUL-separated tokens ending with an empty token.
 * "run" ARGV...           the child's stdout is this connection
 * "daemon" LOGFILE ARGV... the child logs to LOGFILE; we answer {"pid":N}
 * Only a peer with our own uid (SO_PEERCRED) is served, and only the
 * requests disallowed() lets through. */
static void handle_request(int conn, char *buf, size_t len) {
  struct ucred peer;
  socklen_t plen = sizeof(peer);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0) {
    report_error_fd(conn, errno, "getsockopt(SO_PEERCRED)", NULL);
    return;
  }
  bool stranger = peer.uid != geteuid();
  /* A stranger's request was read whole (so that it gets the refusal
   * instead of a broken pipe) and is dropped; none of it is looked at. */
  if (stranger) {
    fprintf(stderr, "lockstep-helper: refused a request from pid %d uid %u\n", peer.pid, peer.uid);
    fflush(stderr);
    refuse(conn, EACCES, "the supervisor serves only its own user");
    return;
  }
  char *tokens[512];
  int nt = 0;
  for (size_t i = 0; i < len && nt < 511;) {
    if (buf[i] == '\0') break;
    tokens[nt++] = &buf[i];
    i += strlen(&buf[i]) + 1;
  }
  tokens[nt] = NULL;
  bool isolated = nt >= 3 && strcmp(tokens[0], "daemon-isolated") == 0;
  bool daemon_mode = nt >= 3 && (strcmp(tokens[0], "daemon") == 0 || isolated);
  bool run_mode = nt >= 2 && strcmp(tokens[0], "run") == 0;
  if (!daemon_mode && !run_mode) {
    writef(conn, "{\"error\":{\"code\":\"EINVAL\",\"errno\":-22,\"syscall\":\"supervise\"}}\n");
    return;
  }
  char **argv = daemon_mode ? &tokens[2] : &tokens[1];
  const char *why = disallowed(daemon_mode, argv, nt - (daemon_mode ? 2 : 1));
  if (!why && daemon_mode && !in_run_dir(tokens[1])) why = "a daemon's log must be in the supervisor's run folder";
  if (why) {
    fprintf(stderr, "lockstep-helper: refused %s %s: %s\n", tokens[0], argv[0] ? argv[0] : "", why);
    fflush(stderr);
    refuse(conn, EPERM, why);
    return;
  }
  pid_t pid = fork();
  if (pid < 0) {
    report_error_fd(conn, errno, "fork", NULL);
    return;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    if (isolated) {
      /* The CRIU service runs in a mount namespace of its own whose /run is
       * a tmpfs: CRIU then caches its kernel-feature probe there
       * (/run/criu.kdat) instead of redoing it on every request. The
       * namespace is a slave of the host's, so sandbox mounts made later
       * (on the shared run folder) still appear in it. */
      if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
          mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m") != 0) {
        report_error_fd(conn, errno, "unshare/mount(/run)", "/run");
        _exit(1);
      }
    }
    if (daemon_mode) {
      /* The CRIU service creates its socket with our umask: owner only. */
      umask(0077);
      int log = open(tokens[1], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (log < 0) {
        report_error_fd(conn, errno, "open", tokens[1]);
        _exit(1);
      }
      dup2(log, 1);
      dup2(log, 2);
    } else {
      dup2(conn, 1);
    }
    close_fds_from(3);
    execv(argv[0], argv);
    report_error_fd(1, errno, "execv", argv[0]);
    _exit(127);
  }
  if (daemon_mode) {
    for (int i = 0; i < MAX_DAEMONS; i++)
      if (daemons[i] == 0) {
        daemons[i] = pid;
        break;
      }
    writef(conn, "{\"pid\":%d}\n", pid);
  }
}

/* A connection whose request has not all arrived yet. The supervisor reads
 * every such connection from its one poll loop instead of blocking on one:
 * the manager writes its request only on the event-loop turn after its
 * connect() succeeded, and on a busy host that turn can come seconds later
 * (a blocking read with a 5 s timeout closed such connections, and the
 * manager's write then failed with EPIPE). A slow client now holds up
 * nobody, and gets as long as the manager waits for an answer (30 s). */
#define MAX_PENDING 64
#define REQUEST_MAX 65536
#define REQUEST_DEADLINE_MS 30000
struct pending {
  int fd;
  size_t len;
  long long deadline_ms;
  char *buf;
};

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads what has arrived: 1 when the request is whole (it ends with an
 * empty token), 0 when more is to come, -1 when the peer hung up first or
 * sent more than a request may hold. */
static int read_pending(struct pending *q) {
  for (;;) {
    ssize_t n = read(q->fd, q->buf + q->len, REQUEST_MAX - 1 - q->len);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    if (n == 0) return -1;
    q->len += (size_t)n;
    if (q->len >= 2 && q->buf[q->len - 1] == '\0' && q->buf[q->len - 2] == '\0') return 1;
    if (q->len >= REQUEST_MAX - 1) return -1;
  }
}

static void finish_pending(struct pending *q, bool whole) {
  if (whole) {
    /* Blocking again: a "run" child gets this socket as its stdout. */
    int fl = fcntl(q->fd, F_GETFL);
    if (fl >= 0) fcntl(q->fd, F_SETFL, fl & ~O_NONBLOCK);
    handle_request(q->fd, q->buf, q->len);
  }
  close(q->fd);
  free(q->buf);
}

static int cmd_supervise(const struct opts *o) {
  if (!o->socket_path || !o->pidfile) usage();
  int pidfd = open(o->pidfile, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (pidfd < 0) {
    report_error_fd(2, errno, "open", o->pidfile);
    return 1;
  }
  if (flock(pidfd, LOCK_EX | LOCK_NB) != 0) {
    /* Another supervisor owns this state directory: nothing to do. */
    return errno == EWOULDBLOCK ? 0 : 1;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    report_error_fd(2, errno, "prctl(PR_SET_CHILD_SUBREAPER)", NULL);
    return 1;
  }
  if (ftruncate(pidfd, 0) != 0) return 1;
  writef(pidfd, "%d\n", getpid());

  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
  if (n <= 0) {
    report_error_fd(2, errno, "readlink", "/proc/self/exe");
    return 1;
  }
  self_exe[n] = '\0';
  /* Upgraded in place while we run: the path still names the helper to run. */
  static const char deleted[] = " (deleted)";
  size_t el = strlen(self_exe), dl = sizeof(deleted) - 1;
  if (el > dl && strcmp(self_exe + el - dl, deleted) == 0) self_exe[el - dl] = '\0';
  /* The manager that starts us passes the CRIU binary it is configured with. */
  const char *criu = getenv("LOCKSTEP_CRIU");
  snprintf(criu_exe, sizeof(criu_exe), "%s", criu && *criu ? criu : "/opt/lockstep/bin/criu");
  snprintf(run_dir, sizeof(run_dir), "%s", o->socket_path);
  char *slash = strrchr(run_dir, '/');
  if (!slash || slash == run_dir) {
    report_error_fd(2, EINVAL, "supervise", o->socket_path);
    return 1;
  }
  *slash = '\0';

  int sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (strlen(o->socket_path) >= sizeof(addr.sun_path)) {
    report_error_fd(2, ENAMETOOLONG, "bind", o->socket_path);
    return 1;
  }
  strcpy(addr.sun_path, o->socket_path);
  unlink(o->socket_path);
  mode_t old = umask(0177);
  if (bind(sk, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(sk, 64) != 0) {
    report_error_fd(2, errno, "bind", o->socket_path);
    return 1;
  }
  umask(old);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  fprintf(stderr, "lockstep-helper: supervising %s (pid %d)\n", o->socket_path, getpid());
  fflush(stderr);

  struct pending pending[MAX_PENDING];
  int npending = 0;
  for (;;) {
    /* The listening socket, the signals, then every connection whose
     * request is still arriving. A full table leaves new connections in
     * the listen backlog until a slot frees. */
    struct pollfd p[2 + MAX_PENDING];
    p[0] = (struct pollfd){sk, npending < MAX_PENDING ? POLLIN : 0, 0};
    p[1] = (struct pollfd){sfd, POLLIN, 0};
    long long now = now_ms(), wait = -1;
    for (int i = 0; i < npending; i++) {
      p[2 + i] = (struct pollfd){pending[i].fd, POLLIN, 0};
      long long left = pending[i].deadline_ms > now ? pending[i].deadline_ms - now : 0;
      if (wait < 0 || left < wait) wait = left;
    }
    if (poll(p, (nfds_t)(2 + npending), (int)wait) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (p[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
          /* Sandboxes stay up (a restarted supervisor re-attaches); our
           * daemons (the CRIU service) go. */
          for (int i = 0; i < MAX_DAEMONS; i++)
            if (daemons[i] > 0) kill(daemons[i], SIGTERM);
          unlink(o->socket_path);
          return 0;
        }
      }
      pid_t dead;
      while ((dead = waitpid(-1, NULL, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_DAEMONS; i++)
          if (daemons[i] == dead) daemons[i] = 0;
      }
    }
    /* Walk down, so that moving the last entry into a finished slot skips nothing. */
    now = now_ms();
    for (int i = npending - 1; i >= 0; i--) {
      int r = (p[2 + i].revents & (POLLIN | POLLHUP | POLLERR)) ? read_pending(&pending[i]) : 0;
      if (r == 0 && now < pending[i].deadline_ms) continue;
      finish_pending(&pending[i], r > 0);
      pending[i] = pending[--npending];
    }
    if (p[0].revents & POLLIN) {
      int conn = accept4(sk, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) continue;
      char *buf = malloc(REQUEST_MAX);
      if (!buf) {
        close(conn);
        continue;
      }
      struct pending *q = &pending[npending++];
      *q = (struct pending){conn, 0, now_ms() + REQUEST_DEADLINE_MS, buf};
      /* The request is usually there already: serve it in this turn. */
      int r = read_pending(q);
      if (r != 0) {
        finish_pending(q, r > 0);
        npending--;
      }
    }
  }
}

/* The request of a verb may come over a pipe instead of argv: argv (so
 * /proc/<pid>/cmdline) is readable by every host user, and an enter request
 * carries the command's environment values. The tokens are the options argv
 * would hold, each ending with a NUL; the writer closes its end when done.
 * Returns a new argv: {argv0, verb, tokens..., NULL}. */
#define MAX_REQUEST (8u << 20)
static char **read_request(int fd, char *argv0, char *verb, int *argc_out) {
  size_t cap = 16384, len = 0;
  char *buf = malloc(cap);
  if (!buf) exit(2);
  for (;;) {
    if (len == cap) {
      if (cap >= MAX_REQUEST) {
        fprintf(stderr, "lockstep-helper: request on fd %d is larger than %u bytes\n", fd, MAX_REQUEST);
        exit(2);
      }
      cap *= 2;
      char *grown = realloc(buf, cap);
      if (!grown) exit(2);
      buf = grown;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "lockstep-helper: reading the request on fd %d: %s\n", fd, strerror(errno));
      exit(2);
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  if (len > 0 && buf[len - 1] != '\0') {
    fprintf(stderr, "lockstep-helper: the request does not end with a NUL\n");
    exit(2);
  }
  int ntokens = 0;
  for (size_t i = 0; i < len; i++)
    if (buf[i] == '\0') ntokens++;
  char **av = calloc((size_t)ntokens + 3, sizeof(char *));
  if (!av) exit(2);
  av[0] = argv0;
  av[1] = verb;
  for (size_t i = 0, t = 2; i < len; i += strlen(buf + i) + 1) av[t++] = buf + i;
  *argc_out = ntokens + 2;
  return av;
}

int main(int argc, char **argv) {
  if (argc < 2) usage();
  if (argc == 4 && strcmp(argv[2], "--request-fd") == 0) {
    char *end = NULL;
    long fd = strtol(argv[3], &end, 10);
    if (!end || *end || fd < 0 || fd > INT_MAX) usage();
    argv = read_request((int)fd, argv[0], argv[1], &argc);
  }
  struct opts o;
  parse(argc, argv, &o);
  if (strcmp(argv[1], "supervise") == 0) return cmd_supervise(&o);
  if (strcmp(argv[1], "create") == 0) return cmd_create(&o);
  if (strcmp(argv[1], "enter") == 0) return cmd_enter(&o);
  if (strcmp(argv[1], "prepare") == 0) return cmd_prepare(&o);
  usage();
  return 2;
}
