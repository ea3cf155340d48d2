// btrfs subvolume verbs through the kernel ioctls (not the btrfs CLI): a
// snapshot is O(1) in the size of the subvolume, which is what makes a
// checkpoint of a large workspace cheap (see docs/ARCHITECTURE.md).
#include <fcntl.h>
#include <linux/btrfs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

namespace {

// Split "/a/b/c" into parent "/a/b" and leaf "c"; the ioctls act on the parent.
bool SplitPath(const std::string& path, std::string* parent, std::string* leaf) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash + 1 >= path.size()) return false;
  *parent = slash == 0 ? "/" : path.substr(0, slash);
  *leaf = path.substr(slash + 1);
  return leaf->size() < BTRFS_SUBVOL_NAME_MAX && *leaf != "." && *leaf != "..";
}

int OpenDir(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }

}  // namespace

// subvolumeCreate(path)
static Napi::Value SubvolumeCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  std::string parent, leaf;
  if (!SplitPath(path, &parent, &leaf)) {
    ThrowSystemError(env, EINVAL, "btrfs subvolume create", path);
    return env.Undefined();
  }
  UniqueFd dir(OpenDir(parent));
  if (!dir.valid()) {
    ThrowSystemError(env, errno, "open", parent);
    return env.Undefined();
  }
  struct btrfs_ioctl_vol_args_v2 args;
  std::memset(&args, 0, sizeof(args));
  std::strncpy(args.name, leaf.c_str(), BTRFS_SUBVOL_NAME_MAX);
  if (::ioctl(dir.get(), BTRFS_IOC_SUBVOL_CREATE_V2, &args) != 0) {
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_SUBVOL_CREATE_V2)", path);
  }
  return env.Undefined();
}

// subvolumeSnapshot(source, dest, readonly)
static Napi::Value SubvolumeSnapshot(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string source = StringArg(info, 0, "source");
  std::string dest = StringArg(info, 1, "dest");
  bool readonly = BoolArg(info, 2, false);
  std::string parent, leaf;
  if (!SplitPath(dest, &parent, &leaf)) {
    ThrowSystemError(env, EINVAL, "btrfs subvolume snapshot", dest);
    return env.Undefined();
  }
  UniqueFd src(OpenDir(source));
  if (!src.valid()) {
    ThrowSystemError(env, errno, "open", source);
    return env.Undefined();
  }
  UniqueFd dir(OpenDir(parent));
  if (!dir.valid()) {
    ThrowSystemError(env, errno, "open", parent);
    return env.Undefined();
  }
  struct btrfs_ioctl_vol_args_v2 args;
  std::memset(&args, 0, sizeof(args));
  args.fd = src.get();
  if (readonly) args.flags |= BTRFS_SUBVOL_RDONLY;
  std::strncpy(args.name, leaf.c_str(), BTRFS_SUBVOL_NAME_MAX);
  if (::ioctl(dir.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0) {
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_SNAP_CREATE_V2)", dest);
  }
  return env.Undefined();
}

// subvolumeDelete(path): a missing subvolume counts as deleted (idempotent
// teardown). The kernel frees the extents asynchronously.
static Napi::Value SubvolumeDelete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  std::string parent, leaf;
  if (!SplitPath(path, &parent, &leaf)) {
    ThrowSystemError(env, EINVAL, "btrfs subvolume delete", path);
    return env.Undefined();
  }
  UniqueFd dir(OpenDir(parent));
  if (!dir.valid()) {
    if (errno == ENOENT) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "open", parent);
    return env.Undefined();
  }
  struct btrfs_ioctl_vol_args args;
  std::memset(&args, 0, sizeof(args));
  std::strncpy(args.name, leaf.c_str(), BTRFS_PATH_NAME_MAX);
  if (::ioctl(dir.get(), BTRFS_IOC_SNAP_DESTROY, &args) != 0) {
    if (errno == ENOENT) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_SNAP_DESTROY)", path);
    return env.Undefined();
  }
  return Napi::Boolean::New(env, true);
}

// syncFilesystem(path): syncfs(2) on the filesystem holding path. On btrfs
// this commits the transaction, which makes created snapshots durable.
static Napi::Value SyncFilesystem(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    ThrowSystemError(env, errno, "open", path);
    return env.Undefined();
  }
  if (::syncfs(fd.get()) != 0) ThrowSystemError(env, errno, "syncfs", path);
  return env.Undefined();
}

void InitBtrfs(Napi::Env env, Napi::Object exports) {
  exports.Set("subvolumeCreate", Napi::Function::New(env, SubvolumeCreate));
  exports.Set("subvolumeSnapshot", Napi::Function::New(env, SubvolumeSnapshot));
  exports.Set("subvolumeDelete", Napi::Function::New(env, SubvolumeDelete));
  exports.Set("syncFilesystem", Napi::Function::New(env, SyncFilesystem));
}

}  // namespace lockstep
