// Process verbs on pidfds: signalling a sandbox's init through a pidfd can
// never hit a recycled pid, which matters because sandboxes outlive the
// manager process that created them.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

// pidfdOpen(pid) -> fd
static Napi::Value PidfdOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int pid = IntArg(info, 0, "pid");
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    ThrowSystemError(env, errno, "pidfd_open", std::to_string(pid));
    return env.Undefined();
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return Napi::Number::New(env, static_cast<double>(fd));
}

// pidfdSendSignal(fd, signal) -> false when the process is already gone
static Napi::Value PidfdSendSignal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "fd");
  int sig = IntArg(info, 1, "signal");
  if (::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) != 0) {
    if (errno == ESRCH) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "pidfd_send_signal");
    return env.Undefined();
  }
  return Napi::Boolean::New(env, true);
}

// pidfdExited(fd) -> true once the process has exited (pidfd polls readable)
static Napi::Value PidfdExited(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "fd");
  struct pollfd p = {fd, POLLIN, 0};
  int r = ::poll(&p, 1, 0);
  if (r < 0) {
    ThrowSystemError(env, errno, "poll(pidfd)");
    return env.Undefined();
  }
  return Napi::Boolean::New(env, r > 0);
}

// closeFd(fd)
static Napi::Value CloseFd(const Napi::CallbackInfo& info) {
  int fd = IntArg(info, 0, "fd");
  ::close(fd);
  return info.Env().Undefined();
}

// flock(fd, exclusive) -> true when taken; never blocks (the JS side retries),
// so the event loop is never parked on another manager's lock.
static Napi::Value Flock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "fd");
  bool exclusive = BoolArg(info, 1, true);
  if (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "flock");
    return env.Undefined();
  }
  return Napi::Boolean::New(env, true);
}

// funlock(fd)
static Napi::Value Funlock(const Napi::CallbackInfo& info) {
  int fd = IntArg(info, 0, "fd");
  ::flock(fd, LOCK_UN);
  return info.Env().Undefined();
}

void InitProcesses(Napi::Env env, Napi::Object exports) {
  exports.Set("flock", Napi::Function::New(env, Flock));
  exports.Set("funlock", Napi::Function::New(env, Funlock));
  exports.Set("pidfdOpen", Napi::Function::New(env, PidfdOpen));
  exports.Set("pidfdSendSignal", Napi::Function::New(env, PidfdSendSignal));
  exports.Set("pidfdExited", Napi::Function::New(env, PidfdExited));
  exports.Set("closeFd", Napi::Function::New(env, CloseFd));
}

}  // namespace lockstep
