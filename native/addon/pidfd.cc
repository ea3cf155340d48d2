// pidfds for signalling a sandbox's processes: a pidfd names one process for
// as long as the fd is open, so a signal sent through it can never reach a
// process that got the same pid later.
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "addon.h"
#include "system_error.h"

#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define PIDFD_SIGNAL_PROCESS_GROUP (1U << 2)  // Linux >= 6.9
#endif

namespace lockstep {

// pidfdOpen(pid) -> fd (close it with fs.closeSync). ESRCH when pid is gone.
static Napi::Value PidfdOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int pid = IntArg(info, 0, "pid");
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    // Every way of finding no such process is ESRCH to the caller.
    int err = PidfdOpenFoundNoProcess(errno) ? ESRCH : errno;
    ThrowSystemError(env, err, "pidfd_open", "/proc/" + std::to_string(pid));
    return env.Undefined();
  }
  return Napi::Number::New(env, fd);
}

// pidfdSendSignal(fd, signal, group) -> false when the process has exited.
// group: the signal goes to the process group the process leads.
static Napi::Value PidfdSendSignal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "fd");
  int sig = IntArg(info, 1, "signal");
  bool group = BoolArg(info, 2, false);
  if (::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, group ? PIDFD_SIGNAL_PROCESS_GROUP : 0U) != 0) {
    if (errno == ESRCH) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "pidfd_send_signal");
    return env.Undefined();
  }
  return Napi::Boolean::New(env, true);
}

void InitPidfd(Napi::Env env, Napi::Object exports) {
  exports.Set("pidfdOpen", Napi::Function::New(env, PidfdOpen));
  exports.Set("pidfdSendSignal", Napi::Function::New(env, PidfdSendSignal));
}

}  // namespace lockstep
