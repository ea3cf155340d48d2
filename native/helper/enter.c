#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"
#include "confine.h"
#include "userns.h"

/*
 * The enter verb: one command inside a running sandbox, joined by the init's
 * identity (pid and start time, pinned), in the foreground with its output
 * relayed, or detached as a child of the sandbox's init.
 */

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
/* Tells a waiting parent (a detached start's gate: see below) that the
 * exec failed; -1: nobody waits. */
static void exec_failed(int gate) {
  if (gate < 0) return;
  ssize_t n;
  do n = write(gate, "!", 1);
  while (n < 0 && errno == EINTR);
}

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

/* The helper sits in the sandbox's memory cgroup with the command it
 * relays, and a sandbox that runs out of memory must not have the kernel
 * pick the helper: the command's output and exit status would be lost (the
 * limits test saw a killed helper turn exit 137 into 128). Without
 * CAP_SYS_RESOURCE a process may not lower its own oom_score_adj below what
 * it was given, but it may raise it and lower it back. So the helper raises
 * its own to SANDBOX_OOM_SCORE_ADJ just before the fork, which the child
 * (and every process the command starts) inherits, and puts its own back
 * right after. Returns the helper's own value, or INT_MIN when the file
 * could not be used (the command then runs with the helper's value). */
#define SANDBOX_OOM_SCORE_ADJ 500
static int oom_score_for_child(int fd) {
  if (fd < 0) return INT_MIN;
  char buf[16] = {0};
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return INT_MIN;
  int own = atoi(buf);
  if (own >= SANDBOX_OOM_SCORE_ADJ) return own;
  char want[16];
  int len = snprintf(want, sizeof(want), "%d\n", SANDBOX_OOM_SCORE_ADJ);
  if (pwrite(fd, want, (size_t)len, 0) != len) return INT_MIN;
  return own;
}

static void oom_score_restore(int fd, int own) {
  if (fd < 0 || own == INT_MIN) return;
  char buf[16];
  int len = snprintf(buf, sizeof(buf), "%d\n", own);
  (void)!pwrite(fd, buf, (size_t)len, 0);
}

int cmd_enter(const struct opts *o) {
  int status_fd = o->status_fd >= 0 ? o->status_fd : 2;
  if (o->pid <= 0 || o->start == 0 || !o->argv || !o->argv[0]) usage();
  if (o->status_fd >= 0) fcntl(o->status_fd, F_SETFD, FD_CLOEXEC);

  struct pinned_init init;
  if (pin_init(o->pid, o->start, status_fd, &init) != 0) return 125;
  /* Opened while this is still host root with the host's /proc: written
   * around the fork below (see oom_score_for_child). */
  int oomfd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
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
  int own_oom_score = oom_score_for_child(oomfd);
  pid_t child = fork(); /* the child is the first process we put in the sandbox's pid namespace */
  if (child != 0) oom_score_restore(oomfd, own_oom_score);
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
    int exec_gate = -1;
    if (o->detach) {
      /* Double fork: the grandchild is adopted by the sandbox's init, so it
       * is part of the process tree that checkpoints capture. What can fail
       * before it exists is done here (the working folder, the output
       * files), and this child waits for its exec through a close-on-exec
       * pipe: end of file means it runs, a byte means it failed (its reason
       * is on the status fd) and is reaped here. So a refused start leaves
       * no process in the sandbox once the helper has exited: the grandchild
       * is never adopted by the init to die there later. */
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
      int gate[2];
      if (pipe2(gate, O_CLOEXEC) != 0) {
        report_error_fd(status_fd, errno, "pipe2", NULL);
        _exit(125);
      }
      pid_t grandchild = fork();
      if (grandchild < 0) {
        report_error_fd(status_fd, errno, "fork", NULL);
        _exit(125);
      }
      if (grandchild > 0) {
        close(gate[1]);
        char failed;
        ssize_t n;
        do n = read(gate[0], &failed, 1);
        while (n < 0 && errno == EINTR);
        if (n <= 0) _exit(0);
        while (waitpid(grandchild, NULL, 0) < 0 && errno == EINTR) {
        }
        _exit(125);
      }
      close(gate[0]);
      setsid();
      dup2(in, 0);
      dup2(out, 1);
      dup2(err, 2);
      /* Nothing from the host may stay open, except the status fd and the
       * gate, both close-on-exec. */
      close_fds_except_two(status_fd, gate[1]);
      exec_gate = gate[1];
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
      exec_failed(exec_gate);
      _exit(125);
    }
    exec_in_path(o->argv, envp);
    int exec_errno = errno;
    report_error_fd(status_fd, exec_errno, "execve", o->argv[0]);
    exec_failed(exec_gate);
    _exit(exec_errno == ENOENT ? 127 : 126);
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
