// Path resolution inside a sandbox root that can never escape it, and that
// never opens anything but a regular file or a directory.
//
// A caller's path (even "../../etc/shadow", or a symlink the sandbox planted
// that points at "/" or outside) is resolved by the kernel with
// openat2(RESOLVE_BENEATH): anything that would leave the root fails with
// EXDEV instead of being followed. The leaf is first opened O_PATH|O_NOFOLLOW
// and fstat'ed: O_PATH runs no driver open, so a FIFO (whose open or read
// would block forever), a device node or a socket is only ever looked at,
// and a symlink leaf is reported, not followed. Only a regular file or a
// directory is then reopened for I/O through /proc/self/fd (the same inode:
// the sandbox cannot swap it in between), O_NONBLOCK so that a lease a
// sandbox process holds makes the open fail instead of waiting.
//
// All of it runs on libuv's pool (async_work.h); the fd is handed to Node's
// fs.promises, which does the I/O there too.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "addon.h"
#include "async_work.h"
#include "system_error.h"

namespace lockstep {

namespace {

constexpr __u64 kResolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

int OpenAt2(int dirfd, const std::string& rel, __u64 flags, __u64 mode) {
  struct open_how how = {};
  how.flags = flags | O_CLOEXEC;
  how.mode = mode;
  how.resolve = kResolve;
  const char* p = rel.empty() ? "." : rel.c_str();
  // EAGAIN: a ".." met a concurrent rename or mount anywhere on the host, and
  // the kernel could not prove it stayed beneath (openat2(2) says to retry).
  // A leased file opened O_NONBLOCK answers EAGAIN too, every time: after
  // the retries it is reported as such (FILE_BUSY).
  int fd = -1;
  for (int attempt = 0; attempt < 16; attempt++) {
    fd = static_cast<int>(::syscall(SYS_openat2, dirfd, p, &how, sizeof(how)));
    if (fd >= 0 || errno != EAGAIN) break;
  }
  return fd;
}

const char* TypeName(mode_t m) {
  switch (m & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "character-device";
    case S_IFBLK:
      return "block-device";
    default:
      return "unknown";
  }
}

struct Opened {
  int fd = -1;
  std::string type;
  double size = 0;
  int mode = 0;
  int uid = 0;
  int gid = 0;
};

Napi::Value OpenedValue(Napi::Env env, const Opened& o) {
  Napi::Object r = Napi::Object::New(env);
  r.Set("fd", Napi::Number::New(env, o.fd));
  r.Set("type", Napi::String::New(env, o.type));
  r.Set("size", Napi::Number::New(env, o.size));
  r.Set("mode", Napi::Number::New(env, o.mode));
  r.Set("uid", Napi::Number::New(env, o.uid));
  r.Set("gid", Napi::Number::New(env, o.gid));
  return r;
}

}  // namespace

// openBeneathSync(root, relativePath, flags, mode) -> fd: for the image
// importer, which unpacks an archive step by step before any sandbox exists.
static Napi::Value OpenBeneathSync(const Napi::CallbackInfo& info) {
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
  bool creates = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
  int fd = OpenAt2(rootFd.get(), rel, static_cast<__u64>(flags), creates ? static_cast<__u64>(mode) : 0);
  if (fd < 0) {
    ThrowSystemError(env, errno, "openat2", rel);
    return env.Undefined();
  }
  return Napi::Number::New(env, fd);
}

// openBeneath(root, relativePath, flags, mode) -> Promise<fd>: a plain
// openat2 below root (directories, exclusive creation of new files, O_PATH
// probes). Callers add O_NOFOLLOW where the leaf must not be followed.
static Napi::Value OpenBeneath(const Napi::CallbackInfo& info) {
  std::string root = StringArg(info, 0, "root");
  std::string rel = StringArg(info, 1, "path");
  int flags = IntArg(info, 2, "flags");
  int mode = info.Length() > 3 && info[3].IsNumber() ? info[3].As<Napi::Number>().Int32Value() : 0;
  return PromiseWorker<int>::Start(
      info.Env(), "lockstep:openBeneath",
      [root, rel, flags, mode](SystemFailure* f) {
        UniqueFd rootFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!rootFd.valid()) return Fail(f, errno, "open", root, -1);
        bool creates = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
        int fd = OpenAt2(rootFd.get(), rel, static_cast<__u64>(flags), creates ? static_cast<__u64>(mode) : 0);
        if (fd < 0) return Fail(f, errno, "openat2", rel, -1);
        return fd;
      },
      [](Napi::Env env, const int& fd) -> Napi::Value { return Napi::Number::New(env, fd); });
}

// openChecked(root, relativePath, flags) -> Promise<{fd, type, size, mode, uid, gid}>.
// fd is -1 (and nothing was opened for I/O) unless the leaf is a regular
// file, or a directory when flags has O_DIRECTORY. A symlink leaf whose
// target would leave the root fails with EXDEV, like any other escape.
static Napi::Value OpenChecked(const Napi::CallbackInfo& info) {
  std::string root = StringArg(info, 0, "root");
  std::string rel = StringArg(info, 1, "path");
  int flags = IntArg(info, 2, "flags");
  return PromiseWorker<Opened>::Start(
      info.Env(), "lockstep:openChecked",
      [root, rel, flags](SystemFailure* f) {
        Opened o;
        UniqueFd rootFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!rootFd.valid()) return Fail(f, errno, "open", root, o);
        UniqueFd leaf(OpenAt2(rootFd.get(), rel, O_PATH | O_NOFOLLOW, 0));
        if (!leaf.valid()) return Fail(f, errno, "openat2", rel, o);
        struct stat st;
        if (::fstat(leaf.get(), &st) != 0) return Fail(f, errno, "fstat", rel, o);
        o.type = TypeName(st.st_mode);
        o.size = static_cast<double>(st.st_size);
        o.mode = static_cast<int>(st.st_mode & 07777);
        o.uid = static_cast<int>(st.st_uid);
        o.gid = static_cast<int>(st.st_gid);
        if (S_ISLNK(st.st_mode)) {
          // Not followed either way; an escaping target is reported as the
          // escape it is, so callers see one error for "leads outside".
          UniqueFd target(OpenAt2(rootFd.get(), rel, O_PATH, 0));
          if (!target.valid() && errno == EXDEV) return Fail(f, EXDEV, "openat2", rel, o);
          return o;
        }
        bool wantDir = (flags & O_DIRECTORY) != 0;
        if (wantDir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) return o;
        std::string self = "/proc/self/fd/" + std::to_string(leaf.get());
        int fd = ::open(self.c_str(), (flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) return Fail(f, errno, "open", rel, o);
        o.fd = fd;
        return o;
      },
      OpenedValue);
}

// openFifoWriter(root, relativePath) -> Promise<fd>: the write end of a FIFO
// below root, for feeding an interactive process's relay (lockstep-relay.c).
// The leaf is checked on an O_PATH descriptor first, like openChecked, so a
// regular file, a device or a symlink planted there is never opened
// (ENOTSUP); the reopen is O_NONBLOCK, so it fails with ENXIO instead of
// waiting when no process reads the FIFO.
static Napi::Value OpenFifoWriter(const Napi::CallbackInfo& info) {
  std::string root = StringArg(info, 0, "root");
  std::string rel = StringArg(info, 1, "path");
  return PromiseWorker<int>::Start(
      info.Env(), "lockstep:openFifoWriter",
      [root, rel](SystemFailure* f) {
        UniqueFd rootFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!rootFd.valid()) return Fail(f, errno, "open", root, -1);
        UniqueFd leaf(OpenAt2(rootFd.get(), rel, O_PATH | O_NOFOLLOW, 0));
        if (!leaf.valid()) return Fail(f, errno, "openat2", rel, -1);
        struct stat st;
        if (::fstat(leaf.get(), &st) != 0) return Fail(f, errno, "fstat", rel, -1);
        if (!S_ISFIFO(st.st_mode)) return Fail(f, ENOTSUP, "fstat", rel, -1);
        std::string self = "/proc/self/fd/" + std::to_string(leaf.get());
        int fd = ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) return Fail(f, errno, "open", rel, -1);
        return fd;
      },
      [](Napi::Env env, const int& fd) -> Napi::Value { return Napi::Number::New(env, fd); });
}

void InitFiles(Napi::Env env, Napi::Object exports) {
  exports.Set("openBeneath", Napi::Function::New(env, OpenBeneath));
  exports.Set("openBeneathSync", Napi::Function::New(env, OpenBeneathSync));
  exports.Set("openChecked", Napi::Function::New(env, OpenChecked));
  exports.Set("openFifoWriter", Napi::Function::New(env, OpenFifoWriter));
  Napi::Object flags = Napi::Object::New(env);
  flags.Set("O_PATH", Napi::Number::New(env, O_PATH));
  flags.Set("O_DIRECTORY", Napi::Number::New(env, O_DIRECTORY));
  flags.Set("O_NOFOLLOW", Napi::Number::New(env, O_NOFOLLOW));
  flags.Set("O_NONBLOCK", Napi::Number::New(env, O_NONBLOCK));
  exports.Set("openFlags", flags);
}

}  // namespace lockstep
