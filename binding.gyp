{
  # Four targets: the addon (syscall-sized verbs for the orchestrator), the
  # helper executable that enters namespaces (Node is multithreaded, so
  # unshare/setns/pivot_root happen in a separate process, as node-pty's
  # spawn-helper and runc's nsenter do), the sandbox's static init, and the
  # static relay that holds an interactive process's terminal and stdin inside it.
  # libcriu comes from the private CRIU prefix that scripts/provision-host.sh
  # installs (see docs/decisions/criu-version.md, "CRIU 4.2.1 from Debian forky"). The
  # helper links libcap, and its syscall filter is compiled at build time with
  # libseccomp (Debian's libcap-dev, libseccomp-dev; native/helper/confine.c).
  "variables": {
    "libcriu_dir%": "/opt/lockstep/libcriu"
  },
  "targets": [
    {
      "target_name": "lockstep",
      "sources": [
        "native/addon/addon.cc",
        "native/addon/system_error.cc",
        "native/addon/mounts.cc",
        "native/addon/btrfs.cc",
        "native/addon/files.cc",
        "native/addon/locks.cc",
        "native/addon/criu.cc",
        "native/addon/pidwatch.cc",
        "native/addon/pidfd.cc",
        "native/addon/quota.cc",
        "native/addon/netns.cc",
        "native/addon/ownership.cc"
      ],
      "dependencies": ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
      "include_dirs": ["<(libcriu_dir)/include"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden", "-fstack-protector-strong"],
      "libraries": ["-L<(libcriu_dir)", "-lcriu", "-Wl,-rpath,<(libcriu_dir)", "-lmnl"],
      "defines": ["NAPI_VERSION=8"]
    },
    {
      # Build-time compiler of the sandbox syscall profile to a BPF program
      # (native/helper/seccomp-compile.c explains why not at run time).
      "target_name": "lockstep-seccomp-compile",
      "type": "executable",
      "sources": ["native/helper/seccomp-compile.c", "native/helper/seccomp-profile.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-O2"],
      "libraries": ["-lseccomp"]
    },
    {
      "target_name": "lockstep-helper",
      "type": "executable",
      "dependencies": ["lockstep-seccomp-compile"],
      "actions": [
        {
          "action_name": "compile_seccomp_profile",
          "inputs": ["<(PRODUCT_DIR)/lockstep-seccomp-compile"],
          "outputs": ["<(SHARED_INTERMEDIATE_DIR)/seccomp-program.h"],
          "action": ["<(PRODUCT_DIR)/lockstep-seccomp-compile", "<(SHARED_INTERMEDIATE_DIR)/seccomp-program.h"]
        }
      ],
      "include_dirs": ["<(SHARED_INTERMEDIATE_DIR)"],
      "sources": [
        "native/helper/main.c",
        "native/helper/create.c",
        "native/helper/enter.c",
        "native/helper/supervise.c",
        "native/helper/util.c",
        "native/helper/confine.c",
        "native/helper/userns.c"
      ],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fstack-protector-strong", "-O2"],
      "libraries": ["-lcap"]
    },
    {
      "target_name": "lockstep-init",
      "type": "executable",
      "sources": ["native/init/lockstep-init.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Os"],
      "ldflags": ["-static"]
    },
    {
      "target_name": "lockstep-relay",
      "type": "executable",
      "sources": ["native/init/lockstep-relay.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Os"],
      "ldflags": ["-static"]
    }
  ]
}
