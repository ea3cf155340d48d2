/* User namespaces for sandboxes: the create step that puts a sandbox's init
 * in a user namespace mapped onto its host id range, and the enter step that
 * joins it. */
#pragma once
#include <stdbool.h>
#include <sys/types.h>

/* One JSON error line on fd (util.c; declared for the helper in helper.h). */
void report_error_fd(int fd, int err, const char *syscall_name, const char *path);

/*
 * Forks the sandbox's init: a new user namespace whose ids 0..count-1 are
 * host ids base..base+count-1, and then, owned by it, the namespaces in
 * ns_flags. Returns 0 in the init (running as root of the new namespace),
 * its host pid in the caller, or -1 after reporting the error on report_fd
 * (the caller's) or errfd (the intermediate process's).
 */
pid_t userns_fork(unsigned long base, unsigned long count, int ns_flags, int report_fd, int errfd);

/* The user namespace of pid: an fd, -1 when it is ours (nothing to join),
 * -2 after reporting an error. Open it before joining the mount namespace. */
int userns_open_at(int procfd, int report_fd);

/* Joins a user namespace from userns_open (no-op for -1) as its root. */
int userns_join(int fd, int report_fd);
