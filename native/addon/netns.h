#pragma once
#include <string>

#include "system_error.h"

namespace lockstep {

// The sandbox side of an egress sandbox's veth pair, as it is still named in
// the root namespace, and the /31 it gets inside (address and gateway).
struct VethConfig {
  std::string peer;
  std::string address;
  std::string gateway;
  int prefixLength = 31;
};

// Moves cfg.peer into pid's network namespace and configures it as eth0
// there; leaves the calling thread in that namespace (call it on a thread
// that exits afterwards). -1 with *failure filled on error.
int AttachVeth(int pid, const VethConfig& cfg, SystemFailure* failure);

}  // namespace lockstep
