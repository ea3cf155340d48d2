// Blocking syscalls (file opens, btrfs ioctls, syncfs) run on libuv's pool,
// never on the JS thread: a sandbox must not be able to stall the manager's
// event loop. Every such verb returns a Promise (STYLE.md: AsyncWorker +
// Promise::Deferred). `work` runs on the pool and must not touch JS values;
// it reports failure through the SystemFailure it is given; `done` turns the
// plain C++ result into a JS value on the JS thread.
#pragma once

#include <napi.h>

#include <functional>
#include <thread>
#include <utility>

#include "system_error.h"

namespace lockstep {

template <typename Result>
class PromiseWorker : public Napi::AsyncWorker {
 public:
  using Work = std::function<Result(SystemFailure*)>;
  using Done = std::function<Napi::Value(Napi::Env, const Result&)>;

  static Napi::Promise Start(Napi::Env env, const char* name, Work work, Done done) {
    auto* w = new PromiseWorker(env, name, std::move(work), std::move(done));
    Napi::Promise p = w->deferred_.Promise();
    w->Queue();
    return p;
  }

 protected:
  void Execute() override { result_ = work_(&failure_); }
  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    if (failure_.failed()) {
      deferred_.Reject(MakeSystemError(env, failure_).Value());
      return;
    }
    deferred_.Resolve(done_(env, result_));
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  PromiseWorker(Napi::Env env, const char* name, Work work, Done done)
      : Napi::AsyncWorker(env, name),
        deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)),
        done_(std::move(done)) {}

  Napi::Promise::Deferred deferred_;
  Work work_;
  Done done_;
  Result result_{};
  SystemFailure failure_;
};

// The same contract on a thread of its own, for short jobs on the fork path
// (a sandbox's /dev, a layer's owners, an image copy): on libuv's pool they
// waited behind the btrfs snapshots of forks made side by side, and on the
// JS thread an ext4 journal stalled by other I/O on the host stalled the
// manager with them.
template <typename Result>
class ThreadWorker {
 public:
  using Work = std::function<Result(SystemFailure*)>;
  using Done = std::function<Napi::Value(Napi::Env, const Result&)>;

  static Napi::Promise Start(Napi::Env env, const char* name, Work work, Done done) {
    auto* job = new Job{Napi::Promise::Deferred::New(env), std::move(work), std::move(done), Result{}, {}};
    Napi::Promise p = job->deferred.Promise();
    auto tsfn =
        Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), name, 0, 1);
    std::thread([job, tsfn]() mutable {
      job->result = job->work(&job->failure);
      tsfn.BlockingCall(job, [](Napi::Env env, Napi::Function, Job* j) {
        Napi::HandleScope scope(env);
        if (j->failure.failed())
          j->deferred.Reject(MakeSystemError(env, j->failure).Value());
        else
          j->deferred.Resolve(j->done(env, j->result));
        delete j;
      });
      tsfn.Release();
    }).detach();
    return p;
  }

 private:
  struct Job {
    Napi::Promise::Deferred deferred;
    Work work;
    Done done;
    Result result;
    SystemFailure failure;
  };
};

// Records errno for the JS side; returns `ret` so callers can `return Fail(...)`.
template <typename T>
T Fail(SystemFailure* f, int err, const char* syscall, const std::string& path, T ret) {
  f->err = err;
  f->syscall = syscall;
  f->path = path;
  return ret;
}

}  // namespace lockstep
