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
 *      It was compiled at build time (seccomp-compile.c): installing it is
 *      one syscall, where building it with libseccomp in every helper
 *      process cost 6-40 ms per command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "confine.h"

/* Docker's default capability set without CAP_MKNOD and CAP_NET_RAW.
 * CAP_NET_RAW goes because AF_PACKET receive rings are kernel memory this
 * kernel does not charge to the memory cgroup (a 64 MiB sandbox held 768 MiB
 * of host memory in them; one ring can reach 4 GiB), and an agent needs no
 * raw sockets (gVisor and bubblewrap drop it too). The seccomp filter refuses
 * the same sockets again (seccomp-profile.c). docs/SECURITY.md lists why each
 * kept one stays. Everything else (SYS_ADMIN, SYS_PTRACE, SYS_MODULE,
 * DAC_READ_SEARCH, NET_ADMIN, ...) goes. */
static const cap_value_t sandbox_caps[] = {
    CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,     CAP_KILL,        CAP_SETGID,
    CAP_SETUID, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_AUDIT_WRITE, CAP_SETFCAP};
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

/* The program seccomp-compile.c made from seccomp-profile.c at build time. */
#include "seccomp-program.h"

static int install_seccomp(void) {
  struct sock_fprog prog = {
      .len = (unsigned short)(sizeof(sandbox_seccomp_program) / sizeof(sandbox_seccomp_program[0])),
      .filter = (struct sock_filter *)sandbox_seccomp_program,
  };
  return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
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
  *step = "seccomp(SECCOMP_SET_MODE_FILTER)";
  return install_seccomp();
}
