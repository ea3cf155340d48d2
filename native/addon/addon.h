#pragma once
#include <napi.h>

#include <cstdint>

namespace lockstep {
void InitMounts(Napi::Env env, Napi::Object exports);
void InitBtrfs(Napi::Env env, Napi::Object exports);
void InitFiles(Napi::Env env, Napi::Object exports);
void InitLocks(Napi::Env env, Napi::Object exports);
void InitCriu(Napi::Env env, Napi::Object exports);
void InitPidWatch(Napi::Env env, Napi::Object exports);
void InitPidfd(Napi::Env env, Napi::Object exports);
void InitQuota(Napi::Env env, Napi::Object exports);
void InitNetns(Napi::Env env, Napi::Object exports);
void InitOwnership(Napi::Env env, Napi::Object exports);

// Start time (clock ticks since boot, field 22 of /proc/<pid>/stat) and
// state (field 3) of pid; false if it is gone (pidwatch.cc).
bool ReadStartTime(int pid, uint64_t* start, char* state);
}  // namespace lockstep
