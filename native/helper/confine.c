/*
 * How a process is confined before it becomes (or runs inside) a sandbox.
 * The order matters:
 *   1. not dumpable: from here to the exec nothing in the sandbox may ptrace
 *      or open /proc/<pid>/mem of this process (the kernel's own rule keeps it
 *      safe before, when its capabilities are a superset of theirs); the exec
 *      makes it dumpable again;
 *   2. a new session keyring, while keyctl is still allowed: no sandbox shares
 *      host root's session keyring (keyrings are not namespaced);
 *   3. RLIMIT_CORE 0 (soft and hard: lowering needs no privilege; the host
 *      has no CAP_SYS_RESOURCE, so no limit is ever raised);
 *   4. capabilities, with libcap: the bounding set, ambient cleared, then
 *      permitted = effective = the sandbox set and inheritable empty (moby
 *      clears inheritable since CVE-2022-24769). libcap rather than raw capset
 *      because it owns the version-3 two-word layout and the kernel's
 *      cap_last_cap probing, the details a hand-written capset gets wrong;
 *   5. no_new_privs: no setuid bit or file capability adds anything after
 *      this, and it lets an unprivileged filter be installed;
 *   6. the seccomp filter, last, because it refuses calls the steps above make.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/keyctl.h>
#include <seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "confine.h"

/* Docker's default capability set without CAP_MKNOD. Everything else
 * (SYS_ADMIN, SYS_PTRACE, SYS_MODULE, DAC_READ_SEARCH, NET_ADMIN, ...) goes. */
static const cap_value_t sandbox_caps[] = {CAP_CHOWN,   CAP_DAC_OVERRIDE,     CAP_FOWNER,  CAP_FSETID,
                                           CAP_KILL,    CAP_SETGID,           CAP_SETUID,  CAP_SETPCAP,
                                           CAP_NET_BIND_SERVICE, CAP_NET_RAW, CAP_SYS_CHROOT, CAP_AUDIT_WRITE,
                                           CAP_SETFCAP};
#define N_SANDBOX_CAPS ((int)(sizeof(sandbox_caps) / sizeof(sandbox_caps[0])))

static bool is_sandbox_cap(cap_value_t cap) {
  for (int i = 0; i < N_SANDBOX_CAPS; i++)
    if (sandbox_caps[i] == cap) return true;
  return false;
}

int confine_drop_bounding_set(void) {
  /* cap_max_bits() is what this kernel knows (cap_last_cap + 1), so a
   * capability added by a newer kernel is dropped too. */
  for (cap_value_t cap = 0; cap < (cap_value_t)cap_max_bits(); cap++) {
    if (is_sandbox_cap(cap)) continue;
    if (cap_drop_bound(cap) != 0 && errno != EINVAL) return -1;
  }
  return 0;
}

static int set_capabilities(const char **step) {
  *step = "prctl(PR_CAPBSET_DROP)";
  if (confine_drop_bounding_set() != 0) return -1;
  *step = "prctl(PR_CAP_AMBIENT_CLEAR_ALL)";
  if (CAP_AMBIENT_SUPPORTED() && cap_reset_ambient() != 0) return -1;
  *step = "capset";
  cap_t caps = cap_init(); /* every flag clear: inheritable stays empty */
  if (!caps) return -1;
  int rc = -1;
  if (cap_set_flag(caps, CAP_PERMITTED, N_SANDBOX_CAPS, sandbox_caps, CAP_SET) == 0 &&
      cap_set_flag(caps, CAP_EFFECTIVE, N_SANDBOX_CAPS, sandbox_caps, CAP_SET) == 0)
    rc = cap_set_proc(caps);
  int saved = errno;
  cap_free(caps);
  errno = saved;
  return rc;
}

/* Resolves a profile name for the native ABI; a name this libseccomp does
 * not know falls back to the profile's table of newer x86_64 numbers. */
static int resolve_syscall(const char *name) {
  int nr = seccomp_syscall_resolve_name(name);
  if (nr != __NR_SCMP_ERROR) return nr;
  if (seccomp_arch_native() == SCMP_ARCH_X86_64)
    for (unsigned int i = 0; i < seccomp_newer_syscall_count; i++)
      if (strcmp(seccomp_newer_syscalls[i].name, name) == 0) return seccomp_newer_syscalls[i].x86_64;
  return __NR_SCMP_ERROR;
}

static int build_filter(scmp_filter_ctx ctx, const char **step) {
  int rc;
  /* A 32-bit x86 or x32 syscall never reaches the table: kill the process. */
  *step = "seccomp_attr_set";
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) != 0) return rc;
  /* no_new_privs is set explicitly before (confine_process), not as a side
   * effect of loading. */
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) != 0) return rc;
  /* A binary tree of syscall numbers: every syscall of every sandbox process
   * runs this filter, a linear list of ~330 entries would cost on each. */
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)) != 0) return rc;

  *step = "seccomp_rule_add";
  for (const char *const *name = seccomp_allowed; *name; name++) {
    int nr = resolve_syscall(*name);
    if (nr == __NR_SCMP_ERROR) return -EINVAL; /* a typo in the table must not pass silently */
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)) != 0) return rc;
  }
  for (unsigned int i = 0; i < seccomp_rule_count; i++) {
    const struct seccomp_rule *r = &seccomp_rules[i];
    int nr = resolve_syscall(r->name);
    if (nr == __NR_SCMP_ERROR) return -EINVAL;
    struct scmp_arg_cmp cmp[2];
    for (unsigned int a = 0; a < r->nargs; a++)
      cmp[a] = (struct scmp_arg_cmp){r->args[a].index, (enum scmp_compare)r->args[a].op, r->args[a].value,
                                     r->args[a].mask_or_second};
    uint32_t action = r->refuse_errno ? SCMP_ACT_ERRNO((uint32_t)r->refuse_errno) : SCMP_ACT_ALLOW;
    if ((rc = seccomp_rule_add_array(ctx, action, nr, r->nargs, cmp)) != 0) return rc;
  }
  return 0;
}

static int install_seccomp(const char **step) {
  *step = "seccomp_init";
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (!ctx) {
    errno = ENOMEM;
    return -1;
  }
  int rc = build_filter(ctx, step);
  if (rc == 0) {
    *step = "seccomp(SECCOMP_SET_MODE_FILTER)";
    rc = seccomp_load(ctx);
  }
  seccomp_release(ctx);
  if (rc != 0) {
    errno = -rc;
    return -1;
  }
  return 0;
}

int confine_process(const char **step) {
  *step = "prctl(PR_SET_DUMPABLE)";
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return -1;
  *step = "keyctl(KEYCTL_JOIN_SESSION_KEYRING)";
  if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0) < 0) return -1;
  *step = "setrlimit(RLIMIT_CORE)";
  struct rlimit no_core = {0, 0};
  if (setrlimit(RLIMIT_CORE, &no_core) != 0) return -1;
  if (set_capabilities(step) != 0) return -1;
  *step = "prctl(PR_SET_NO_NEW_PRIVS)";
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return install_seccomp(step);
}
