// Path resolution inside a sandbox root that can never escape it. A caller's
// path (even "../../etc/shadow", or a symlink the sandbox planted that points
// at "/" or outside) is resolved by the kernel with openat2(RESOLVE_BENEATH):
// anything that would leave the root fails with EXDEV instead of being
// followed. The fd is handed to Node's fs, which does the I/O.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

// openBeneath(root, relativePath, flags, mode) -> fd
static Napi::Value OpenBeneath(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string root = StringArg(info, 0, "root");
  std::string rel = StringArg(info, 1, "path");
  int flags = IntArg(info, 2, "flags");
  int mode = info.Length() > 3 && info[3].IsNumber() ? info[3].As<Napi::Number>().Int32Value() : 0;
  UniqueFd rootFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!rootFd.valid()) {
    ThrowSystemError(env, errno, "open", root);
    return env.Undefined();
  }
  struct open_how how = {};
  how.flags = static_cast<__u64>(flags) | O_CLOEXEC;
  bool creates = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
  how.mode = creates ? static_cast<__u64>(mode) : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  const char* p = rel.empty() ? "." : rel.c_str();
  long fd = ::syscall(SYS_openat2, rootFd.get(), p, &how, sizeof(how));
  if (fd < 0) {
    ThrowSystemError(env, errno, "openat2", rel);
    return env.Undefined();
  }
  return Napi::Number::New(env, static_cast<double>(fd));
}

void InitFiles(Napi::Env env, Napi::Object exports) {
  exports.Set("openBeneath", Napi::Function::New(env, OpenBeneath));
  Napi::Object flags = Napi::Object::New(env);
  flags.Set("O_PATH", Napi::Number::New(env, O_PATH));
  flags.Set("O_DIRECTORY", Napi::Number::New(env, O_DIRECTORY));
  flags.Set("O_NOFOLLOW", Napi::Number::New(env, O_NOFOLLOW));
  exports.Set("openFlags", flags);
}

}  // namespace lockstep
