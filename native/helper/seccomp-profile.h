/*
 * The sandbox syscall profile as data (seccomp-profile.c). It is compiled to
 * a BPF program once, at build time, by seccomp-compile.c with libseccomp;
 * the helper only installs the result (confine.c).
 */
#ifndef LOCKSTEP_SECCOMP_PROFILE_H
#define LOCKSTEP_SECCOMP_PROFILE_H

#include <stdint.h>

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
