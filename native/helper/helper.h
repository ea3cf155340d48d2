/*
 * What the helper's files share. main.c parses a request into struct opts
 * and runs one verb: create.c (create, prepare), enter.c, supervise.c; the
 * small utilities they all use are in util.c.
 */
#ifndef LOCKSTEP_HELPER_H
#define LOCKSTEP_HELPER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define MAX_LIST 64

/* The options of every verb (main.c's parse() fills them). */
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

/* ---- main.c -------------------------------------------------------------- */

/* Prints the usage and exits with status 2. */
void usage(void);

/* ---- the verbs: each returns the helper's exit status --------------------- */

int cmd_create(const struct opts *o);
int cmd_prepare(const struct opts *o);
int cmd_enter(const struct opts *o);
int cmd_supervise(const struct opts *o);

/* ---- util.c -------------------------------------------------------------- */

/* Writes s to f as a JSON string literal. */
void json_string(FILE *f, const char *s);
/* Writes {"error":{...}} (Node's SystemError shape) to fd, without stdio buffers. */
void report_error_fd(int fd, int err, const char *syscall_name, const char *path);
/* Writes all of buf to fd (errors ignored: the reader is gone). */
void write_all(int fd, const char *buf, size_t len);
/* printf to fd, at most 1 KiB. */
void writef(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes our pid to each cgroup.procs file: -1, or the index of the one that failed. */
int join_cgroups(char **procs, int n);
/* Bounding set only; the full confinement (confine.c) comes just before exec. */
int drop_capabilities(void);
/* Closes every fd from lowfd up. */
int close_fds_from(int lowfd);
/* Closes every fd from 3 up, except keep (-1: none). */
void close_fds_except(int keep);
void close_fds_except_two(int a, int b);
/* Marks every fd from lowfd up close-on-exec. */
void cloexec_fds_from(int lowfd);
/* execve with a PATH search that uses envp's PATH; returns with errno set on failure. */
void exec_in_path(char **argv, char **envp);

#endif
