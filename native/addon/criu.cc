// CRIU through its RPC protocol, via libcriu (the library CRIU ships for
// exactly this; runc and crun speak the same protocol). Calls go to a
// long-lived `criu service` socket when one is given, which skips criu's exec
// and its kernel-feature probe on every call, or else to `criu swrk` started
// per call.
//
// A dump or restore blocks until CRIU replies, so each call runs on a thread
// of its own and settles its promise through a ThreadSafeFunction: libuv's
// small thread pool is never parked on it.
#include <criu.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "addon.h"
#include "netns.h"
#include "system_error.h"

namespace lockstep {

namespace {

struct CriuRequest {
  std::string op;
  std::string serviceAddress;
  std::string serviceBinary;
  std::string imagesDir;
  std::string workDir;
  std::string logFile = "criu.log";
  int logLevel = 2;
  int pid = 0;
  bool leaveRunning = false;
  bool tcpEstablished = false;
  bool extUnixSk = false;
  bool fileLocks = true;
  bool linkRemap = false;
  bool shellJob = false;
  bool orphanPtsMaster = false;
  bool manageCgroups = false;
  int manageCgroupsMode = -1;
  int networkLock = 0;
  std::string root;
  std::string freezeCgroup;
  std::vector<std::pair<std::string, std::string>> cgRoots;
  std::vector<std::pair<std::string, std::string>> extMounts;
  std::vector<std::string> externals;
  std::vector<std::string> skipMounts;
  std::vector<std::string> enableFs;
  std::vector<std::string> cgroupProcs;  // restore: cgroup.procs files the new root task joins
  bool emptyNetns = false;               // the network namespace holds only loopback: not dumped, made anew
  bool tcpClose = false;                 // established TCP sockets are dumped as they are and restored closed
  bool trackMem = false;                 // dump: keep tracking written pages for the next dump (patched CRIU)
  std::string parentImg;                 // dump: the previous dump's images, relative to imagesDir ("../ID")
  std::string configFile;                // a CRIU configuration file (options RPC has no field for)
  bool hasVeth = false;                  // restore: an egress sandbox's eth0 is moved in at setup-namespaces
  VethConfig veth;
};

struct CriuResult {
  int ret = 0;
  SystemFailure failure;
};

struct CriuCall {
  CriuRequest req;
  CriuResult result;
  Napi::Promise::Deferred deferred;
  explicit CriuCall(Napi::Env env) : deferred(Napi::Promise::Deferred::New(env)) {}
};

std::string GetString(const Napi::Object& o, const char* key, const std::string& dflt = "") {
  Napi::Value v = o.Get(key);
  return v.IsString() ? v.As<Napi::String>().Utf8Value() : dflt;
}

bool GetBool(const Napi::Object& o, const char* key, bool dflt) {
  Napi::Value v = o.Get(key);
  return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : dflt;
}

int GetInt(const Napi::Object& o, const char* key, int dflt) {
  Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().Int32Value() : dflt;
}

std::vector<std::pair<std::string, std::string>> GetPairs(const Napi::Object& o, const char* key) {
  std::vector<std::pair<std::string, std::string>> out;
  Napi::Value v = o.Get(key);
  if (!v.IsArray()) return out;
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Value e = a.Get(i);
    if (!e.IsArray()) continue;
    Napi::Array p = e.As<Napi::Array>();
    if (p.Length() != 2) continue;
    out.emplace_back(p.Get(0u).ToString().Utf8Value(), p.Get(1u).ToString().Utf8Value());
  }
  return out;
}

std::vector<std::string> GetStrings(const Napi::Object& o, const char* key) {
  std::vector<std::string> out;
  Napi::Value v = o.Get(key);
  if (!v.IsArray()) return out;
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) out.push_back(a.Get(i).ToString().Utf8Value());
  return out;
}

// CRIU's notify callback has no user-data argument; each call runs on its own
// thread, so the request it belongs to is kept in a thread_local.
thread_local const CriuRequest* tl_request = nullptr;
thread_local int tl_notify_errno = 0;
thread_local SystemFailure tl_notify_failure;

// At "setup-namespaces" the restored root task exists but has not forked the
// rest of the tree yet: moving it into the sandbox's cgroups here puts every
// restored process there, without CRIU dumping or restoring cgroup state
// (which costs tens of milliseconds per call).
// Brings loopback up in the network namespace of pid. Runs on the call's own
// thread, which exits afterwards, so its setns never leaks into Node.
int LoopbackUp(int pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd ns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid() || ::setns(ns.get(), CLONE_NEWNET) != 0) return -1;
  UniqueFd sk(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sk.valid()) return -1;
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  return ::ioctl(sk.get(), SIOCSIFFLAGS, &ifr);
}

int OnNotify(char* action, criu_notify_arg_t na) {
  if (tl_request == nullptr || std::string(action) != "setup-namespaces") return 0;
  int pid = criu_notify_pid(na);
  // The sandbox's network is loopback only, so instead of CRIU dumping and
  // restoring it (which runs ip and iptables-save several times), restore
  // makes an empty namespace and we bring loopback up before sockets are
  // restored into it.
  // An egress sandbox gets its eth0 (and loopback) here, before sockets
  // bound to its address are restored (netns.cc).
  if (tl_request->hasVeth) {
    if (AttachVeth(pid, tl_request->veth, &tl_notify_failure) != 0) {
      tl_notify_errno = tl_notify_failure.err ? tl_notify_failure.err : EIO;
      return -1;
    }
  } else if (tl_request->emptyNetns && LoopbackUp(pid) != 0) {
    tl_notify_errno = errno;
    return -1;
  }
  std::string line = std::to_string(pid) + "\n";
  for (const auto& procs : tl_request->cgroupProcs) {
    UniqueFd fd(::open(procs.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid() || ::write(fd.get(), line.data(), line.size()) < 0) {
      tl_notify_errno = errno;
      return -1;
    }
  }
  return 0;
}

// Runs on the call's own thread: plain C++ only, no JS values.
void RunCriu(const CriuRequest& req, CriuResult* res) {
  criu_opts* opts = nullptr;
  if (criu_local_init_opts(&opts) < 0) {
    res->failure = {ENOMEM, "criu_local_init_opts", "", ""};
    return;
  }
  std::unique_ptr<criu_opts, void (*)(criu_opts*)> guard(opts, criu_local_free_opts);
  if (!req.serviceAddress.empty()) {
    criu_local_set_service_address(opts, req.serviceAddress.c_str());
  } else if (!req.serviceBinary.empty()) {
    criu_local_set_service_binary(opts, req.serviceBinary.c_str());
  }

  if (req.op == "version") {
    res->ret = criu_local_get_version(opts);
    if (res->ret < 0) res->failure = {-res->ret, "criu_local_get_version", req.serviceAddress, ""};
    return;
  }
  if (req.op == "check") {
    res->ret = criu_local_check(opts);
    if (res->ret < 0) res->failure = {-res->ret, "criu_local_check", req.serviceAddress, ""};
    return;
  }

  UniqueFd images(::open(req.imagesDir.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!images.valid()) {
    res->failure = {errno, "open", req.imagesDir, ""};
    return;
  }
  UniqueFd work;
  criu_local_set_images_dir_fd(opts, images.get());
  if (!req.workDir.empty()) {
    work.reset(::open(req.workDir.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
    if (!work.valid()) {
      res->failure = {errno, "open", req.workDir, ""};
      return;
    }
    criu_local_set_work_dir_fd(opts, work.get());
  }
  criu_local_set_log_file(opts, req.logFile.c_str());
  if (!req.configFile.empty()) criu_local_set_config_file(opts, req.configFile.c_str());
  criu_local_set_log_level(opts, req.logLevel);
  criu_local_set_tcp_established(opts, req.tcpEstablished);
  if (req.tcpClose) criu_local_set_tcp_close(opts, true);
  criu_local_set_ext_unix_sk(opts, req.extUnixSk);
  criu_local_set_file_locks(opts, req.fileLocks);
  criu_local_set_link_remap(opts, req.linkRemap);
  criu_local_set_shell_job(opts, req.shellJob);
  criu_local_set_orphan_pts_master(opts, req.orphanPtsMaster);
  if (req.manageCgroups) criu_local_set_manage_cgroups(opts, true);
  if (req.manageCgroupsMode >= 0)
    criu_local_set_manage_cgroups_mode(opts, static_cast<enum criu_cg_mode>(req.manageCgroupsMode));
  if (req.networkLock > 0)
    criu_local_set_network_lock(opts, static_cast<enum criu_network_lock_method>(req.networkLock));
  if (!req.root.empty()) criu_local_set_root(opts, req.root.c_str());
  if (!req.freezeCgroup.empty()) criu_local_set_freeze_cgroup(opts, req.freezeCgroup.c_str());
  for (const auto& cg : req.cgRoots)
    criu_local_add_cg_root(opts, cg.first.empty() ? nullptr : cg.first.c_str(), cg.second.c_str());
  for (const auto& m : req.extMounts) criu_local_add_ext_mount(opts, m.first.c_str(), m.second.c_str());
  for (const auto& e : req.externals) criu_local_add_external(opts, e.c_str());
  for (const auto& s : req.skipMounts) criu_local_add_skip_mnt(opts, s.c_str());
  for (const auto& f : req.enableFs) criu_local_add_enable_fs(opts, f.c_str());

  if (req.op == "dump") {
    // With an empty network namespace, CRIU records the namespace but not its
    // contents (no ip/iptables-save runs); restore creates it empty again.
    if (req.emptyNetns) criu_local_set_empty_ns(opts, CLONE_NEWNET);
    criu_local_set_pid(opts, req.pid);
    criu_local_set_leave_running(opts, req.leaveRunning);
    if (req.trackMem) criu_local_set_track_mem(opts, true);
    if (!req.parentImg.empty()) criu_local_set_parent_images(opts, req.parentImg.c_str());
    res->ret = criu_local_dump(opts);
    if (res->ret < 0) res->failure = {-res->ret, "criu dump", req.imagesDir, req.logFile};
  } else if (req.op == "restore") {
    tl_request = &req;
    tl_notify_errno = 0;
    tl_notify_failure = SystemFailure{};
    if (req.emptyNetns) criu_local_set_empty_ns(opts, CLONE_NEWNET);
    if (!req.cgroupProcs.empty() || req.emptyNetns || req.hasVeth) criu_local_set_notify_cb(opts, OnNotify);
    res->ret = criu_local_restore(opts);
    tl_request = nullptr;
    if (res->ret < 0 && tl_notify_errno) {
      if (tl_notify_failure.failed()) {
        res->failure = tl_notify_failure;
        res->failure.detail = "at setup-namespaces: " + tl_notify_failure.detail;
      } else {
        res->failure = {tl_notify_errno, "setup-namespaces", req.imagesDir,
                        "while placing restored tasks in the sandbox"};
      }
      return;
    }
    if (res->ret < 0) res->failure = {-res->ret, "criu restore", req.imagesDir, req.logFile};
  } else {
    res->failure = {EINVAL, "criu", "", "unknown op " + req.op};
  }
}

}  // namespace

// criu(request) -> Promise<number>: resolves with the restored root pid for
// "restore", the version for "version", 0 otherwise.
static Napi::Value Criu(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "argument 'request' must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  auto* call = new CriuCall(env);
  CriuRequest& r = call->req;
  r.op = GetString(o, "op");
  r.serviceAddress = GetString(o, "serviceAddress");
  r.serviceBinary = GetString(o, "serviceBinary");
  r.imagesDir = GetString(o, "imagesDir");
  r.workDir = GetString(o, "workDir");
  r.logFile = GetString(o, "logFile", "criu.log");
  r.logLevel = GetInt(o, "logLevel", 2);
  r.pid = GetInt(o, "pid", 0);
  r.leaveRunning = GetBool(o, "leaveRunning", false);
  r.tcpEstablished = GetBool(o, "tcpEstablished", false);
  r.extUnixSk = GetBool(o, "extUnixSk", false);
  r.fileLocks = GetBool(o, "fileLocks", true);
  r.linkRemap = GetBool(o, "linkRemap", false);
  r.shellJob = GetBool(o, "shellJob", false);
  r.orphanPtsMaster = GetBool(o, "orphanPtsMaster", false);
  r.manageCgroups = GetBool(o, "manageCgroups", false);
  r.manageCgroupsMode = GetInt(o, "manageCgroupsMode", -1);
  r.networkLock = GetInt(o, "networkLock", 0);
  r.root = GetString(o, "root");
  r.freezeCgroup = GetString(o, "freezeCgroup");
  r.cgRoots = GetPairs(o, "cgRoots");
  r.extMounts = GetPairs(o, "extMounts");
  r.externals = GetStrings(o, "externals");
  r.skipMounts = GetStrings(o, "skipMounts");
  r.enableFs = GetStrings(o, "enableFs");
  r.cgroupProcs = GetStrings(o, "cgroupProcs");
  r.emptyNetns = GetBool(o, "emptyNetns", false);
  r.tcpClose = GetBool(o, "tcpClose", false);
  r.trackMem = GetBool(o, "trackMem", false);
  r.parentImg = GetString(o, "parentImg");
  r.configFile = GetString(o, "configFile");
  Napi::Value veth = o.Get("veth");
  if (veth.IsObject()) {
    Napi::Object v = veth.As<Napi::Object>();
    r.hasVeth = true;
    r.veth.peer = GetString(v, "peer");
    r.veth.address = GetString(v, "address");
    r.veth.gateway = GetString(v, "gateway");
    r.veth.prefixLength = GetInt(v, "prefixLength", 31);
  }
  Napi::Promise promise = call->deferred.Promise();

  auto tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}),
                                            "lockstep-criu", 0, 1);
  std::thread([call, tsfn]() mutable {
    RunCriu(call->req, &call->result);
    tsfn.BlockingCall(call, [](Napi::Env env, Napi::Function, CriuCall* c) {
      if (c->result.failure.failed()) {
        c->deferred.Reject(MakeSystemError(env, c->result.failure).Value());
      } else {
        c->deferred.Resolve(Napi::Number::New(env, c->result.ret));
      }
      delete c;
    });
    tsfn.Release();
  }).detach();
  return promise;
}

// seqpacketListening(path): whether a process listens on the unix
// SOCK_SEQPACKET socket at path (the connect is queued and dropped at once;
// a socket file left by a killed server answers ECONNREFUSED). Node's net
// module speaks only stream sockets.
static Napi::Value SeqpacketListening(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) {
    Napi::TypeError::New(env, "seqpacketListening(path: string)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string path = info[0].As<Napi::String>();
  struct sockaddr_un addr = {};
  if (path.size() >= sizeof(addr.sun_path)) return Napi::Boolean::New(env, false);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd sk(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sk.valid()) return Napi::Boolean::New(env, false);
  int rc = ::connect(sk.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  return Napi::Boolean::New(env, rc == 0 || errno == EAGAIN);
}

void InitCriu(Napi::Env env, Napi::Object exports) {
  exports.Set("criu", Napi::Function::New(env, Criu));
  exports.Set("seqpacketListening", Napi::Function::New(env, SeqpacketListening));
  Napi::Object modes = Napi::Object::New(env);
  modes.Set("ignore", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_IGNORE)));
  modes.Set("none", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_NONE)));
  modes.Set("props", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_PROPS)));
  modes.Set("soft", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_SOFT)));
  modes.Set("full", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_FULL)));
  modes.Set("strict", Napi::Number::New(env, static_cast<int>(CRIU_CG_MODE_STRICT)));
  exports.Set("criuCgroupModes", modes);
  Napi::Object locks = Napi::Object::New(env);
  locks.Set("iptables", Napi::Number::New(env, static_cast<int>(CRIU_NETWORK_LOCK_IPTABLES)));
  locks.Set("nftables", Napi::Number::New(env, static_cast<int>(CRIU_NETWORK_LOCK_NFTABLES)));
  locks.Set("skip", Napi::Number::New(env, static_cast<int>(CRIU_NETWORK_LOCK_SKIP)));
  exports.Set("criuNetworkLocks", locks);
}

}  // namespace lockstep
