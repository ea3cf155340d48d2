/**
 * Host checks for `lockstep doctor`: each says pass or fail and, on a
 * failure, what to do about it.
 */
import fs from 'node:fs';
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import { native, helperPath, initPath, relayPath } from '../native/binding.js';
import { criuBinary, formatVersion, MIN_CRIU_VERSION } from './criu-service.js';
import { CRIU_TESTED_VERSION, CRIU_TESTED_VERSION_NUMBER } from './criu-version.js';
import { detectCgroups } from './cgroups.js';
import { DockerEngine } from './docker.js';
import { resolveHome } from '../paths.js';
import { FS_MAGIC } from '../native/binding.js';
import { SETUP_HINT } from '../errors.js';

export interface Check {
  name: string;
  ok: boolean;
  detail: string;
  fix?: string;
  /** A failed optional check does not fail `lockstep doctor`. */
  optional?: boolean;
}

function kernelAtLeast(release: string, major: number, minor: number): boolean {
  const [a, b] = release.split('.').map((x) => parseInt(x, 10));
  return a! > major || (a === major && b! >= minor);
}

export async function runDoctor(home = resolveHome()): Promise<Check[]> {
  const checks: Check[] = [];
  const add = (name: string, ok: boolean, detail: string, fix?: string) =>
    checks.push(fix && !ok ? { name, ok, detail, fix } : { name, ok, detail });

  const release = os.release();
  add(
    'kernel',
    kernelAtLeast(release, 5, 14),
    `Linux ${release}`,
    'Lockstep needs Linux 5.14 or later (openat2, cgroup.kill, close_range)',
  );
  add(
    'root',
    process.getuid?.() === 0,
    process.getuid?.() === 0 ? 'running as root' : `running as uid ${process.getuid?.()}`,
    'run lockstep as root',
  );

  const filesystems = fs.readFileSync('/proc/filesystems', 'utf8');
  add(
    'overlayfs',
    /\toverlay$/m.test(filesystems),
    /\toverlay$/m.test(filesystems) ? 'overlay filesystem available' : 'overlay missing',
    'load the overlay module: modprobe overlay',
  );
  const nsMissing = ['pid', 'mnt', 'uts', 'ipc', 'net'].filter((n) => !fs.existsSync(`/proc/self/ns/${n}`));
  add(
    'namespaces',
    nsMissing.length === 0,
    nsMissing.length ? `missing: ${nsMissing.join(', ')}` : 'pid, mount, uts, ipc and net namespaces',
    'use a kernel built with namespace support',
  );

  try {
    const cg = detectCgroups();
    add(
      'cgroups',
      true,
      cg.version === 2
        ? 'cgroup v2 (unified): memory, pids, freeze'
        : 'cgroup v1: pids, memory and freezer hierarchies',
    );
    checks.push({
      name: 'cpu limits',
      ok: cg.cpuControl,
      optional: true,
      detail: cg.cpuControl
        ? `cpuWeight and cpus apply (${cg.version === 2 ? 'cpu.weight, cpu.max' : 'cpu.shares, cpu.cfs_quota_us'})`
        : 'no cpu controller: creates that set cpuWeight or cpus are refused (LIMIT_UNSUPPORTED)',
      ...(cg.cpuControl
        ? {}
        : { fix: 'mount the cpu cgroup controller (v1) or make it available in the unified hierarchy (v2)' }),
    });
    const io = cg.ioWeightSupport();
    checks.push({
      name: 'io weight',
      ok: io.ok,
      optional: true,
      detail: io.ok
        ? `ioWeight applies: ${io.detail}`
        : `ioWeight unavailable, creates that set it are refused (LIMIT_UNSUPPORTED): ${io.detail}`,
      ...(io.ok
        ? {}
        : {
            fix:
              'select the BFQ scheduler on the disk that holds the state directory (echo bfq > ' +
              '/sys/block/DEV/queue/scheduler) on a kernel whose blkio/io controller has bfq.weight, or enable ' +
              'io.cost (cgroup v2)',
          }),
    });
  } catch (e) {
    add(
      'cgroups',
      false,
      (e as Error).message,
      'mount the pids, memory and freezer cgroup v1 controllers, or cgroup v2',
    );
  }

  const builtOk = fs.existsSync(helperPath) && fs.existsSync(initPath) && fs.existsSync(relayPath);
  let addonOk = false;
  try {
    native();
    addonOk = true;
  } catch {
    /* reported below */
  }
  add(
    'native build',
    builtOk && addonOk,
    builtOk && addonOk ? 'addon, helper and init built' : 'native parts missing',
    SETUP_HINT,
  );

  const criu = criuBinary();
  if (!fs.existsSync(criu)) {
    add(
      'criu',
      false,
      `${criu} not found`,
      `${SETUP_HINT}: it installs CRIU ${CRIU_TESTED_VERSION} into /opt/lockstep/criu`,
    );
  } else if (addonOk) {
    try {
      const v = await native().criu({ op: 'version', serviceBinary: criu });
      const untested = v === CRIU_TESTED_VERSION_NUMBER ? '' : ` (Lockstep is tested with ${CRIU_TESTED_VERSION})`;
      add(
        'criu version',
        v >= MIN_CRIU_VERSION,
        `CRIU ${formatVersion(v)}${untested}`,
        `Lockstep needs CRIU ${formatVersion(MIN_CRIU_VERSION)} or later and is tested with ` +
          `${CRIU_TESTED_VERSION}; Debian 12 ships 3.17, which fails on current kernels`,
      );
      // `criu check` is diagnostic only: its exit status decides, its last line is shown.
      try {
        const out = execFileSync(criu, ['check'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
        add('criu check', true, `criu check: ${out.trim().split('\n').pop()}`);
      } catch (e) {
        const err = e as { stdout?: string; stderr?: string };
        add(
          'criu check',
          false,
          `criu check failed: ${(err.stderr ?? err.stdout ?? '').trim().split('\n').pop()}`,
          'run `criu check --all` for details',
        );
      }
    } catch (e) {
      add('criu version', false, (e as Error).message, 'check that /opt/lockstep/bin/criu runs');
    }
  }

  let mkfs = false;
  try {
    execFileSync('mkfs.btrfs', ['--version'], { stdio: 'ignore' });
    mkfs = true;
  } catch {
    /* missing */
  }
  const btrfsKernel = /\tbtrfs$/m.test(filesystems) || fs.existsSync('/sys/fs/btrfs');
  let homeFs = 'not created yet';
  try {
    homeFs =
      addonOk && native().filesystemType(fs.existsSync(home) ? home : '/') === FS_MAGIC.btrfs
        ? 'btrfs (subvolumes in place)'
        : 'not btrfs: a loop-mounted btrfs image file holds the layers';
  } catch {
    /* ignore */
  }
  add(
    'layer store',
    mkfs && btrfsKernel,
    `btrfs snapshots; state directory ${home}: ${homeFs}`,
    `${SETUP_HINT} (installs btrfs-progs); make sure the btrfs module loads`,
  );

  try {
    const buckets = Number(fs.readFileSync('/proc/sys/net/netfilter/nf_conntrack_buckets', 'utf8'));
    checks.push({
      name: 'conntrack',
      ok: buckets <= 16384,
      optional: true,
      detail:
        `${buckets} conntrack buckets` +
        (buckets > 16384 ? `: CRIU walks them twice per checkpoint (~${((buckets / 262144) * 18).toFixed(0)} ms)` : ''),
      ...(buckets > 16384
        ? { fix: 'echo 16384 > /sys/module/nf_conntrack/parameters/hashsize (scripts/provision-host.sh does)' }
        : {}),
    });
  } catch {
    /* no conntrack in this kernel: nothing to walk */
  }

  try {
    const shared = ['tcp_child_ehash_entries', 'udp_child_hash_entries'].filter(
      (knob) => Number(fs.readFileSync(`/proc/sys/net/ipv4/${knob}`, 'utf8')) === 0,
    );
    checks.push({
      name: 'socket hash tables',
      ok: shared.length === 0,
      optional: true,
      detail:
        shared.length === 0
          ? 'each sandbox namespace gets socket tables of its own'
          : `${shared.join(' and ')} 0: every sandbox shares the host's tables, which CRIU and socket listings walk in full`,
      ...(shared.length === 0
        ? {}
        : { fix: `sysctl ${shared.map((k) => `net.ipv4.${k}=4096`).join(' ')} (scripts/provision-host.sh does)` }),
    });
  } catch {
    /* a kernel without per-namespace socket tables */
  }

  const docker = await new DockerEngine().ping();
  checks.push({
    name: 'docker engine',
    ok: docker,
    optional: true,
    detail: docker ? 'reachable at /var/run/docker.sock' : 'not reachable (needed only for image import/export)',
    ...(docker ? {} : { fix: 'start one: scripts/start-dockerd.sh' }),
  });
  return checks;
}
