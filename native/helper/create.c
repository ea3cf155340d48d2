#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"
#include "confine.h"
#include "userns.h"
#include "dev-folder.h"

/*
 * The create and prepare verbs: a sandbox's /dev folder, then (create) its
 * namespaces, root, /proc, /dev and loopback, pivot_root, confinement and
 * the exec of its init.
 */

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

/* A sandbox's /dev folder (dev-folder.h), errors reported on errfd. */
static int prepare_dev(const char *dir, int errfd) {
  struct lockstep_dev_failure why;
  if (lockstep_prepare_dev(dir, &why) == 0) return 0;
  report_error_fd(errfd, why.err, why.syscall, why.path);
  return -1;
}

/* What a restored (forked) sandbox needs before CRIU runs: its /dev folder. */
int cmd_prepare(const struct opts *o) {
  if (!o->dev) usage();
  if (prepare_dev(o->dev, 1) != 0) return 1;
  writef(1, "{\"prepared\":true}\n");
  return 0;
}

int cmd_create(const struct opts *o) {
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
