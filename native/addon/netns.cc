// Network verbs for egress sandboxes that must not wait for a process spawn:
// - AttachVeth: moves the sandbox side of a veth pair into a process's
//   network namespace and configures it there (eth0, its /31, up, default
//   route via the gateway, no IPv6; loopback up). It runs at CRIU's
//   setup-namespaces notification (criu.cc), before sockets are restored,
//   so sockets bound to the sandbox's address restore; and for a new
//   sandbox (`attachVeth`, on a thread of its own, since it enters the
//   namespace). The move is one RTM_NEWLINK over netlink (libmnl); the rest
//   are the classic interface ioctls, issued inside the namespace.
// - setLinkUp: brings a host-side interface up or down with one ioctl (the
//   warm-standby swap of an egress sandbox).
// - connectInNetns: a TCP connection to 127.0.0.1:port inside a sandbox's
//   network namespace (exposed ports, src/network/exposed-ports.ts), made on
//   a thread of its own that joins the namespace through a pidfd and exits:
//   no path the sandbox controls is looked up, and neither the event loop nor
//   libuv's pool waits for a sandbox that does not answer.
#include "netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "addon.h"
#include "system_error.h"

namespace lockstep {

namespace {

// RTM_NEWLINK on the existing interface with IFLA_NET_NS_FD: the kernel moves
// it into that namespace (its addresses and routes are dropped on the way).
int MoveLink(const std::string& name, int nsFd) {
  unsigned index = if_nametoindex(name.c_str());
  if (index == 0) return -1;
  struct mnl_socket* nl = mnl_socket_open(NETLINK_ROUTE);
  if (nl == nullptr) return -1;
  int rc = -1;
  char buf[MNL_SOCKET_BUFFER_SIZE];
  struct nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWLINK;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  nlh->nlmsg_seq = static_cast<unsigned>(time(nullptr));
  auto* ifm = static_cast<struct ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(struct ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = static_cast<int>(index);
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(nsFd));
  if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) == 0 && mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) >= 0) {
    ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
    // The ack is an NLMSG_ERROR whose error field is 0 on success.
    if (n >= 0)
      rc = mnl_cb_run(buf, static_cast<size_t>(n), nlh->nlmsg_seq, mnl_socket_get_portid(nl), nullptr, nullptr);
    if (rc > 0) rc = 0;
  }
  int saved = errno;
  mnl_socket_close(nl);
  errno = saved;
  return rc < 0 ? -1 : 0;
}

int SetFlags(int sk, const char* name, short set, short clear) {
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(sk, SIOCGIFFLAGS, &ifr) != 0) return -1;
  ifr.ifr_flags = static_cast<short>((ifr.ifr_flags | set) & ~clear);
  return ::ioctl(sk, SIOCSIFFLAGS, &ifr);
}

int SetAddr(int sk, const char* name, unsigned long request, const std::string& addr) {
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<struct sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &sin->sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  return ::ioctl(sk, request, &ifr);
}

std::string Netmask(int prefix) {
  uint32_t m = prefix == 0 ? 0 : htonl(0xffffffffu << (32 - prefix));
  char out[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &m, out, sizeof(out));
  return out;
}

// /proc/sys/net is per network namespace, resolved for the opening thread.
void DisableIpv6(const char* name) {
  std::string path = std::string("/proc/sys/net/ipv6/conf/") + name + "/disable_ipv6";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.valid()) (void)!::write(fd.get(), "1", 1);
}

}  // namespace

int AttachVeth(int pid, const VethConfig& cfg, SystemFailure* failure) {
  std::string nsPath = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd ns(::open(nsPath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) {
    *failure = {errno, "open", nsPath, "the sandbox's network namespace"};
    return -1;
  }
  if (MoveLink(cfg.peer, ns.get()) != 0) {
    *failure = {errno, "RTM_NEWLINK", cfg.peer, "moving the sandbox side of its veth into its namespace"};
    return -1;
  }
  // From here on this thread is in the sandbox's namespace; the caller's
  // thread exits afterwards, so nothing else ever runs in it.
  if (::setns(ns.get(), CLONE_NEWNET) != 0) {
    *failure = {errno, "setns", nsPath, ""};
    return -1;
  }
  UniqueFd sk(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sk.valid()) {
    *failure = {errno, "socket", "", ""};
    return -1;
  }
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::strncpy(ifr.ifr_name, cfg.peer.c_str(), IFNAMSIZ - 1);
  std::strncpy(ifr.ifr_newname, "eth0", IFNAMSIZ - 1);
  if (::ioctl(sk.get(), SIOCSIFNAME, &ifr) != 0) {
    *failure = {errno, "SIOCSIFNAME", cfg.peer, "renaming the veth to eth0"};
    return -1;
  }
  DisableIpv6("eth0");
  struct rtentry rt;
  std::memset(&rt, 0, sizeof(rt));
  auto* dst = reinterpret_cast<struct sockaddr_in*>(&rt.rt_dst);
  auto* gw = reinterpret_cast<struct sockaddr_in*>(&rt.rt_gateway);
  auto* mask = reinterpret_cast<struct sockaddr_in*>(&rt.rt_genmask);
  dst->sin_family = gw->sin_family = mask->sin_family = AF_INET;
  inet_pton(AF_INET, cfg.gateway.c_str(), &gw->sin_addr);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  const char* step = "";
  if (SetAddr(sk.get(), "eth0", SIOCSIFADDR, cfg.address) != 0)
    step = "SIOCSIFADDR";
  else if (SetAddr(sk.get(), "eth0", SIOCSIFNETMASK, Netmask(cfg.prefixLength)) != 0)
    step = "SIOCSIFNETMASK";
  else if (SetFlags(sk.get(), "eth0", IFF_UP, 0) != 0)
    step = "SIOCSIFFLAGS eth0";
  else if (SetFlags(sk.get(), "lo", IFF_UP | IFF_RUNNING, 0) != 0)
    step = "SIOCSIFFLAGS lo";
  else if (::ioctl(sk.get(), SIOCADDRT, &rt) != 0)
    step = "SIOCADDRT";
  if (*step) {
    *failure = {errno, step, "eth0", "configuring the sandbox's eth0"};
    return -1;
  }
  return 0;
}

namespace {

VethConfig ReadConfig(const Napi::Object& o) {
  VethConfig c;
  c.peer = o.Get("peer").ToString().Utf8Value();
  c.address = o.Get("address").ToString().Utf8Value();
  c.gateway = o.Get("gateway").ToString().Utf8Value();
  c.prefixLength = o.Get("prefixLength").ToNumber().Int32Value();
  return c;
}

struct AttachCall {
  int pid;
  VethConfig cfg;
  SystemFailure failure;
  Napi::Promise::Deferred deferred;
  explicit AttachCall(Napi::Env env) : deferred(Napi::Promise::Deferred::New(env)) {}
};

// attachVeth(pid, {peer, address, gateway, prefixLength}) -> Promise<void>
Napi::Value AttachVethJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsObject())
    throw Napi::TypeError::New(env, "attachVeth(pid, config)");
  auto* call = new AttachCall(env);
  call->pid = info[0].As<Napi::Number>().Int32Value();
  call->cfg = ReadConfig(info[1].As<Napi::Object>());
  Napi::Promise promise = call->deferred.Promise();
  auto tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}),
                                            "lockstep-netns", 0, 1);
  // A thread of its own: it enters the sandbox's namespace and then exits.
  std::thread([call, tsfn]() mutable {
    AttachVeth(call->pid, call->cfg, &call->failure);
    tsfn.BlockingCall(call, [](Napi::Env env, Napi::Function, AttachCall* c) {
      if (c->failure.failed())
        c->deferred.Reject(MakeSystemError(env, c->failure).Value());
      else
        c->deferred.Resolve(env.Undefined());
      delete c;
    });
    tsfn.Release();
  }).detach();
  return promise;
}

// setLinkUp(name, up): one SIOCSIFFLAGS in the manager's (root) namespace.
Napi::Value SetLinkUpJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsBoolean())
    throw Napi::TypeError::New(env, "setLinkUp(name, up)");
  std::string name = info[0].As<Napi::String>().Utf8Value();
  bool up = info[1].As<Napi::Boolean>().Value();
  UniqueFd sk(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  int rc = sk.valid() ? SetFlags(sk.get(), name.c_str(), up ? IFF_UP : 0, up ? 0 : IFF_UP) : -1;
  if (rc != 0) ThrowSystemError(env, errno, "SIOCSIFFLAGS", name);
  return env.Undefined();
}

struct ConnectCall {
  int pidfd;
  int port;
  int timeoutMs;
  int fd = -1;
  SystemFailure failure;
  Napi::Promise::Deferred deferred;
  explicit ConnectCall(Napi::Env env) : deferred(Napi::Promise::Deferred::New(env)) {}
};

// On the calling thread, which is left in the sandbox's namespace: a
// non-blocking connect, then at most timeoutMs for it to complete.
void ConnectInNetns(ConnectCall* c) {
  if (::setns(c->pidfd, CLONE_NEWNET) != 0) {
    c->failure = {errno, "setns", "", "joining the sandbox's network namespace"};
    return;
  }
  UniqueFd sk(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sk.valid()) {
    c->failure = {errno, "socket", "", ""};
    return;
  }
  struct sockaddr_in sin;
  std::memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(c->port));
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string where = "127.0.0.1:" + std::to_string(c->port);
  if (::connect(sk.get(), reinterpret_cast<struct sockaddr*>(&sin), sizeof(sin)) != 0) {
    if (errno != EINPROGRESS) {
      c->failure = {errno, "connect", where, ""};
      return;
    }
    struct pollfd p = {sk.get(), POLLOUT, 0};
    int n;
    do n = ::poll(&p, 1, c->timeoutMs);
    while (n < 0 && errno == EINTR);
    if (n == 0) {
      c->failure = {ETIMEDOUT, "connect", where, ""};
      return;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (n < 0 || ::getsockopt(sk.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      c->failure = {err, "connect", where, ""};
      return;
    }
  }
  c->fd = sk.release();
}

// connectInNetns(pidfd, port, timeoutMs) -> Promise<fd>
Napi::Value ConnectInNetnsJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "connectInNetns(pidfd, port, timeoutMs)");
  auto* call = new ConnectCall(env);
  call->pidfd = info[0].As<Napi::Number>().Int32Value();
  call->port = info[1].As<Napi::Number>().Int32Value();
  call->timeoutMs = info[2].As<Napi::Number>().Int32Value();
  Napi::Promise promise = call->deferred.Promise();
  auto tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}),
                                            "lockstep-connect", 0, 1);
  std::thread([call, tsfn]() mutable {
    ConnectInNetns(call);
    tsfn.BlockingCall(call, [](Napi::Env env, Napi::Function, ConnectCall* c) {
      if (c->failure.failed())
        c->deferred.Reject(MakeSystemError(env, c->failure).Value());
      else
        c->deferred.Resolve(Napi::Number::New(env, c->fd));
      delete c;
    });
    tsfn.Release();
  }).detach();
  return promise;
}

}  // namespace

void InitNetns(Napi::Env env, Napi::Object exports) {
  exports.Set("attachVeth", Napi::Function::New(env, AttachVethJs));
  exports.Set("setLinkUp", Napi::Function::New(env, SetLinkUpJs));
  exports.Set("connectInNetns", Napi::Function::New(env, ConnectInNetnsJs));
}

}  // namespace lockstep
