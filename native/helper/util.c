/* The small utilities every verb of the helper uses (declared in helper.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "helper.h"
#include "confine.h"

void json_string(FILE *f, const char *s) {
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

void write_all(int fd, const char *buf, size_t len) {
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

void writef(int fd, const char *fmt, ...) {
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

int join_cgroups(char **procs, int n) {
  char pid[32];
  snprintf(pid, sizeof(pid), "%d\n", getpid());
  for (int i = 0; i < n; i++) {
    if (write_file(procs[i], pid) != 0) return i;
  }
  return -1;
}

/* Bounding set only; the full confinement (confine.c) comes just before exec. */
int drop_capabilities(void) { return confine_drop_bounding_set(); }

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

int close_fds_from(int lowfd) {
  if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0) return 0;
  for (int fd = lowfd; fd < 65536; fd++) close(fd);
  return 0;
}

static void close_span(int lo, int hi) {
  if (syscall(SYS_close_range, lo, hi, 0) != 0)
    for (int fd = lo; fd <= hi; fd++) close(fd);
}

/* Closes every fd from 3 up, except `a` and `b` (-1: none; they may be the
 * same). No host fd may reach a sandbox: it would be a way out, and CRIU
 * could not dump it. */
void close_fds_except_two(int a, int b) {
  int keep[2] = {a < b ? a : b, a < b ? b : a};
  int from = 3;
  for (int i = 0; i < 2; i++) {
    if (keep[i] < from) continue;
    if (keep[i] > from) close_span(from, keep[i] - 1);
    from = keep[i] + 1;
  }
  close_fds_from(from);
}

void close_fds_except(int keep) { close_fds_except_two(keep, keep); }

/* Marks every fd from 3 up close-on-exec (the foreground command must not
 * inherit the manager's descriptors, but we still report errors until exec). */
void cloexec_fds_from(int lowfd) {
  if (syscall(SYS_close_range, lowfd, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = lowfd; fd < 65536; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* execve with a PATH search that uses the sandbox's PATH, not ours. */
void exec_in_path(char **argv, char **envp) {
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
