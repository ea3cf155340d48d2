// Advisory locks on a state directory and its sandboxes (flock), never
// blocking: the JS side retries, so the event loop is never parked on
// another manager's lock.
#include <sys/file.h>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

// flock(fd, exclusive) -> true when taken, false when another holder has it.
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

void InitLocks(Napi::Env env, Napi::Object exports) { exports.Set("flock", Napi::Function::New(env, Flock)); }

}  // namespace lockstep
