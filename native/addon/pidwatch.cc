// PidWatcher: tells JavaScript when a watched process exits. A pidfd becomes
// readable when its process exits; one dedicated thread waits on an epoll
// set of pidfds and calls back through a ThreadSafeFunction, so neither the
// event loop nor libuv's small thread pool is ever parked on a wait.
//
// watch() also settles identity: it takes the pidfd first, then reads the
// start time from /proc/<pid>, then checks the pidfd's process still runs. A
// running process keeps its pid, so the start time read in between is that
// process's, never a later holder's.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

bool ReadStartTime(int pid, uint64_t* start, char* state) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char buf[1024];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and ')': count from the last ')'.
  char* p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return false;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (!p) return false;
    p++;
  }
  *start = strtoull(p, nullptr, 10);
  return true;
}

namespace {

Napi::Error SystemErrorNow(Napi::Env env, const char* syscall) {
  return MakeSystemError(env, SystemFailure{errno, syscall, "", ""});
}

bool Exited(int pidfd) {
  struct pollfd p = {pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

class PidWatcher : public Napi::ObjectWrap<PidWatcher> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "PidWatcher",
                       {InstanceMethod("watch", &PidWatcher::Watch), InstanceMethod("unwatch", &PidWatcher::Unwatch),
                        InstanceMethod("close", &PidWatcher::Close)});
  }

  explicit PidWatcher(const Napi::CallbackInfo& info) : Napi::ObjectWrap<PidWatcher>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsFunction()) {
      Napi::TypeError::New(env, "PidWatcher(onExit): onExit must be a function").ThrowAsJavaScriptException();
      return;
    }
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) throw SystemErrorNow(env, "epoll_create1");
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) throw SystemErrorNow(env, "eventfd");
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;  // watch ids start at 1: 0 is the wake-up eventfd
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) throw SystemErrorNow(env, "epoll_ctl");
    tsfn_ = Napi::ThreadSafeFunction::New(env, info[0].As<Napi::Function>(), "lockstep-pidwatch", 0, 1);
    // A watcher must not keep the process alive: sandboxes outlive the manager.
    tsfn_.Unref(env);
    thread_ = std::thread([this] { Loop(); });
  }

  ~PidWatcher() override { Stop(); }

 private:
  // watch(pid, expectedStart?) -> { id, start } | null (gone, a zombie, or another process now).
  Napi::Value Watch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int pid = IntArg(info, 0, "pid");
    if (env.IsExceptionPending()) return env.Undefined();
    bool check = info.Length() > 1 && info[1].IsNumber();
    uint64_t expected = check ? static_cast<uint64_t>(info[1].As<Napi::Number>().Int64Value()) : 0;
    if (stopped_) {
      ThrowSystemError(env, EBADF, "pidwatch(closed)");
      return env.Undefined();
    }
    if (pid <= 0) return env.Null();
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid()) {
      if (PidfdOpenFoundNoProcess(errno)) return env.Null();
      ThrowSystemError(env, errno, "pidfd_open");
      return env.Undefined();
    }
    uint64_t start = 0;
    char state = '?';
    if (!ReadStartTime(pid, &start, &state) || state == 'Z' || state == 'X' || (check && start != expected) ||
        Exited(pidfd.get())) {
      return env.Null();
    }
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = next_id_++;
      struct epoll_event ev = {};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd.get(), &ev) != 0) {
        ThrowSystemError(env, errno, "epoll_ctl");
        return env.Undefined();
      }
      fds_.emplace(id, pidfd.release());
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("id", Napi::Number::New(env, static_cast<double>(id)));
    out.Set("start", Napi::Number::New(env, static_cast<double>(start)));
    return out;
  }

  // unwatch(id): no callback for it after this returns (one already queued is for an id JS has forgotten).
  Napi::Value Unwatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint64_t id =
        static_cast<uint64_t>(info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().Int64Value() : 0);
    Forget(id);
    return env.Undefined();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Stop();
    return info.Env().Undefined();
  }

  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fds_.find(id);
    if (it == fds_.end()) return;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second, nullptr);
    ::close(it->second);
    fds_.erase(it);
  }

  // Idempotent: wakes the thread, joins it, closes every pidfd, lets the callback go.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    if (thread_.joinable()) {
      uint64_t one = 1;
      ssize_t w = ::write(wake_.get(), &one, sizeof(one));
      (void)w;
      thread_.join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, fd] : fds_) ::close(fd);
    fds_.clear();
    if (tsfn_) tsfn_.Release();
  }

  void Loop() {
    struct epoll_event events[32];
    for (;;) {
      int n = ::epoll_wait(epoll_.get(), events, 32, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;
      }
      for (int i = 0; i < n; i++) {
        uint64_t id = events[i].data.u64;
        if (id == 0) return;  // Stop()
        {
          // Only once per id: the pidfd stays readable, so it leaves the set now.
          std::lock_guard<std::mutex> lock(mu_);
          auto it = fds_.find(id);
          if (it == fds_.end()) continue;
          ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second, nullptr);
          ::close(it->second);
          fds_.erase(it);
        }
        auto* boxed = new uint64_t(id);
        napi_status s = tsfn_.NonBlockingCall(boxed, [](Napi::Env env, Napi::Function fn, uint64_t* data) {
          double value = static_cast<double>(*data);
          delete data;
          if (env != nullptr && fn != nullptr) fn.Call({Napi::Number::New(env, value)});
        });
        if (s != napi_ok) delete boxed;
      }
    }
  }

  UniqueFd epoll_;
  UniqueFd wake_;
  Napi::ThreadSafeFunction tsfn_;
  std::thread thread_;
  std::mutex mu_;
  std::unordered_map<uint64_t, int> fds_;
  uint64_t next_id_ = 1;
  bool stopped_ = false;
};

void InitPidWatch(Napi::Env env, Napi::Object exports) { exports.Set("PidWatcher", PidWatcher::Define(env)); }

}  // namespace lockstep
