/* wp-keeper: holds the write-protect userfaultfds of the processes that the
 * patched CRIU dumps with --wp-keeper SOCKET (criu-4.2.1-wp-track.patch), so
 * that their written-page tracking goes on between dumps. A userfaultfd keeps
 * tracking only while some process has it open; it is made inside the dumped
 * process by CRIU's parasite and handed here.
 *
 *   wp-keeper SOCKET
 *
 * Listens on the unix SOCK_SEQPACKET socket SOCKET (mode 0600); one request
 * and one reply per connection:
 *   "TAKE <pid> <start_time>"       -> "OK <tag>" and a copy of the fd, the tag
 *                                      cleared here; or "NONE"
 *   "PUT <pid> <start_time> <tag>"  with the fd -> "OK" (replaces the entry)
 *   "COUNT"                         -> "OK <number of entries>"
 * The tag names the images dir of the dump that last re-armed the fd
 * ("<realpath>|<dump_uptime>"); empty means no usable base. Entries whose
 * process is gone (pid absent or a different start time) are dropped at most
 * once a second, or when the table has doubled since: a dump asks twice per
 * process, and reading /proc for every entry on every request made one
 * sandbox's many processes cost every other sandbox's checkpoints (the keeper
 * serves one request at a time). Lookups match pid and start time, so an
 * entry not dropped yet is never handed to another process. The limit on
 * open files is raised to its hard maximum at start (one fd per process
 * tracked). Exits on SIGTERM or SIGINT, removing SOCKET. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#define TAG_MAX (PATH_MAX + 32)
#define MSG_MAX (TAG_MAX + 64)

struct entry {
  pid_t pid;
  unsigned long long start_time;
  int fd;
  char tag[TAG_MAX];
};

static struct entry *entries;
static size_t nr_entries;
static const char *sock_path;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* Field 22 of /proc/PID/stat, or 0 if the process is gone. */
static unsigned long long start_time_of(pid_t pid) {
  char path[64], buf[1024];
  unsigned long long st = 0;
  FILE *f;
  char *p;
  int i;

  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  f = fopen(path, "r");
  if (!f) return 0;
  if (!fgets(buf, sizeof(buf), f)) buf[0] = '\0';
  fclose(f);
  p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (!p) return 0;
  /* after ")": field 3 (state) ... field 22 (starttime) */
  for (i = 3; i <= 22 && p; i++) p = strchr(p + 1, ' ');
  if (p) st = strtoull(p + 1, NULL, 10);
  return st;
}

static void drop(size_t i) {
  close(entries[i].fd);
  entries[i] = entries[--nr_entries];
}

static void prune(void) {
  size_t i = 0;

  while (i < nr_entries) {
    if (start_time_of(entries[i].pid) != entries[i].start_time)
      drop(i);
    else
      i++;
  }
}

/* prune() when a second has passed since the last one, or the table has doubled. */
static void prune_now_and_then(void) {
  static struct timespec last;
  static size_t after_last;
  struct timespec now;

  clock_gettime(CLOCK_MONOTONIC, &now);
  if (now.tv_sec - last.tv_sec < 1 && nr_entries < 2 * after_last + 64) return;
  prune();
  last = now;
  after_last = nr_entries;
}

static struct entry *find(pid_t pid, unsigned long long start_time) {
  size_t i;

  for (i = 0; i < nr_entries; i++)
    if (entries[i].pid == pid && entries[i].start_time == start_time) return &entries[i];
  return NULL;
}

static int send_reply(int sk, const char *text, int fd) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = (void *)text, .iov_len = strlen(text)};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

  if (fd >= 0) {
    struct cmsghdr *ch;

    memset(cbuf, 0, sizeof(cbuf));
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    ch = CMSG_FIRSTHDR(&msg);
    ch->cmsg_level = SOL_SOCKET;
    ch->cmsg_type = SCM_RIGHTS;
    ch->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(ch), &fd, sizeof(int));
  }
  return sendmsg(sk, &msg, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

static void serve(int sk) {
  char buf[MSG_MAX + 1], cbuf[CMSG_SPACE(sizeof(int))], reply[MSG_MAX];
  struct iovec iov = {.iov_base = buf, .iov_len = MSG_MAX};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *ch;
  unsigned long long start_time;
  int fd = -1, pid, off = 0;
  struct entry *e;
  ssize_t n;

  n = recvmsg(sk, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return;
  buf[n] = '\0';
  for (ch = CMSG_FIRSTHDR(&msg); ch; ch = CMSG_NXTHDR(&msg, ch)) {
    if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
      int got;

      memcpy(&got, CMSG_DATA(ch), sizeof(int));
      if (fd < 0)
        fd = got;
      else
        close(got);
    }
  }

  prune_now_and_then();
  if (sscanf(buf, "TAKE %d %llu", &pid, &start_time) == 2) {
    e = find(pid, start_time);
    if (!e) {
      send_reply(sk, "NONE", -1);
    } else {
      snprintf(reply, sizeof(reply), "OK %s", e->tag);
      e->tag[0] = '\0'; /* the taker re-arms the pages: the old base is gone */
      send_reply(sk, reply, e->fd);
    }
  } else if (sscanf(buf, "PUT %d %llu %n", &pid, &start_time, &off) == 2 && off > 0) {
    if (fd < 0) {
      send_reply(sk, "ERR PUT without an fd", -1);
    } else if (start_time_of(pid) != start_time) {
      send_reply(sk, "ERR no such process", -1);
    } else {
      e = find(pid, start_time);
      if (!e) {
        struct entry *grown = realloc(entries, (nr_entries + 1) * sizeof(*entries));

        if (!grown) {
          send_reply(sk, "ERR out of memory", -1);
          goto out;
        }
        entries = grown;
        e = &entries[nr_entries++];
        e->pid = pid;
        e->start_time = start_time;
      } else {
        close(e->fd);
      }
      e->fd = fd;
      fd = -1;
      snprintf(e->tag, sizeof(e->tag), "%s", buf + off);
      send_reply(sk, "OK", -1);
    }
  } else if (!strcmp(buf, "COUNT")) {
    snprintf(reply, sizeof(reply), "OK %zu", nr_entries);
    send_reply(sk, reply, -1);
  } else {
    send_reply(sk, "ERR unknown request", -1);
  }
out:
  if (fd >= 0) close(fd);
}

int main(int argc, char **argv) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  struct sigaction sa = {.sa_handler = on_signal};
  int lsk;

  if (argc != 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  sock_path = argv[1];
  if (strlen(sock_path) >= sizeof(addr.sun_path)) {
    fprintf(stderr, "wp-keeper: socket path too long: %s\n", sock_path);
    return 2;
  }
  strcpy(addr.sun_path, sock_path);
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  lsk = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (lsk < 0) {
    perror("wp-keeper: socket");
    return 1;
  }
  unlink(sock_path);
  umask(077);
  if (bind(lsk, (struct sockaddr *)&addr, sizeof(addr)) || listen(lsk, 16)) {
    fprintf(stderr, "wp-keeper: cannot listen on %s: %s\n", sock_path, strerror(errno));
    return 1;
  }

  while (!stop) {
    int sk = accept4(lsk, NULL, NULL, SOCK_CLOEXEC);

    if (sk < 0) {
      if (errno == EINTR) continue;
      perror("wp-keeper: accept");
      break;
    }
    /* one request per connection: a client that sends nothing must not stall the others */
    struct timeval tv = {.tv_sec = 5};
    setsockopt(sk, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(sk, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    serve(sk);
    close(sk);
  }
  unlink(sock_path);
  return 0;
}
