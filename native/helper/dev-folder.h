/*
 * The contents of a sandbox's /dev folder, in one place for the two programs
 * that make it: the helper's create/prepare verbs (a new sandbox) and the
 * addon's makeDevFolder (a restored one: a fork or a warm standby, where
 * spawning the helper through the supervisor cost more than the restore's
 * own set-up). Plain C, header-only, so the C helper and the C++ addon share
 * it without a library of their own.
 */
#pragma once

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

struct lockstep_devnode {
  const char *name;
  unsigned maj, min;
};

/* What failed, for the caller's error report. */
struct lockstep_dev_failure {
  int err;
  const char *syscall;
  char path[PATH_MAX];
};

/* Device nodes, links and mount points of a sandbox's /dev in `dir`;
 * existing ones are left alone, so preparing the same folder again
 * (rollback) is a no-op. Returns 0, or -1 with *why filled in. */
static inline int lockstep_prepare_dev(const char *dir, struct lockstep_dev_failure *why) {
  static const struct lockstep_devnode nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                                                  {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  static const char *const links[][2] = {{"/proc/self/fd", "fd"},
                                         {"/proc/self/fd/0", "stdin"},
                                         {"/proc/self/fd/1", "stdout"},
                                         {"/proc/self/fd/2", "stderr"},
                                         {"pts/ptmx", "ptmx"}};
  /* Mount points of the sandbox's /dev/shm and /dev/pts: /dev itself is
   * read-only inside, so they must exist before. */
  static const char *const mountpoints[] = {"shm", "pts"};
#define LOCKSTEP_DEV_FAIL(call) \
  do {                          \
    why->err = errno;           \
    why->syscall = (call);      \
    return -1;                  \
  } while (0)
  for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
    snprintf(why->path, sizeof(why->path), "%s/%s", dir, nodes[i].name);
    if (mknod(why->path, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) != 0 && errno != EEXIST)
      LOCKSTEP_DEV_FAIL("mknod");
    if (chmod(why->path, 0666) != 0) LOCKSTEP_DEV_FAIL("chmod");
  }
  for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
    snprintf(why->path, sizeof(why->path), "%s/%s", dir, links[i][1]);
    if (symlink(links[i][0], why->path) != 0 && errno != EEXIST) LOCKSTEP_DEV_FAIL("symlink");
  }
  for (size_t i = 0; i < sizeof(mountpoints) / sizeof(mountpoints[0]); i++) {
    struct stat st;
    snprintf(why->path, sizeof(why->path), "%s/%s", dir, mountpoints[i]);
    if (mkdir(why->path, 0755) != 0 && errno != EEXIST) LOCKSTEP_DEV_FAIL("mkdir");
    if (lstat(why->path, &st) != 0) LOCKSTEP_DEV_FAIL("lstat");
    if (!S_ISDIR(st.st_mode)) {
      errno = ENOTDIR;
      LOCKSTEP_DEV_FAIL("lstat");
    }
  }
#undef LOCKSTEP_DEV_FAIL
  return 0;
}
