/*
 * User namespaces for sandboxes. Root inside a sandbox is an unprivileged
 * host uid: the manager gives each sandbox a range of host ids (65536 by
 * default) and the init is started in a user namespace that maps 0..count-1
 * onto it. Every other namespace of the sandbox is created after, so it is
 * owned by that user namespace: root inside holds capabilities over its own
 * mounts, network and hostname and over nothing of the host's.
 *
 * A process cannot write its own full id map, so the order is: an
 * intermediate child unshares the user namespace, the helper (host root)
 * writes the maps, the child becomes root in it, unshares the rest and forks
 * the init (pid 1 of the new pid namespace), then exits; the init is adopted
 * by the supervisor, as without a user namespace.
 */
#define _GNU_SOURCE
#include "userns.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int write_map(pid_t pid, const char *file, unsigned long base, unsigned long count, int report_fd) {
  char path[64], line[96];
  snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
  int n = snprintf(line, sizeof(line), "0 %lu %lu\n", base, count);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, line, (size_t)n) != n) {
    report_error_fd(report_fd, errno, "write", path);
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return 0;
}

/* The ids of the process become root of its (new) user namespace. */
static int become_root(int report_fd) {
  if (setresgid(0, 0, 0) != 0) {
    report_error_fd(report_fd, errno, "setresgid", NULL);
    return -1;
  }
  if (setgroups(0, NULL) != 0) {
    report_error_fd(report_fd, errno, "setgroups", NULL);
    return -1;
  }
  if (setresuid(0, 0, 0) != 0) {
    report_error_fd(report_fd, errno, "setresuid", NULL);
    return -1;
  }
  return 0;
}

static int send_byte(int fd, char c) { return write(fd, &c, 1) == 1 ? 0 : -1; }
static int recv_byte(int fd) {
  char c;
  return read(fd, &c, 1) == 1 ? c : -1;
}

pid_t userns_fork(unsigned long base, unsigned long count, int ns_flags, int report_fd, int errfd) {
  int sk[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sk) != 0) {
    report_error_fd(report_fd, errno, "socketpair", NULL);
    return -1;
  }
  pid_t mid = fork();
  if (mid < 0) {
    report_error_fd(report_fd, errno, "fork", NULL);
    return -1;
  }
  if (mid == 0) {
    close(sk[0]);
    if (unshare(CLONE_NEWUSER) != 0) {
      report_error_fd(errfd, errno, "unshare(CLONE_NEWUSER)", NULL);
      _exit(1);
    }
    if (send_byte(sk[1], 'u') != 0 || recv_byte(sk[1]) != 'm') _exit(1); /* the helper reported why */
    if (become_root(errfd) != 0) _exit(1);
    if (unshare(ns_flags) != 0) {
      report_error_fd(errfd, errno, "unshare", NULL);
      _exit(1);
    }
    pid_t init = fork();
    if (init < 0) {
      report_error_fd(errfd, errno, "fork", NULL);
      _exit(1);
    }
    if (init == 0) {
      close(sk[1]);
      return 0;
    }
    ssize_t w = write(sk[1], &init, sizeof(init));
    _exit(w == (ssize_t)sizeof(init) ? 0 : 1);
  }
  close(sk[1]);
  pid_t init = -1;
  if (recv_byte(sk[0]) == 'u') {
    /* As host root we may write any map (and gid_map without denying
     * setgroups, which the sandbox's root then keeps). */
    if (write_map(mid, "uid_map", base, count, report_fd) == 0 &&
        write_map(mid, "gid_map", base, count, report_fd) == 0 && send_byte(sk[0], 'm') == 0 &&
        read(sk[0], &init, sizeof(init)) != (ssize_t)sizeof(init))
      init = -1;
  }
  close(sk[0]);
  /* mid exits on its own; not waiting for it saves a scheduling round on a
   * busy host (the supervisor, our subreaper, reaps it once we exit). */
  return init;
}

int userns_open_at(int procfd, int report_fd) {
  const char *path = "ns/user";
  struct stat theirs, ours;
  int fd = openat(procfd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &theirs) != 0 || stat("/proc/self/ns/user", &ours) != 0) {
    report_error_fd(report_fd, errno, "open", path);
    if (fd >= 0) close(fd);
    return -2;
  }
  if (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev) {
    close(fd);
    return -1;
  }
  return fd;
}

int userns_join(int fd, int report_fd) {
  if (fd == -1) return 0;
  if (setns(fd, CLONE_NEWUSER) != 0) {
    report_error_fd(report_fd, errno, "setns", "user");
    close(fd);
    return -1;
  }
  close(fd);
  return become_root(report_fd);
}
