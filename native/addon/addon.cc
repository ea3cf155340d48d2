// Entry point of lockstep.node: thin, syscall-sized verbs. Policy, ordering
// and state live in TypeScript (src/); see src/native/binding.ts for the
// typed surface.
#include "addon.h"

namespace lockstep {

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  InitMounts(env, exports);
  InitBtrfs(env, exports);
  InitFiles(env, exports);
  InitLocks(env, exports);
  InitCriu(env, exports);
  InitPidWatch(env, exports);
  InitPidfd(env, exports);
  InitQuota(env, exports);
  InitNetns(env, exports);
  InitOwnership(env, exports);
  return exports;
}

NODE_API_MODULE(lockstep, Init)

}  // namespace lockstep
