{
  # Three targets: the addon (syscall-sized verbs for the orchestrator), the
  # helper executable that enters namespaces (Node is multithreaded, so
  # unshare/setns/pivot_root happen in a separate process, as node-pty's
  # spawn-helper and runc's nsenter do), and the sandbox's static init.
  # libcriu comes from the private CRIU prefix that scripts/provision-host.sh
  # installs (see docs/ARCHITECTURE.md, "CRIU on a stock Debian 12").
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
        "native/addon/criu.cc"
      ],
      "dependencies": ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
      "include_dirs": ["<(libcriu_dir)/include"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden", "-fstack-protector-strong"],
      "libraries": ["-L<(libcriu_dir)", "-lcriu", "-Wl,-rpath,<(libcriu_dir)"],
      "defines": ["NAPI_VERSION=8"]
    },
    {
      "target_name": "lockstep-helper",
      "type": "executable",
      "sources": ["native/helper/lockstep-helper.c", "native/helper/userns.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fstack-protector-strong", "-O2"]
    },
    {
      "target_name": "lockstep-init",
      "type": "executable",
      "sources": ["native/init/lockstep-init.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Os"],
      "ldflags": ["-static"]
    }
  ]
}
