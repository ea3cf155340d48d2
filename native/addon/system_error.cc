#include "system_error.h"

#include <unistd.h>

namespace lockstep {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string StringArg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (info.Length() <= i || !info[i].IsString()) {
    throw Napi::TypeError::New(info.Env(), std::string("argument '") + name + "' must be a string");
  }
  return info[i].As<Napi::String>().Utf8Value();
}

int IntArg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (info.Length() <= i || !info[i].IsNumber()) {
    throw Napi::TypeError::New(info.Env(), std::string("argument '") + name + "' must be a number");
  }
  return info[i].As<Napi::Number>().Int32Value();
}

bool BoolArg(const Napi::CallbackInfo& info, size_t i, bool dflt) {
  if (info.Length() <= i || info[i].IsUndefined()) return dflt;
  return info[i].ToBoolean().Value();
}

}  // namespace lockstep
