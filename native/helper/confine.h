/*
 * Confinement of every process that enters a sandbox: the sandbox's init
 * (helper create) and every command run in it (helper enter) get the same
 * treatment just before their exec, so nothing in a sandbox is less confined
 * than anything else in it. See docs/ARCHITECTURE.md, "Security".
 */
#ifndef LOCKSTEP_CONFINE_H
#define LOCKSTEP_CONFINE_H

#include <stdint.h>

/*
 * Drops every capability outside the sandbox set from the bounding set only.
 * The helper calls it as soon as it is inside a sandbox's namespaces, long
 * before confine_process(), so a mistake in between cannot hand out more.
 * Returns 0, or -1 with errno set.
 */
int confine_drop_bounding_set(void);

/*
 * Applies, in this order: not dumpable (until the exec), a new session
 * keyring, RLIMIT_CORE 0, the capability sets (bounding = permitted =
 * effective = the sandbox set, inheritable and ambient empty),
 * no_new_privs, and the seccomp filter of seccomp-profile.c. The caller must
 * exec right after: the filter refuses what the set-up itself needed
 * (mount, setns, ...). Returns 0, or -1 with errno set and *step naming the
 * call that failed (for the helper's SystemError-shaped report).
 */
int confine_process(const char **step);

/* ---- the seccomp profile (seccomp-profile.c) ---------------------------- */

/* Syscalls allowed whatever their arguments. NULL-terminated. */
extern const char *const seccomp_allowed[];

/* One comparison of a syscall argument (libseccomp's struct scmp_arg_cmp). */
struct seccomp_arg {
  unsigned int index;
  int op; /* enum scmp_compare */
  uint64_t value, mask_or_second;
};

/* A syscall allowed, or refused with a specific errno, when all of its
 * argument comparisons hold. */
struct seccomp_rule {
  const char *name;
  int refuse_errno; /* 0: allow */
  unsigned int nargs;
  struct seccomp_arg args[2];
  const char *why;
};
extern const struct seccomp_rule seccomp_rules[];
extern const unsigned int seccomp_rule_count;

/* x86_64 numbers of syscalls newer than the libseccomp this was built with
 * knows by name (looked up only when the name does not resolve). */
struct seccomp_syscall_number {
  const char *name;
  int x86_64;
};
extern const struct seccomp_syscall_number seccomp_newer_syscalls[];
extern const unsigned int seccomp_newer_syscall_count;

#endif
