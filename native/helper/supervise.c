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
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helper.h"

/*
 * The supervise verb: the per-state-directory daemon and child subreaper
 * that runs the helper's create/prepare verbs and the CRIU service for the
 * manager, over a unix socket served from one poll loop.
 */

#define MAX_DAEMONS 16
static pid_t daemons[MAX_DAEMONS];

/* What the supervisor will run, fixed when it starts: its own executable
 * (for the helper's verbs), the CRIU binary, the written-page keeper of
 * Lockstep's CRIU build (native/criu/wp-keeper.c; empty: none), and its run
 * folder (where the daemons' sockets and logs live). */
static char self_exe[PATH_MAX];
static char criu_exe[PATH_MAX];
static char keeper_exe[PATH_MAX];
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
  if (daemon_mode && keeper_exe[0] && argc == 2 && strcmp(argv[0], keeper_exe) == 0) {
    if (!in_run_dir(argv[1])) return "the written-page keeper's socket must be in the supervisor's run folder";
    return NULL;
  }
  if (daemon_mode) {
    if (argc != 4 || strcmp(argv[0], criu_exe) != 0 || strcmp(argv[1], "service") != 0 ||
        strcmp(argv[2], "--address") != 0)
      return "only the CRIU service (criu service --address SOCKET) and the written-page keeper (wp-keeper SOCKET) run "
             "as "
             "daemons";
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

int cmd_supervise(const struct opts *o) {
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
  const char *keeper = getenv("LOCKSTEP_WP_KEEPER");
  snprintf(keeper_exe, sizeof(keeper_exe), "%s", keeper ? keeper : "");
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
