// Errors thrown by the addon look like Node's own SystemError: `code`
// (EPERM), `errno`, `syscall` and `path`, so the TypeScript layer can wrap
// them without parsing messages.
#pragma once

#include <napi.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace lockstep {

// Captured on a worker thread (no JS values there), thrown later on the JS thread.
struct SystemFailure {
  int err = 0;
  std::string syscall;
  std::string path;
  std::string detail;  // optional extra words, e.g. a CRIU log file name

  bool failed() const { return err != 0 || !detail.empty(); }
};

inline const char* ErrnoName(int err) {
#if defined(__GLIBC__)
  const char* name = strerrorname_np(err);
  return name ? name : "EUNKNOWN";
#else
  return "EUNKNOWN";
#endif
}

// pidfd_open failed because the pid names no live thread-group leader: no
// such process (ESRCH; ENOENT once it has been reaped on recent kernels, as
// CI met on 6.18 for a host process exiting at that moment), or not a
// thread-group leader (EINVAL). The helper's pin_init says the same.
inline bool PidfdOpenFoundNoProcess(int err) { return err == ESRCH || err == ENOENT || err == EINVAL; }

inline Napi::Error MakeSystemError(Napi::Env env, const SystemFailure& f) {
  std::string msg = f.syscall;
  if (f.err != 0) {
    msg += " failed: ";
    msg += ErrnoName(f.err);
    msg += " (";
    msg += std::strerror(f.err);
    msg += ")";
  } else {
    msg += " failed";
  }
  if (!f.path.empty()) msg += ", path '" + f.path + "'";
  if (!f.detail.empty()) msg += ": " + f.detail;
  Napi::Error e = Napi::Error::New(env, msg);
  Napi::Object o = e.Value();
  o.Set("code", Napi::String::New(env, f.err ? ErrnoName(f.err) : "EFAILED"));
  o.Set("errno", Napi::Number::New(env, -f.err));
  o.Set("syscall", Napi::String::New(env, f.syscall));
  if (!f.path.empty()) o.Set("path", Napi::String::New(env, f.path));
  return e;
}

inline void ThrowSystemError(Napi::Env env, int err, const std::string& syscall, const std::string& path = "") {
  SystemFailure f{err, syscall, path, ""};
  MakeSystemError(env, f).ThrowAsJavaScriptException();
}

// Small RAII owner of a file descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_;
};

// Argument helpers: cheap guards only; validation with good messages lives in TypeScript.
std::string StringArg(const Napi::CallbackInfo& info, size_t i, const char* name);
int IntArg(const Napi::CallbackInfo& info, size_t i, const char* name);
bool BoolArg(const Napi::CallbackInfo& info, size_t i, bool dflt);

}  // namespace lockstep
