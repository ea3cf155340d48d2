// Moving a fork's files into its own host id range (src/instances/id-shift.ts
// decides what moves where): re-owning its writable layer, and a copy of the
// checkpoint's process image owned by the fork's root group. Each verb is one
// job on a thread of its own (async_work.h, ThreadWorker) that makes every
// syscall itself: done from JS, a layer of N entries is 3N promise round
// trips and an image of 40 files 120, and forks made side by side then queue
// behind each other (and their btrfs snapshots) on libuv's four threads.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "addon.h"
#include "async_work.h"
#include "system_error.h"

namespace lockstep {

namespace {

struct Shift {
  unsigned long from, to, count;
  unsigned long Of(unsigned long id) const { return id >= from && id < from + count ? to + (id - from) : id; }
};

// Re-owns `name` in dirfd (never following a link), then its entries if it
// is a directory. chown clears set-user/group-id bits, so they are put back.
bool ShiftEntry(int dirfd, const char* name, const std::string& path, const Shift& s, SystemFailure* f) {
  struct stat st;
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Fail(f, errno, "fstatat", path, false);
  unsigned long uid = s.Of(st.st_uid), gid = s.Of(st.st_gid);
  if (uid != st.st_uid || gid != st.st_gid) {
    if (::fchownat(dirfd, name, static_cast<uid_t>(uid), static_cast<gid_t>(gid), AT_SYMLINK_NOFOLLOW) != 0)
      return Fail(f, errno, "fchownat", path, false);
    if (!S_ISLNK(st.st_mode) && (st.st_mode & 06000) != 0 && ::fchmodat(dirfd, name, st.st_mode & 07777, 0) != 0)
      return Fail(f, errno, "fchmodat", path, false);
  }
  if (!S_ISDIR(st.st_mode)) return true;
  int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Fail(f, errno, "openat", path, false);
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return Fail(f, errno, "fdopendir", path, false);
  }
  bool ok = true;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::string(e->d_name) == "." || std::string(e->d_name) == "..") continue;
    if (!ShiftEntry(::dirfd(dir), e->d_name, path + "/" + e->d_name, s, f)) {
      ok = false;
      break;
    }
    errno = 0;
  }
  if (ok && errno != 0) ok = Fail(f, errno, "readdir", path, false);
  ::closedir(dir);
  return ok;
}

// A copy of src (an open file of `size` bytes) at dest. Small files (most of
// a process image: a few hundred bytes each) are copied through a buffer,
// from the page cache; a reflink on btrfs costs more than that, but is what
// keeps a large file (pages-N.img) from being copied at all.
constexpr off_t kSmallFile = 256 << 10;

bool CopyFile(int src, int dest, off_t size, const std::string& path, SystemFailure* f) {
  if (size > kSmallFile) {
    if (::ioctl(dest, FICLONE, src) == 0) return true;
    if (errno != EOPNOTSUPP && errno != EXDEV && errno != EINVAL && errno != ENOTTY)
      return Fail(f, errno, "ioctl(FICLONE)", path, false);
  }
  static thread_local char buf[64 << 10];
  for (;;) {
    ssize_t n = ::read(src, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(f, errno, "read", path, false);
    }
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(dest, buf + done, static_cast<size_t>(n - done));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Fail(f, errno, "write", path, false);
      }
      done += w;
    }
  }
}

}  // namespace

// shiftOwners(dir, from, to, count): every entry under dir (dir included)
// whose uid or gid is in [from, from+count) moves to the same offset from
// `to`; other ids (files the host wrote) stay. Links are never followed.
static Napi::Value ShiftOwners(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string dir = StringArg(info, 0, "dir");
  for (size_t i = 1; i <= 3; i++)
    if (info.Length() <= i || !info[i].IsNumber())
      throw Napi::TypeError::New(env, "arguments 'from', 'to' and 'count' must be numbers");
  Shift s{static_cast<unsigned long>(info[1].As<Napi::Number>().Int64Value()),
          static_cast<unsigned long>(info[2].As<Napi::Number>().Int64Value()),
          static_cast<unsigned long>(info[3].As<Napi::Number>().Int64Value())};
  return ThreadWorker<bool>::Start(
      env, "lockstep:shiftOwners",
      [dir, s](SystemFailure* f) -> bool { return ShiftEntry(AT_FDCWD, dir.c_str(), dir, s, f); },
      [](Napi::Env env, const bool&) -> Napi::Value { return env.Undefined(); });
}

// cloneFolder(src, dest, gid, mode): a new folder dest (0750, owned root:gid)
// holding a copy of every file of src (links followed, as cp does; small
// files by bytes, large ones by reflink where the filesystem can), each
// owned root:gid with `mode`. Fails with EEXIST if dest exists; on failure
// the caller removes dest.
static Napi::Value CloneFolder(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string src = StringArg(info, 0, "src");
  std::string dest = StringArg(info, 1, "dest");
  if (info.Length() < 4 || !info[2].IsNumber() || !info[3].IsNumber())
    throw Napi::TypeError::New(env, "arguments 'gid' and 'mode' must be numbers");
  gid_t gid = static_cast<gid_t>(info[2].As<Napi::Number>().Int64Value());
  mode_t mode = static_cast<mode_t>(info[3].As<Napi::Number>().Uint32Value()) & 0777;
  return ThreadWorker<bool>::Start(
      env, "lockstep:cloneFolder",
      [src, dest, gid, mode](SystemFailure* f) -> bool {
        if (::mkdir(dest.c_str(), 0700) != 0) return Fail(f, errno, "mkdir", dest, false);
        int destfd = ::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (destfd < 0) return Fail(f, errno, "open", dest, false);
        UniqueFd destDir(destfd);
        DIR* dir = ::opendir(src.c_str());
        if (dir == nullptr) return Fail(f, errno, "opendir", src, false);
        bool ok = true;
        errno = 0;
        while (struct dirent* e = ::readdir(dir)) {
          std::string name = e->d_name;
          if (name == "." || name == "..") continue;
          std::string from = src + "/" + name, to = dest + "/" + name;
          UniqueFd in(::openat(::dirfd(dir), e->d_name, O_RDONLY | O_CLOEXEC));
          if (!in.valid()) {
            ok = Fail(f, errno, "openat", from, false);
            break;
          }
          UniqueFd out(::openat(destDir.get(), e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
          if (!out.valid()) {
            ok = Fail(f, errno, "openat", to, false);
            break;
          }
          struct stat st;
          if (::fstat(in.get(), &st) != 0) {
            ok = Fail(f, errno, "fstat", from, false);
            break;
          }
          if (!CopyFile(in.get(), out.get(), st.st_size, to, f)) {
            ok = false;
            break;
          }
          if (::fchown(out.get(), 0, gid) != 0 || ::fchmod(out.get(), mode) != 0) {
            ok = Fail(f, errno, "fchown", to, false);
            break;
          }
          errno = 0;
        }
        if (ok && errno != 0) ok = Fail(f, errno, "readdir", src, false);
        ::closedir(dir);
        if (!ok) return false;
        if (::fchown(destDir.get(), 0, gid) != 0 || ::fchmod(destDir.get(), 0750) != 0)
          return Fail(f, errno, "fchown", dest, false);
        return true;
      },
      [](Napi::Env env, const bool&) -> Napi::Value { return env.Undefined(); });
}

void InitOwnership(Napi::Env env, Napi::Object exports) {
  exports.Set("shiftOwners", Napi::Function::New(env, ShiftOwners));
  exports.Set("cloneFolder", Napi::Function::New(env, CloneFolder));
}

}  // namespace lockstep
