/*
 * Confinement of every process that enters a sandbox: the sandbox's init
 * (helper create) and every command run in it (helper enter) get the same
 * treatment just before their exec, so nothing in a sandbox is less confined
 * than anything else in it. See docs/ARCHITECTURE.md, "Security".
 */
#ifndef LOCKSTEP_CONFINE_H
#define LOCKSTEP_CONFINE_H

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
 * no_new_privs, and the seccomp filter compiled from seccomp-profile.c at
 * build time (seccomp-compile.c). The caller must
 * exec right after: the filter refuses what the set-up itself needed
 * (mount, setns, ...). Returns 0, or -1 with errno set and *step naming the
 * call that failed (for the helper's SystemError-shaped report).
 */
int confine_process(const char **step);

#endif
