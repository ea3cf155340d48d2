/*
 * lockstep-init: pid 1 of every sandbox.
 *
 * It lives inside the sandbox root (a read-only overlay layer of its own puts
 * it at /.lockstep/init), so CRIU can dump and restore it like any other
 * process of the tree. Its one job is the one every pid 1 has: reap orphans,
 * so that zombies never pile up inside the sandbox. It is statically linked
 * because the image may have no libc at all.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  for (;;) {
    siginfo_t si;
    int sig = sigwaitinfo(&all, &si);
    if (sig == SIGCHLD) {
      while (waitpid(-1, NULL, WNOHANG) > 0) {
      }
    } else if (sig == SIGTERM || sig == SIGINT) {
      /* Orderly stop: ask everyone to leave, then leave; the kernel kills the
       * rest of the pid namespace when pid 1 exits. */
      kill(-1, SIGTERM);
      _exit(0);
    }
  }
}
