// Mount verbs: overlayfs for a sandbox root, and unmount. Both are single
// syscalls that affect the whole process's mount namespace, so they are safe
// to call from Node's main thread (unlike unshare/setns, which the helper does).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <string>
#include <thread>
#include <vector>

#include "addon.h"
#include "async_work.h"
#include "system_error.h"

extern "C" {
#include "../helper/dev-folder.h"
}

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

std::string OverlayOptions(const std::vector<std::string>& lowers, const std::string& upper, const std::string& work) {
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
  // overlayfs shows each layer in /proc/<pid>/mountinfo as the string it was
  // given, and a sandbox reads its own root's: a layer named through a
  // descriptor of this process shows as /proc/self/fd/N, which says nothing
  // of the host's paths. The descriptors only live for the mount call.
  std::vector<int> fds;
  auto close_all = [&fds]() {
    for (int fd : fds) ::close(fd);
  };
  auto by_fd = [&](const std::string& path, std::string* out) {
    int fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    fds.push_back(fd);
    *out = "/proc/self/fd/" + std::to_string(fd);
    return true;
  };
  std::vector<std::string> lower_refs(lowers.size());
  std::string upper_ref, work_ref;
  for (size_t i = 0; i < lowers.size(); i++)
    if (!by_fd(lowers[i], &lower_refs[i])) {
      int saved = errno;
      close_all();
      ThrowSystemError(env, saved, "open(overlay lower)", lowers[i]);
      return env.Undefined();
    }
  if (!by_fd(upper, &upper_ref) || !by_fd(work, &work_ref)) {
    int saved = errno;
    close_all();
    ThrowSystemError(env, saved, "open(overlay upper/work)", upper_ref.empty() ? upper : work);
    return env.Undefined();
  }
  std::string opts = OverlayOptions(lower_refs, upper_ref, work_ref);
  int rc = ::mount("overlay", target.c_str(), "overlay", MS_NOSUID | MS_NODEV, opts.c_str());
  int saved = errno;
  close_all();
  if (rc != 0) {
    ThrowSystemError(env, saved, "mount(overlay)", target);
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

// mountTmpfs(path, options): a tmpfs on path (nosuid), with mount options
// such as "mode=0700,size=64m".
static Napi::Value MountTmpfs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  std::string options = StringArg(info, 1, "options");
  if (::mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID, options.c_str()) != 0) {
    ThrowSystemError(env, errno, "mount(tmpfs)", path);
  }
  return env.Undefined();
}

namespace {

// A user namespace whose ids 0..count-1 are host ids base..base+count-1,
// made only to describe an idmapped mount (the mount keeps its own
// reference). As lxc and systemd do: a child born in a new user namespace
// waits while we write its maps and open its namespace, then is killed. The
// child shares our memory (CLONE_VM: copying Node's page tables cost tens of
// milliseconds) and our descriptor table (CLONE_FILES), and runs only
// IdmapChild on a stack of its own: raw pause, nothing that touches the C
// library's state.
//
// Sharing the table matters: a child with a copy of it holds every
// descriptor open at the moment of the clone, sandbox locks and the gates of
// other such children made at once on libuv's pool included. Two children
// that each waited for EOF on a pipe the other held a copy of never exited,
// and the sandbox locks they had copies of stayed taken: SANDBOX_BUSY for
// every later call on those sandboxes (concurrency.test, under load).
//
// Sharing it also means the child keeps the whole table alive if we die
// before we kill it: a manager SIGKILLed between the clone and the kill
// below left the child paused for good, orphaned to pid 1, holding the dead
// manager's stdout pipe (its parent waited for EOF forever: the random-kill
// test hung 20 min), its state directory's lock and its sandbox locks. So
// the child asks for SIGKILL when the thread that made it exits (every
// thread of a killed manager does), and exits at once if that thread is
// already gone (it was re-parented before the request took effect).
constexpr size_t kIdmapChildStack = 64 * 1024;

int IdmapChild(void* arg) {
  const pid_t parent = *static_cast<const pid_t*>(arg);
  ::syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (::syscall(SYS_getppid) != parent) ::syscall(SYS_exit, 0);
  for (;;) ::syscall(SYS_pause);  // until SIGKILL
  return 0;
}

int MakeIdmapUserns(unsigned long base, unsigned long count, SystemFailure* failure) {
  // The child's stack lives until it is reaped.
  auto* stack = new char[kIdmapChildStack];
  // Read by the child (CLONE_VM) before it can pause: this frame outlives that.
  pid_t parent = ::getpid();
  int pid = ::clone(IdmapChild, stack + kIdmapChildStack, CLONE_VM | CLONE_FILES | CLONE_NEWUSER | SIGCHLD, &parent);
  if (pid < 0) {
    *failure = {errno, "clone(CLONE_NEWUSER)", "", ""};
    delete[] stack;
    return -1;
  }
  int nsfd = -1;
  std::string line = "0 " + std::to_string(base) + " " + std::to_string(count) + "\n";
  for (const char* file : {"uid_map", "gid_map"}) {
    std::string path = "/proc/" + std::to_string(pid) + "/" + file;
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid() || ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      *failure = {errno, "write", path, ""};
      goto done;
    }
  }
  {
    std::string path = "/proc/" + std::to_string(pid) + "/ns/user";
    nsfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) *failure = {errno, "open", path, ""};
  }
done:
  // Not reaped yet, so the pid is still this child's.
  ::kill(pid, SIGKILL);
  // It dies once scheduled, which on a busy host can take tens of
  // milliseconds: reap it (and free its stack) on a thread of its own.
  std::thread([pid, stack]() {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    delete[] stack;
  }).detach();
  return nsfd;
}

}  // namespace

// idmappedMounts([[source, target], ...], base, count, readOnly): attaches
// at each target a copy of the mount of its source through which on-disk id
// N reads as host id base+N (open_tree(OPEN_TREE_CLONE) +
// mount_setattr(MOUNT_ATTR_IDMAP) + move_mount). Image layers stay shared:
// nothing is copied or chowned. One user namespace describes all of them,
// and the work runs on libuv's pool: forks made side by side do not queue
// behind each other's namespace set-up on the JS thread. Resolves once every
// target is mounted; on failure the targets mounted so far are detached.
static Napi::Value IdmappedMounts(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsArray())
    throw Napi::TypeError::New(env, "argument 'mounts' must be an array of [source, target] pairs");
  Napi::Array list = info[0].As<Napi::Array>();
  std::vector<std::pair<std::string, std::string>> mounts;
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsArray() || v.As<Napi::Array>().Length() != 2)
      throw Napi::TypeError::New(env, "each mount must be a [source, target] pair");
    Napi::Array pair = v.As<Napi::Array>();
    if (!pair.Get(0u).IsString() || !pair.Get(1u).IsString())
      throw Napi::TypeError::New(env, "mount source and target must be strings");
    mounts.emplace_back(pair.Get(0u).As<Napi::String>().Utf8Value(), pair.Get(1u).As<Napi::String>().Utf8Value());
  }
  if (info.Length() < 3 || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "arguments 'base' and 'count' must be numbers");
  unsigned long base = static_cast<unsigned long>(info[1].As<Napi::Number>().Int64Value());
  unsigned long count = static_cast<unsigned long>(info[2].As<Napi::Number>().Int64Value());
  bool readOnly = BoolArg(info, 3, true);
  return PromiseWorker<bool>::Start(
      env, "lockstep:idmappedMounts",
      [mounts, base, count, readOnly](SystemFailure* f) -> bool {
        UniqueFd userns(MakeIdmapUserns(base, count, f));
        if (!userns.valid()) return false;
        std::vector<std::string> done;
        auto undo = [&done]() {
          for (const auto& t : done) ::umount2(t.c_str(), MNT_DETACH);
        };
        for (const auto& [source, target] : mounts) {
          UniqueFd tree(static_cast<int>(
              ::syscall(SYS_open_tree, AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
          if (!tree.valid()) {
            undo();
            return Fail(f, errno, "open_tree", source, false);
          }
          struct mount_attr attr = {};
          attr.attr_set = MOUNT_ATTR_IDMAP | (readOnly ? MOUNT_ATTR_RDONLY : 0) | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
          attr.userns_fd = static_cast<__u64>(userns.get());
          if (::syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof(attr)) != 0) {
            undo();
            return Fail(f, errno, "mount_setattr(MOUNT_ATTR_IDMAP)", source, false);
          }
          if (::syscall(SYS_move_mount, tree.get(), "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
            undo();
            return Fail(f, errno, "move_mount", target, false);
          }
          done.push_back(target);
        }
        return true;
      },
      [](Napi::Env env, const bool&) -> Napi::Value { return env.Undefined(); });
}

// makeDevFolder(dir): the device nodes, links and mount points of a
// sandbox's /dev (native/helper/dev-folder.h, which the helper's create verb
// uses too), on a thread of its own (async_work.h, ThreadWorker). A restored
// sandbox (fork, warm standby) needs only this folder before CRIU runs;
// making it here rather than in a helper spawned by the supervisor saves a
// fork and exec per restore.
static Napi::Value MakeDevFolder(const Napi::CallbackInfo& info) {
  std::string dir = StringArg(info, 0, "dir");
  return ThreadWorker<bool>::Start(
      info.Env(), "lockstep:makeDevFolder",
      [dir](SystemFailure* f) -> bool {
        struct lockstep_dev_failure why = {};
        if (lockstep_prepare_dev(dir.c_str(), &why) != 0) return Fail(f, why.err, why.syscall, why.path, false);
        return true;
      },
      [](Napi::Env env, const bool&) -> Napi::Value { return env.Undefined(); });
}

void InitMounts(Napi::Env env, Napi::Object exports) {
  exports.Set("makeDevFolder", Napi::Function::New(env, MakeDevFolder));
  exports.Set("idmappedMounts", Napi::Function::New(env, IdmappedMounts));
  exports.Set("makeSharedMount", Napi::Function::New(env, MakeSharedMount));
  exports.Set("mountTmpfs", Napi::Function::New(env, MountTmpfs));
  exports.Set("mountOverlay", Napi::Function::New(env, MountOverlay));
  exports.Set("unmount", Napi::Function::New(env, Unmount));
  exports.Set("filesystemType", Napi::Function::New(env, FilesystemType));
}

}  // namespace lockstep
