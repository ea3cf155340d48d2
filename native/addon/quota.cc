// btrfs quota groups: the disk quota of a sandbox's writable layer is a
// "max referenced" limit on the layer subvolume's level-0 qgroup, so a write
// past it fails with EDQUOT inside the sandbox. Usage is read straight from
// the quota tree (what `btrfs qgroup show` prints), without the CLI.
#include <endian.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

namespace {

int OpenDir(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }

// The subvolume id (= its level-0 qgroup id) of the subvolume rooted at fd.
bool SubvolumeId(int fd, uint64_t* id) {
  struct btrfs_ioctl_ino_lookup_args args;
  std::memset(&args, 0, sizeof(args));
  args.objectid = BTRFS_FIRST_FREE_OBJECTID;
  if (::ioctl(fd, BTRFS_IOC_INO_LOOKUP, &args) != 0) return false;
  *id = args.treeid;
  return true;
}

// One item of the quota tree, copied into out; false with errno ENOENT when
// the quota tree or the item does not exist.
bool QuotaItem(int fd, uint32_t type, uint64_t offset, void* out, size_t size) {
  struct btrfs_ioctl_search_args args;
  std::memset(&args, 0, sizeof(args));
  args.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  args.key.min_type = args.key.max_type = type;
  args.key.min_offset = args.key.max_offset = offset;
  args.key.max_transid = UINT64_MAX;
  args.key.nr_items = 1;
  if (::ioctl(fd, BTRFS_IOC_TREE_SEARCH, &args) != 0) return false;
  if (args.key.nr_items < 1) {
    errno = ENOENT;
    return false;
  }
  auto* header = reinterpret_cast<struct btrfs_ioctl_search_header*>(args.buf);
  if (header->type != type || header->offset != offset || header->len < size) {
    errno = ENOENT;
    return false;
  }
  std::memcpy(out, args.buf + sizeof(*header), size);
  return true;
}

}  // namespace

// quotaEnable(path): turns on qgroup accounting for the filesystem holding
// path (idempotent; the kernel adds a qgroup for every existing subvolume).
static Napi::Value QuotaEnable(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  UniqueFd fd(OpenDir(path));
  if (!fd.valid()) {
    ThrowSystemError(env, errno, "open", path);
    return env.Undefined();
  }
  struct btrfs_ioctl_quota_ctl_args args;
  std::memset(&args, 0, sizeof(args));
  args.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (::ioctl(fd.get(), BTRFS_IOC_QUOTA_CTL, &args) != 0)
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_QUOTA_CTL)", path);
  return env.Undefined();
}

// qgroupLimit(subvolume, maxReferencedBytes): sets (or, with 0, clears) the
// referenced-bytes limit of the subvolume's own qgroup.
static Napi::Value QgroupLimit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "subvolume");
  if (info.Length() < 2 || !info[1].IsNumber() || info[1].As<Napi::Number>().DoubleValue() < 0) {
    Napi::TypeError::New(env, "maxReferencedBytes must be a non-negative number").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  uint64_t bytes = static_cast<uint64_t>(info[1].As<Napi::Number>().Int64Value());
  UniqueFd fd(OpenDir(path));
  if (!fd.valid()) {
    ThrowSystemError(env, errno, "open", path);
    return env.Undefined();
  }
  struct btrfs_ioctl_qgroup_limit_args args;
  std::memset(&args, 0, sizeof(args));
  args.qgroupid = 0;  // 0: the qgroup of the subvolume fd is in
  args.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  args.lim.max_rfer = bytes == 0 ? UINT64_MAX : bytes;
  if (::ioctl(fd.get(), BTRFS_IOC_QGROUP_LIMIT, &args) != 0)
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_QGROUP_LIMIT)", path);
  return env.Undefined();
}

// qgroupUsage(subvolume): {referenced, exclusive, maxReferenced} as of the
// last transaction commit, or null when quotas are off for the filesystem.
static Napi::Value QgroupUsage(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "subvolume");
  UniqueFd fd(OpenDir(path));
  if (!fd.valid()) {
    ThrowSystemError(env, errno, "open", path);
    return env.Undefined();
  }
  uint64_t id = 0;
  if (!SubvolumeId(fd.get(), &id)) {
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_INO_LOOKUP)", path);
    return env.Undefined();
  }
  struct btrfs_qgroup_info_item usage;
  if (!QuotaItem(fd.get(), BTRFS_QGROUP_INFO_KEY, id, &usage, sizeof(usage))) {
    if (errno == ENOENT) return env.Null();
    ThrowSystemError(env, errno, "ioctl(BTRFS_IOC_TREE_SEARCH)", path);
    return env.Undefined();
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("referenced", Napi::Number::New(env, static_cast<double>(le64toh(usage.rfer))));
  out.Set("exclusive", Napi::Number::New(env, static_cast<double>(le64toh(usage.excl))));
  struct btrfs_qgroup_limit_item limit;
  bool limited = QuotaItem(fd.get(), BTRFS_QGROUP_LIMIT_KEY, id, &limit, sizeof(limit)) &&
                 (le64toh(limit.flags) & BTRFS_QGROUP_LIMIT_MAX_RFER) && le64toh(limit.max_rfer) != UINT64_MAX;
  out.Set("maxReferenced",
          limited ? Napi::Value(Napi::Number::New(env, static_cast<double>(le64toh(limit.max_rfer)))) : env.Null());
  return out;
}

void InitQuota(Napi::Env env, Napi::Object exports) {
  exports.Set("quotaEnable", Napi::Function::New(env, QuotaEnable));
  exports.Set("qgroupLimit", Napi::Function::New(env, QgroupLimit));
  exports.Set("qgroupUsage", Napi::Function::New(env, QgroupUsage));
}

}  // namespace lockstep
