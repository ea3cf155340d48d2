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
 *              overlay root with its own /proc and /dev, pivot_root, dropped
 *              capabilities, then exec the sandbox's init.
 *   enter      run one command inside a running sandbox (setns), in the
 *              foreground or detached as a child of the sandbox's init.
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
#include <unistd.h>

#include <linux/capability.h>

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

/* Capabilities a sandbox keeps: Docker's default set without CAP_MKNOD. All
 * others (SYS_ADMIN, SYS_PTRACE, SYS_MODULE, DAC_READ_SEARCH, NET_ADMIN, ...)
 * are dropped from the bounding set, so nothing exec'd inside can regain them. */
static const int kept_caps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE,     CAP_FOWNER,  CAP_FSETID,      CAP_KILL,
                                CAP_SETGID, CAP_SETUID,           CAP_SETPCAP, CAP_NET_BIND_SERVICE,
                                CAP_NET_RAW, CAP_SYS_CHROOT,      CAP_AUDIT_WRITE, CAP_SETFCAP};

static int drop_capabilities(void) {
  int last = CAP_LAST_CAP;
  FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
  if (f) {
    if (fscanf(f, "%d", &last) != 1) last = CAP_LAST_CAP;
    fclose(f);
  }
  for (int cap = 0; cap <= last; cap++) {
    bool keep = false;
    for (size_t i = 0; i < sizeof(kept_caps) / sizeof(kept_caps[0]); i++)
      if (kept_caps[i] == cap) keep = true;
    if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return -1;
  }
  return 0;
}

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
  const char *root, *hostname, *init, *cwd, *stdout_path, *stderr_path, *socket_path, *pidfile, *dev;
  char *cgroups[MAX_LIST];
  int ncgroups;
  char *envs[MAX_LIST * 4 + 1];
  int nenvs;
  int pid;
  int status_fd;
  unsigned long id_base, id_count; /* user namespace: host ids base..base+count-1 (count 0: none) */
  bool detach;
  char **argv;
};

static void usage(void) {
  fprintf(stderr,
          "usage: lockstep-helper supervise --socket PATH --pidfile PATH\n"
          "       lockstep-helper create --root DIR --dev DIR --hostname NAME [--init PATH] "
          "[--cgroup PROCS]... [--env K=V]... [--id-base N --id-count N]\n"
          "       lockstep-helper prepare --dev DIR\n"
          "       lockstep-helper enter --pid PID [--cgroup PROCS]... [--cwd DIR] [--env K=V]... "
          "[--status-fd N] [--detach --stdout PATH --stderr PATH] -- CMD [ARG...]\n");
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
    } else if (strcmp(a, "--root") == 0) o->root = NEXT();
    else if (strcmp(a, "--hostname") == 0) o->hostname = NEXT();
    else if (strcmp(a, "--dev") == 0) o->dev = NEXT();
    else if (strcmp(a, "--init") == 0) o->init = NEXT();
    else if (strcmp(a, "--cwd") == 0) o->cwd = NEXT();
    else if (strcmp(a, "--stdout") == 0) o->stdout_path = NEXT();
    else if (strcmp(a, "--stderr") == 0) o->stderr_path = NEXT();
    else if (strcmp(a, "--socket") == 0) o->socket_path = NEXT();
    else if (strcmp(a, "--pidfile") == 0) o->pidfile = NEXT();
    else if (strcmp(a, "--pid") == 0) o->pid = atoi(NEXT());
    else if (strcmp(a, "--status-fd") == 0) o->status_fd = atoi(NEXT());
    else if (strcmp(a, "--detach") == 0) o->detach = true;
    else if (strcmp(a, "--id-base") == 0) o->id_base = strtoul(NEXT(), NULL, 10);
    else if (strcmp(a, "--id-count") == 0) o->id_count = strtoul(NEXT(), NULL, 10);
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
static const struct devnode devnodes[] = {{"null", 1, 3},    {"zero", 1, 5}, {"full", 1, 7},
                                          {"random", 1, 8},  {"urandom", 1, 9}, {"tty", 5, 0}};

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

/* Runs as pid 1 of the new pid namespace, in the new mount namespace. Any
 * failure is reported on errfd and ends the child.
 * The caller has made the sandbox root its working directory and cloned the
 * mount of its /dev folder as devfd (open_tree): with a user namespace, root
 * here may not search the host folders on the way to either. Nor may it
 * pivot_root into a mount it inherited (those are locked to their parent),
 * so the root is cloned here and the clone attached over it first. */
static void setup_sandbox_and_exec(const struct opts *o, int errfd, int devfd) {
  char path[PATH_MAX];
#define FAIL(sc, p)                             \
  do {                                          \
    report_error_fd(errfd, errno, (sc), (p));   \
    _exit(1);                                   \
  } while (0)

  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) FAIL("mount(MS_PRIVATE)", "/");
  int rootfd = (int)syscall(SYS_open_tree, AT_FDCWD, ".", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (rootfd < 0) FAIL("open_tree(root)", o->root);
  if (syscall(SYS_move_mount, rootfd, "", AT_FDCWD, ".", MOVE_MOUNT_F_EMPTY_PATH) != 0) FAIL("move_mount(root)", o->root);
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
   * checkpoint does not tar up a tmpfs every time. */
  if (syscall(SYS_move_mount, devfd, "", AT_FDCWD, "dev", MOVE_MOUNT_F_EMPTY_PATH) != 0) FAIL("move_mount(/dev)", o->dev);

  if (o->hostname && sethostname(o->hostname, strlen(o->hostname)) != 0) FAIL("sethostname", o->hostname);
  if (loopback_up(errfd) != 0) _exit(1);

  /* pivot_root(".", ".") stacks the old root under the new one; detaching it
   * leaves the sandbox with no path back to the host (runc does the same). */
  if (syscall(SYS_pivot_root, ".", ".") != 0) FAIL("pivot_root", o->root);
  if (umount2(".", MNT_DETACH) != 0) FAIL("umount2(old root)", "/");
  if (chdir("/") != 0) FAIL("chdir", "/");

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
  static const char *links[][2] = {{"/proc/self/fd", "fd"},     {"/proc/self/fd/0", "stdin"},
                                   {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
                                   {"/tmp", "shm"}};
  for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", dir, links[i][1]);
    if (symlink(links[i][0], path) != 0 && errno != EEXIST) {
      report_error_fd(errfd, errno, "symlink", path);
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
  if (!o->root || !o->dev) usage();
  if (prepare_dev(o->dev, 1) != 0) return 1;
  int devfd = (int)syscall(SYS_open_tree, AT_FDCWD, o->dev, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr devattr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC};
  if (devfd < 0 || syscall(SYS_mount_setattr, devfd, "", AT_EMPTY_PATH, &devattr, sizeof(devattr)) != 0 || chdir(o->root) != 0) {
    report_error_fd(1, errno, devfd < 0 ? "open_tree" : "mount_setattr/chdir", devfd < 0 ? o->dev : o->root);
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
    setup_sandbox_and_exec(o, pipefd[1], devfd);
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

static int cmd_enter(const struct opts *o) {
  int status_fd = o->status_fd >= 0 ? o->status_fd : 2;
  if (o->pid <= 0 || !o->argv || !o->argv[0]) usage();
  if (o->status_fd >= 0) fcntl(o->status_fd, F_SETFD, FD_CLOEXEC);

  int bad = join_cgroups((char **)o->cgroups, o->ncgroups);
  if (bad >= 0) {
    report_error_fd(status_fd, errno, "write(cgroup.procs)", o->cgroups[bad]);
    return 125;
  }
  static const char *names[] = {"cgroup", "ipc", "uts", "net", "pid", "mnt"};
  int nsfd[6];
  char path[PATH_MAX];
  for (int i = 0; i < 6; i++) {
    snprintf(path, sizeof(path), "/proc/%d/ns/%s", o->pid, names[i]);
    nsfd[i] = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd[i] < 0) {
      report_error_fd(status_fd, errno, "open", path);
      return 125;
    }
  }
  snprintf(path, sizeof(path), "/proc/%d/root", o->pid);
  int rootfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) {
    report_error_fd(status_fd, errno, "open", path);
    return 125;
  }
  int usernsfd = userns_open(o->pid, status_fd);
  if (usernsfd == -2) return 125;
  for (int i = 0; i < 6; i++) {
    if (setns(nsfd[i], 0) != 0) {
      report_error_fd(status_fd, errno, "setns", names[i]);
      return 125;
    }
    close(nsfd[i]);
  }
  /* Last: from here on we hold no host privilege. */
  if (userns_join(usernsfd, status_fd) != 0) return 125;
  if (fchdir(rootfd) != 0 || chroot(".") != 0) {
    report_error_fd(status_fd, errno, "chroot", "/");
    return 125;
  }
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
      cloexec_fds_from(3);
    }
    exec_in_path(o->argv, envp);
    report_error_fd(status_fd, errno, "execve", o->argv[0]);
    _exit(errno == ENOENT ? 127 : 126);
  }
  fg_child = child;
  setpgid(child, child);
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return 125;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 125;
}

/* ---- supervise ---------------------------------------------------------- */

#define MAX_DAEMONS 16
static pid_t daemons[MAX_DAEMONS];

/* Reads one request: NUL-separated tokens ending with an empty token.
 * "run" ARGV...           the child's stdout is this connection
 * "daemon" LOGFILE ARGV... the child logs to LOGFILE; we answer {"pid":N} */
static void handle_request(int conn) {
  static char buf[65536];
  size_t len = 0;
  for (;;) {
    ssize_t n = read(conn, buf + len, sizeof(buf) - 1 - len);
    if (n <= 0) return;
    len += (size_t)n;
    if (len >= 2 && buf[len - 1] == '\0' && buf[len - 2] == '\0') break;
    if (len >= sizeof(buf) - 1) return;
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

  for (;;) {
    struct pollfd p[2] = {{sk, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
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
    if (p[0].revents & POLLIN) {
      int conn = accept4(sk, NULL, NULL, SOCK_CLOEXEC);
      if (conn < 0) continue;
      struct timeval tv = {5, 0};
      setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      handle_request(conn);
      close(conn);
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 2) usage();
  struct opts o;
  parse(argc, argv, &o);
  if (strcmp(argv[1], "supervise") == 0) return cmd_supervise(&o);
  if (strcmp(argv[1], "create") == 0) return cmd_create(&o);
  if (strcmp(argv[1], "enter") == 0) return cmd_enter(&o);
  if (strcmp(argv[1], "prepare") == 0) return cmd_prepare(&o);
  usage();
  return 2;
}
