#pragma once
#include <napi.h>

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
}  // namespace lockstep
