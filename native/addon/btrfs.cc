// btrfs subvolume verbs through the kernel ioctls (not the btrfs CLI): a
// snapshot is O(1) in the size of the subvolume, which is what makes a
// checkpoint of a large workspace cheap (see docs/decisions/layer-store-btrfs.md).
#include <fcntl.h>
#include <linux/btrfs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "addon.h"
#include "async_work.h"
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

// Each verb returns a Promise and runs its ioctl on libuv's pool: a snapshot
// commits a btrfs transaction and syncfs writes back the whole store, which
// can take long enough under load to stall every other request if done on
// the JS thread.

// subvolumeCreate(path) -> Promise<void>
static Napi::Value SubvolumeCreate(const Napi::CallbackInfo& info) {
  std::string path = StringArg(info, 0, "path");
  return PromiseWorker<bool>::Start(
      info.Env(), "lockstep:subvolumeCreate",
      [path](SystemFailure* f) {
        std::string parent, leaf;
        if (!SplitPath(path, &parent, &leaf)) return Fail(f, EINVAL, "btrfs subvolume create", path, false);
        UniqueFd dir(OpenDir(parent));
        if (!dir.valid()) return Fail(f, errno, "open", parent, false);
        struct btrfs_ioctl_vol_args_v2 args;
        std::memset(&args, 0, sizeof(args));
        std::strncpy(args.name, leaf.c_str(), BTRFS_SUBVOL_NAME_MAX);
        if (::ioctl(dir.get(), BTRFS_IOC_SUBVOL_CREATE_V2, &args) != 0)
          return Fail(f, errno, "ioctl(BTRFS_IOC_SUBVOL_CREATE_V2)", path, false);
        return true;
      },
      [](Napi::Env env, const bool&) { return env.Undefined(); });
}

// subvolumeSnapshot(source, dest, readonly) -> Promise<void>
static Napi::Value SubvolumeSnapshot(const Napi::CallbackInfo& info) {
  std::string source = StringArg(info, 0, "source");
  std::string dest = StringArg(info, 1, "dest");
  bool readonly = BoolArg(info, 2, false);
  return PromiseWorker<bool>::Start(
      info.Env(), "lockstep:subvolumeSnapshot",
      [source, dest, readonly](SystemFailure* f) {
        std::string parent, leaf;
        if (!SplitPath(dest, &parent, &leaf)) return Fail(f, EINVAL, "btrfs subvolume snapshot", dest, false);
        UniqueFd src(OpenDir(source));
        if (!src.valid()) return Fail(f, errno, "open", source, false);
        UniqueFd dir(OpenDir(parent));
        if (!dir.valid()) return Fail(f, errno, "open", parent, false);
        struct btrfs_ioctl_vol_args_v2 args;
        std::memset(&args, 0, sizeof(args));
        args.fd = src.get();
        if (readonly) args.flags |= BTRFS_SUBVOL_RDONLY;
        std::strncpy(args.name, leaf.c_str(), BTRFS_SUBVOL_NAME_MAX);
        if (::ioctl(dir.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0)
          return Fail(f, errno, "ioctl(BTRFS_IOC_SNAP_CREATE_V2)", dest, false);
        return true;
      },
      [](Napi::Env env, const bool&) { return env.Undefined(); });
}

// subvolumeDelete(path) -> Promise<boolean>: a missing subvolume counts as
// deleted (idempotent teardown; false). The kernel frees the extents
// asynchronously.
static Napi::Value SubvolumeDelete(const Napi::CallbackInfo& info) {
  std::string path = StringArg(info, 0, "path");
  return PromiseWorker<bool>::Start(
      info.Env(), "lockstep:subvolumeDelete",
      [path](SystemFailure* f) {
        std::string parent, leaf;
        if (!SplitPath(path, &parent, &leaf)) return Fail(f, EINVAL, "btrfs subvolume delete", path, false);
        UniqueFd dir(OpenDir(parent));
        if (!dir.valid()) {
          if (errno == ENOENT) return false;
          return Fail(f, errno, "open", parent, false);
        }
        struct btrfs_ioctl_vol_args args;
        std::memset(&args, 0, sizeof(args));
        std::strncpy(args.name, leaf.c_str(), BTRFS_PATH_NAME_MAX);
        if (::ioctl(dir.get(), BTRFS_IOC_SNAP_DESTROY, &args) != 0) {
          if (errno == ENOENT) return false;
          return Fail(f, errno, "ioctl(BTRFS_IOC_SNAP_DESTROY)", path, false);
        }
        return true;
      },
      [](Napi::Env env, const bool& deleted) -> Napi::Value { return Napi::Boolean::New(env, deleted); });
}

// syncFilesystem(path) -> Promise<void>: syncfs(2) on the filesystem holding
// path. On btrfs this commits the transaction, which makes created snapshots
// durable.
static Napi::Value SyncFilesystem(const Napi::CallbackInfo& info) {
  std::string path = StringArg(info, 0, "path");
  return PromiseWorker<bool>::Start(
      info.Env(), "lockstep:syncFilesystem",
      [path](SystemFailure* f) {
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) return Fail(f, errno, "open", path, false);
        if (::syncfs(fd.get()) != 0) return Fail(f, errno, "syncfs", path, false);
        return true;
      },
      [](Napi::Env env, const bool&) { return env.Undefined(); });
}

// subvolumeInfo(path) -> {uuid, generation, ctransid, otransid, readonly}:
// BTRFS_IOC_GET_SUBVOL_INFO on the subvolume rooted at path. O(1) and
// unprivileged in the kernel, so it stays synchronous. ctransid moves with
// any change to the subvolume's files (it is what `btrfs send` compares),
// so a checkpoint records it for its read-only layer and verifies it before
// the layer is used again.
static Napi::Value SubvolumeInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  UniqueFd fd(OpenDir(path));
  if (!fd.valid()) {
    ThrowSystemError(env, errno, "open", path);
    return env.Undefined();
  }
  struct btrfs_ioctl_get_subvol_info_args args;
  std::memset(&args, 0, sizeof(args));
  // The kernel can return 1 on success (its last tree search's "not found"
  // leaks out); only a negative result is a failure, as in libbtrfsutil.
  if (::ioctl(fd.get(), BTRFS_IOC_GET_SUBVOL_INFO, &args) < 0) {
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_GET_SUBVOL_INFO)", path);
    return env.Undefined();
  }
  static const char kHex[] = "0123456789abcdef";
  std::string uuid;
  for (int i = 0; i < BTRFS_UUID_SIZE; i++) {
    uuid += kHex[args.uuid[i] >> 4];
    uuid += kHex[args.uuid[i] & 0xf];
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("uuid", Napi::String::New(env, uuid));
  // Transaction ids fit in a double for ~2^53 commits.
  out.Set("generation", Napi::Number::New(env, static_cast<double>(args.generation)));
  out.Set("ctransid", Napi::Number::New(env, static_cast<double>(args.ctransid)));
  out.Set("otransid", Napi::Number::New(env, static_cast<double>(args.otransid)));
  out.Set("readonly", Napi::Boolean::New(env, (args.flags & BTRFS_SUBVOL_RDONLY) != 0));
  return out;
}

void InitBtrfs(Napi::Env env, Napi::Object exports) {
  exports.Set("subvolumeInfo", Napi::Function::New(env, SubvolumeInfo));
  exports.Set("subvolumeCreate", Napi::Function::New(env, SubvolumeCreate));
  exports.Set("subvolumeSnapshot", Napi::Function::New(env, SubvolumeSnapshot));
  exports.Set("subvolumeDelete", Napi::Function::New(env, SubvolumeDelete));
  exports.Set("syncFilesystem", Napi::Function::New(env, SyncFilesystem));
}

}  // namespace lockstep
