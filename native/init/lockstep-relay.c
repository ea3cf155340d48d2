/*
 * lockstep-relay: the in-sandbox end of an interactive process.
 *
 * It lives beside the init in the runtime layer (/.lockstep/relay) and is
 * started like any background command (lockstep-helper enter --detach), so it
 * is a child of the sandbox's init, confined as every command is, and part of
 * the process tree a checkpoint dumps. Everything an interactive process
 * needs is held inside that tree:
 *
 *   input   a FIFO in the sandbox that the relay keeps open read-write (it
 *           never sees EOF and CRIU dumps it with its buffered bytes); the
 *           manager appends framed records to it (below) and holds nothing
 *           the dump needs;
 *   pty     the pair comes from the sandbox's own devpts instance
 *           (/dev/ptmx -> pts/ptmx), the relay holds the master, the child
 *           gets the slave as its controlling terminal (setsid + TIOCSCTTY);
 *   output  the relay appends what the master gives to a transcript file in
 *           the sandbox, read by the manager by byte offsets.
 *
 * So a checkpoint captures the relay, the terminal pair, the child, the FIFO
 * and the transcript at one instant, and a rollback or fork carries on from
 * there. Nothing here trusts the FIFO's bytes: anyone in the sandbox may
 * write to it, which only affects the sandbox's own process.
 *
 *   lockstep-relay stdin FIFO -- CMD [ARG...]
 *       CMD's stdin is a pipe fed from FIFO; a close record closes it (EOF).
 *   lockstep-relay pty COLS ROWS -- CMD [ARG...]
 *       CMD runs on a new terminal; FIFO, transcript and exit status are
 *       /run/lockstep/pty/<relay pid>.{in,out,exit}.
 *
 * Records on the FIFO: one type byte, a 4-byte little-endian length, then
 * that many bytes. 'd': input bytes; 'c': close stdin (stdin mode);
 * 'r': window size, 2+2 bytes little-endian cols and rows (pty mode).
 * The relay exits with the child's status (128+N for a signal).
 *
 * Statically linked, like the init: the image may have no libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define PTY_DIR "/run/lockstep/pty"
#define MAX_RECORD 65536
#define HEADER 5

static void die(const char *what) {
  fprintf(stderr, "lockstep-relay: %s: %s\n", what, strerror(errno));
  exit(125);
}

/* Bytes read from the FIFO that do not yet form a whole record. */
struct records {
  unsigned char buf[HEADER + MAX_RECORD];
  size_t len;
};

/* Calls fn for each whole record in r, keeping the incomplete tail. A length
 * past MAX_RECORD is not ours to make sense of: the buffer is dropped. */
static void take_records(struct records *r, void (*fn)(int type, const unsigned char *p, uint32_t n, void *arg),
                         void *arg) {
  size_t at = 0;
  while (r->len - at >= HEADER) {
    const unsigned char *h = r->buf + at;
    uint32_t n = (uint32_t)h[1] | (uint32_t)h[2] << 8 | (uint32_t)h[3] << 16 | (uint32_t)h[4] << 24;
    if (n > MAX_RECORD) {
      r->len = 0;
      return;
    }
    if (r->len - at < HEADER + n) break;
    fn(h[0], h + HEADER, n, arg);
    at += HEADER + n;
  }
  memmove(r->buf, r->buf + at, r->len - at);
  r->len -= at;
}

static int open_fifo(const char *path) {
  if (mkfifo(path, 0600) != 0 && errno != EEXIST) die("mkfifo");
  /* Read-write: the open does not wait for a writer, and the FIFO never
   * reports EOF between the manager's writes. */
  int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) die("open fifo");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    errno = EINVAL;
    die("fifo");
  }
  return fd;
}

static int child_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, NULL);
  int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) die("signalfd");
  signal(SIGPIPE, SIG_IGN);
  return fd;
}

static void child_defaults(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  /* The child goes when the relay goes (kill of a PTY kills the relay). */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
}

static int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 125;
}

/* True once the child has been reaped (its status in *status). */
static int reap(int sfd, pid_t child, int *status) {
  struct signalfd_siginfo si;
  while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
  }
  pid_t r;
  while ((r = waitpid(-1, status, WNOHANG)) > 0)
    if (r == child) return 1;
  return 0;
}

static void write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return; /* EPIPE: the command no longer reads stdin */
    p += w;
    n -= (size_t)w;
  }
}

/* ---- stdin mode ---------------------------------------------------------- */

struct stdin_state {
  int to;           /* write end of the command's stdin; -1 once closed */
  const char *fifo; /* unlinked on close: a writer that comes later finds nothing to open */
};

static void stdin_record(int type, const unsigned char *p, uint32_t n, void *arg) {
  struct stdin_state *s = arg;
  if (type == 'd' && s->to >= 0) {
    write_all(s->to, p, n);
  } else if (type == 'c' && s->to >= 0) {
    close(s->to);
    s->to = -1;
    unlink(s->fifo);
  }
}

static int run_stdin(const char *fifo_path, char **argv) {
  int fifo = open_fifo(fifo_path);
  int sfd = child_signals();
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) die("pipe2");
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    child_defaults();
    if (dup2(in[0], 0) < 0) die("dup2");
    execvp(argv[0], argv);
    fprintf(stderr, "lockstep: %s: %s\n", argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  close(in[0]);
  /* Blocking writes: a command that does not read its stdin stops the relay
   * here, the FIFO fills, and the manager sees it full; nothing else waits. */
  struct stdin_state s = {.to = in[1], .fifo = fifo_path};
  static struct records rec;
  int status = 0;
  for (;;) {
    struct pollfd p[2] = {{.fd = fifo, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) die("poll");
    if (p[1].revents && reap(sfd, child, &status)) break;
    if (p[0].revents & POLLIN) {
      ssize_t n = read(fifo, rec.buf + rec.len, sizeof(rec.buf) - rec.len);
      if (n > 0) {
        rec.len += (size_t)n;
        take_records(&rec, stdin_record, &s);
      }
    }
  }
  unlink(fifo_path);
  return exit_code(status);
}

/* ---- pty mode ------------------------------------------------------------ */

struct pty_state {
  int master;
  unsigned char *pending; /* input not yet taken by the terminal */
  size_t len, cap;
};

static void pty_record(int type, const unsigned char *p, uint32_t n, void *arg) {
  struct pty_state *s = arg;
  if (type == 'd') {
    if (s->len + n > s->cap) {
      size_t cap = s->cap ? s->cap : 4096;
      while (cap < s->len + n) cap *= 2;
      unsigned char *grown = realloc(s->pending, cap);
      if (!grown) return;
      s->pending = grown;
      s->cap = cap;
    }
    memcpy(s->pending + s->len, p, n);
    s->len += n;
  } else if (type == 'r' && n == 4) {
    struct winsize ws = {.ws_col = (unsigned short)(p[0] | p[1] << 8), .ws_row = (unsigned short)(p[2] | p[3] << 8)};
    ioctl(s->master, TIOCSWINSZ, &ws);
  }
}

static int run_pty(unsigned cols, unsigned rows, char **argv) {
  char in_path[64], out_path[64], exit_path[64], tmp_path[80];
  mkdir("/run", 0755);
  mkdir("/run/lockstep", 0755);
  mkdir(PTY_DIR, 0755);
  char err_path[64];
  snprintf(err_path, sizeof(err_path), PTY_DIR "/%d.err", getpid());
  int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (err >= 0) {
    dup2(err, 2);
    close(err);
  }
  snprintf(in_path, sizeof(in_path), PTY_DIR "/%d.in", getpid());
  snprintf(out_path, sizeof(out_path), PTY_DIR "/%d.out", getpid());
  snprintf(exit_path, sizeof(exit_path), PTY_DIR "/%d.exit", getpid());
  unlink(exit_path);
  int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) die("open transcript");
  /* posix_openpt opens /dev/ptmx, the sandbox's own devpts instance. */
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) die("posix_openpt");
  if (grantpt(master) != 0 || unlockpt(master) != 0) die("unlockpt");
  char *slave_name = ptsname(master);
  if (!slave_name) die("ptsname");
  /* The relay keeps a slave open too: the terminal is not hung up before
   * the child has opened it, nor when the child closes it; the child's exit
   * (SIGCHLD) is what ends the relay. */
  int slave = open(slave_name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) die("open slave");
  struct winsize ws = {.ws_col = (unsigned short)cols, .ws_row = (unsigned short)rows};
  if (ioctl(master, TIOCSWINSZ, &ws) != 0) die("TIOCSWINSZ");
  int sfd = child_signals();
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    child_defaults();
    if (setsid() < 0) die("setsid");
    if (ioctl(slave, TIOCSCTTY, 0) != 0) die("TIOCSCTTY");
    if (dup2(slave, 0) < 0 || dup2(slave, 1) < 0 || dup2(slave, 2) < 0) die("dup2");
    execvp(argv[0], argv);
    fprintf(stderr, "lockstep: %s: %s\r\n", argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  /* Created after the fork, so the child never holds it. */
  int fifo = open_fifo(in_path);
  fcntl(master, F_SETFL, O_NONBLOCK);
  struct pty_state s = {.master = master};
  static struct records rec;
  static unsigned char buf[65536];
  int status = 0;
  int reaped = 0;
  int master_open = 1;
  while (!reaped || master_open) {
    struct pollfd p[3] = {
        /* No new input while the terminal has not taken the last: the FIFO
         * then fills and the manager sees it full. */
        {.fd = s.len < MAX_RECORD ? fifo : -1, .events = POLLIN},
        {.fd = master_open ? master : -1, .events = POLLIN | (s.len ? POLLOUT : 0)},
        {.fd = sfd, .events = POLLIN},
    };
    /* After the child exited, drain what the terminal still holds, then stop. */
    int timeout = reaped ? 0 : -1;
    int n = poll(p, 3, timeout);
    if (n < 0 && errno != EINTR) die("poll");
    if (p[2].revents && !reaped) reaped = reap(sfd, child, &status);
    if (p[1].revents & POLLIN) {
      ssize_t r = read(master, buf, sizeof(buf));
      if (r > 0)
        write_all(out, buf, (size_t)r);
      else if (r == 0 || (errno != EAGAIN && errno != EINTR))
        master_open = 0; /* EIO: every slave fd is closed */
    } else if (p[1].revents & (POLLHUP | POLLERR)) {
      master_open = 0;
    } else if (reaped && n == 0) {
      master_open = 0; /* nothing more to read */
    }
    if (master_open && s.len && (p[1].revents & POLLOUT)) {
      ssize_t w = write(master, s.pending, s.len);
      if (w > 0) {
        memmove(s.pending, s.pending + w, s.len - (size_t)w);
        s.len -= (size_t)w;
      }
    }
    if (p[0].revents & POLLIN) {
      ssize_t r = read(fifo, rec.buf + rec.len, sizeof(rec.buf) - rec.len);
      if (r > 0) {
        rec.len += (size_t)r;
        take_records(&rec, pty_record, &s);
      }
    }
  }
  /* The exit status, written whole or not at all (rename). */
  snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", exit_path);
  int ef = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (ef >= 0) {
    dprintf(ef, "%d\n", exit_code(status));
    close(ef);
    rename(tmp_path, exit_path);
  }
  unlink(in_path);
  return exit_code(status);
}

static unsigned dimension(const char *s) {
  char *end = NULL;
  unsigned long v = strtoul(s, &end, 10);
  if (!end || *end || v < 1 || v > 65535) {
    fprintf(stderr, "lockstep-relay: bad terminal size %s\n", s);
    exit(2);
  }
  return (unsigned)v;
}

int main(int argc, char **argv) {
  if (argc >= 5 && strcmp(argv[1], "stdin") == 0 && strcmp(argv[3], "--") == 0) return run_stdin(argv[2], &argv[4]);
  if (argc >= 6 && strcmp(argv[1], "pty") == 0 && strcmp(argv[4], "--") == 0)
    return run_pty(dimension(argv[2]), dimension(argv[3]), &argv[5]);
  fprintf(stderr,
          "usage: lockstep-relay stdin FIFO -- CMD [ARG...]\n"
          "       lockstep-relay pty COLS ROWS -- CMD [ARG...]\n");
  return 2;
}
