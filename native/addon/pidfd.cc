// pidfds for signalling a sandbox's processes: a pidfd names one process for
// as long as the fd is open, so a signal sent through it can never reach a
// process that got the same pid later.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "addon.h"
#include "system_error.h"

#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define PIDFD_SIGNAL_PROCESS_GROUP (1U << 2)  // Linux >= 6.9
#endif

// nsfs ioctls that translate a pid of a pid namespace into the caller's (Linux >= 6.11).
#ifndef NS_GET_PID_FROM_PIDNS
#define NS_GET_PID_FROM_PIDNS _IOR(0xb7, 0x6, int)
#endif
#ifndef NS_GET_TGID_FROM_PIDNS
#define NS_GET_TGID_FROM_PIDNS _IOR(0xb7, 0x7, int)
#endif

namespace lockstep {

namespace {

bool Exited(int pidfd) {
  struct pollfd p = {pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

// hostPidsIn(initPid, initStart, nsPids) -> for each of nsPids, the host pid
// of the live process that has it in the pid namespace of the init (initPid,
// started at initStart), or null (no such process, a zombie, or a thread's
// id); null instead of the array when that init is gone. A constant number
// of system calls per pid, whatever the sandbox runs: the alternative,
// reading NSpid of every process of its cgroup, costs as many /proc reads as
// the sandbox has processes. The init is pinned by a pidfd while its
// namespace is opened, so the namespace is that init's even if its pid is
// reused. ENOTTY/EINVAL: a kernel before 6.11 (no nsfs pid translation).
static Napi::Value HostPidsIn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int init = IntArg(info, 0, "initPid");
  if (env.IsExceptionPending()) return env.Undefined();
  if (info.Length() < 3 || !info[1].IsNumber() || !info[2].IsArray()) {
    Napi::TypeError::New(env, "hostPidsIn(initPid, initStart, nsPids[])").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  unsigned long long expected = static_cast<unsigned long long>(info[1].As<Napi::Number>().Int64Value());
  Napi::Array nsPids = info[2].As<Napi::Array>();
  if (init <= 0) return env.Null();
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, init, 0)));
  if (!pidfd.valid()) {
    if (PidfdOpenFoundNoProcess(errno)) return env.Null();
    ThrowSystemError(env, errno, "pidfd_open", "/proc/" + std::to_string(init));
    return env.Undefined();
  }
  uint64_t start = 0;
  char state = 0;
  if (!ReadStartTime(init, &start, &state) || start != expected) return env.Null();
  std::string nsPath = "/proc/" + std::to_string(init) + "/ns/pid";
  UniqueFd ns(::open(nsPath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return env.Null();
  if (Exited(pidfd.get())) return env.Null();  // the init exited: the namespace may be another's
  Napi::Array out = Napi::Array::New(env, nsPids.Length());
  for (uint32_t i = 0; i < nsPids.Length(); i++) {
    out.Set(i, env.Null());
    Napi::Value v = nsPids.Get(i);
    if (!v.IsNumber()) continue;
    int64_t nsPid = v.As<Napi::Number>().Int64Value();
    if (nsPid <= 0 || nsPid > INT32_MAX) continue;
    int pid = ::ioctl(ns.get(), NS_GET_PID_FROM_PIDNS, static_cast<unsigned long>(nsPid));
    if (pid < 0 && errno == ESRCH) continue;
    if (pid < 0) {
      ThrowSystemError(env, errno, "ioctl(NS_GET_PID_FROM_PIDNS)", nsPath);
      return env.Undefined();
    }
    int tgid = ::ioctl(ns.get(), NS_GET_TGID_FROM_PIDNS, static_cast<unsigned long>(nsPid));
    if (tgid != pid) continue;  // a thread of some process, or gone since
    // A pidfd is readable once its process has exited (a zombie too).
    UniqueFd proc(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!proc.valid() || Exited(proc.get())) continue;
    out.Set(i, Napi::Number::New(env, pid));
  }
  return out;
}

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
  exports.Set("hostPidsIn", Napi::Function::New(env, HostPidsIn));
}

}  // namespace lockstep
