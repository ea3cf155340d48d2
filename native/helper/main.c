/*
 * lockstep-helper: the small executable that does what a multithreaded Node
 * process must not do itself (unshare, setns, pivot_root, fork-and-exec into
 * namespaces). It has four verbs:
 *
 *   supervise  per-state-directory daemon and child subreaper: the parent of
 *              every sandbox init and of the CRIU service, so that sandboxes
 *              outlive the manager process and nothing is left a zombie.
 *              (supervise.c)
 *   create     make a sandbox: new pid/mount/uts/ipc/net/cgroup namespaces,
 *              owned by a new user namespace when given an id range, the
 *              overlay root with its own /proc (sensitive files masked) and
 *              read-only /dev (own /dev/shm and /dev/pts), pivot_root, then
 *              confinement (confine.c: capabilities, no_new_privs, session
 *              keyring, rlimits, seccomp) and exec of the sandbox's init.
 *              (create.c)
 *   prepare    make the /dev folder a restored (forked) sandbox needs before
 *              CRIU runs. (create.c)
 *   enter      run one command inside a running sandbox (setns), in the
 *              foreground or detached as a child of the sandbox's init,
 *              confined exactly as the init is. (enter.c)
 *
 * This file parses the options (from argv or a request pipe) and runs the
 * verb; helper.h holds what the verbs share, util.c the small utilities.
 * Results and errors go out as one JSON object per line, errors shaped like
 * Node's SystemError ({code, errno, syscall, path}).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helper.h"

void usage(void) {
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
