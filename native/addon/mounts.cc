// Mount verbs: overlayfs for a sandbox root, and unmount. Both are single
// syscalls that affect the whole process's mount namespace, so they are safe
// to call from Node's main thread (unlike unshare/setns, which the helper does).
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <string>
#include <vector>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

// Overlay options are a comma-separated list and lowerdir is ':'-separated, so
// both characters (and the escape itself) must be escaped in paths; the
// kernel's option parser honours backslash escapes (see bubblewrap's
// strappend_escape_for_mount_options).
std::string EscapeMountOption(const std::string& path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    if (c == '\\' || c == ',' || c == ':') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string OverlayOptions(const std::vector<std::string>& lowers, const std::string& upper,
                           const std::string& work) {
  std::string opts = "lowerdir=";
  for (size_t i = 0; i < lowers.size(); i++) {
    if (i) opts += ":";
    opts += EscapeMountOption(lowers[i]);
  }
  opts += ",upperdir=" + EscapeMountOption(upper);
  opts += ",workdir=" + EscapeMountOption(work);
  // index=off/xino: keep overlay from pinning lower inodes to the upper fs so
  // that a btrfs snapshot of the upper layer is usable with any later mount.
  opts += ",index=off,redirect_dir=off,metacopy=off";
  return opts;
}

// mountOverlay(target, lowers[], upper, work)
static Napi::Value MountOverlay(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string target = StringArg(info, 0, "target");
  if (info.Length() < 2 || !info[1].IsArray()) throw Napi::TypeError::New(env, "argument 'lowers' must be an array");
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<std::string> lowers;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsString()) throw Napi::TypeError::New(env, "lowers must hold strings");
    lowers.push_back(v.As<Napi::String>().Utf8Value());
  }
  std::string upper = StringArg(info, 2, "upper");
  std::string work = StringArg(info, 3, "work");
  std::string opts = OverlayOptions(lowers, upper, work);
  if (::mount("overlay", target.c_str(), "overlay", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
    ThrowSystemError(env, errno, "mount(overlay)", target);
    return env.Undefined();
  }
  return env.Undefined();
}

// unmount(target, detach): "not mounted" and "gone" count as success, so
// teardown stays idempotent.
static Napi::Value Unmount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string target = StringArg(info, 0, "target");
  bool detach = BoolArg(info, 1, true);
  if (::umount2(target.c_str(), detach ? MNT_DETACH : 0) != 0) {
    if (errno == EINVAL || errno == ENOENT) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "umount2", target);
    return env.Undefined();
  }
  return Napi::Boolean::New(env, true);
}

// filesystemType(path) -> statfs f_type as a number (btrfs, overlay, tmpfs...)
static Napi::Value FilesystemType(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  struct statfs st;
  if (::statfs(path.c_str(), &st) != 0) {
    ThrowSystemError(env, errno, "statfs", path);
    return env.Undefined();
  }
  return Napi::Number::New(env, static_cast<double>(static_cast<unsigned long>(st.f_type)));
}

// makeSharedMount(path): bind-mounts path onto itself (if needed) and marks
// it shared, so mounts made under it propagate to slave namespaces (the CRIU
// service's).
static Napi::Value MakeSharedMount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  bool bind = BoolArg(info, 1, true);
  // MS_REC: mounts already below path (roots of running sandboxes) stay visible.
  if (bind && ::mount(path.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    ThrowSystemError(env, errno, "mount(MS_BIND)", path);
    return env.Undefined();
  }
  if (::mount(nullptr, path.c_str(), nullptr, MS_SHARED, nullptr) != 0) {
    ThrowSystemError(env, errno, "mount(MS_SHARED)", path);
  }
  return env.Undefined();
}

void InitMounts(Napi::Env env, Napi::Object exports) {
  exports.Set("makeSharedMount", Napi::Function::New(env, MakeSharedMount));
  exports.Set("mountOverlay", Napi::Function::New(env, MountOverlay));
  exports.Set("unmount", Napi::Function::New(env, Unmount));
  exports.Set("filesystemType", Napi::Function::New(env, FilesystemType));
}

}  // namespace lockstep
