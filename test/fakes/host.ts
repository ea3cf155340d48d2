/**
 * A recording fake of every port (src/ports.ts): the native binding, the
 * supervisor client, CRIU, cgroups, the layer store, /proc and the clock.
 * It keeps a small model of the host (processes with a "memory" token,
 * cgroups, mounts, layers with a "content" token) so that tests can assert
 * outcomes (which memory and which files a sandbox has after a rollback), and
 * it records every call in order in `calls`, so tests can assert the order of
 * steps and what was undone. `failAt(call, error)` makes one call throw.
 * Nothing here needs root: `Lockstep.open` with these ports runs as nobody.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { CgroupDriver, CgroupLimits } from '../../src/host/cgroups.js';
import type { OpenOptions } from '../../src/api/lockstep.js';
import type { NativeBinding, OpenedFile, PidWatcher } from '../../src/native/binding.js';
import type {
  Clock,
  CriuClient,
  CriuDumpRequest,
  CriuRestoreRequest,
  HelperClient,
  LayerPort,
  ProcessTable,
} from '../../src/ports.js';
import type { StatePaths } from '../../src/paths.js';

/** A process of the fake host. */
export interface FakeProcess {
  pid: number;
  start: number;
  /** What the process "remembers": dumped into a process image and restored from it. */
  memory: string;
}

interface FakeCgroup {
  pids: Set<number>;
  frozen: boolean;
  limits: CgroupLimits;
}

/** The errno-shaped error the addon throws. */
export function systemError(code: string, syscall: string): Error {
  return Object.assign(new Error(`${syscall}: ${code}`), { code, syscall, errno: -1 });
}

export class FakeHost {
  /** Every port call, in order: "cgroups.freeze lockstep/…/sbx_…", "criu.dump 1001", … */
  readonly calls: string[] = [];
  readonly processes = new Map<number, FakeProcess>();
  readonly cgroups = new Map<string, FakeCgroup>();
  readonly mounts = new Set<string>();
  /** Writable layers (by instance key) and checkpoint layers (by layer id): their content token. */
  readonly uppers = new Map<string, string>();
  readonly layers = new Map<string, string>();
  /** Processes a test made exit "behind the manager's back". */
  private nextPid = 1000;
  private ticks = 50_000;
  private readonly failures = new Map<string, Error>();
  private readonly watchers = new Set<FakePidWatcher>();
  now = Date.parse('2026-11-30T12:00:00Z');
  /** The fake kernel's boot id; a test changes it to model a host restart. */
  bootId = 'fake-boot-1';
  /** Memory charged to each sandbox's cgroups (by sandbox id; a standby's cgroup reports its sandbox's). */
  readonly memoryBytes = new Map<string, number>();
  /**
   * The files of each content token (a layer's): path in the sandbox to bytes.
   * A sandbox root that is mounted reads its writable layer's token's files;
   * a path not listed does not exist.
   */
  readonly files = new Map<string, Record<string, string>>();
  /** Set by layerPort: where each instance's root is mounted. */
  private paths: StatePaths | undefined;

  constructor(readonly home: string) {}

  /** The next call whose record starts with `prefix` throws `error` (once). */
  failAt(prefix: string, error: Error = systemError('EIO', prefix)): void {
    this.failures.set(prefix, error);
  }

  /** Calls recorded since a mark, for asserting one operation's steps. */
  since(mark: number): string[] {
    return this.calls.slice(mark);
  }

  /** Only the calls of some ports: `host.only('cgroups.freeze', 'criu')`. */
  only(...prefixes: string[]): string[] {
    return this.calls.filter((c) => prefixes.some((p) => c.startsWith(p)));
  }

  private record(call: string): void {
    this.calls.push(call);
    for (const [prefix, error] of this.failures) {
      if (call.startsWith(prefix)) {
        this.failures.delete(prefix);
        throw error;
      }
    }
  }

  /** Starts a process in a cgroup; what a successful `lockstep-helper create` or CRIU restore leaves. */
  spawn(cgroup: string | undefined, memory: string): FakeProcess {
    const p: FakeProcess = { pid: this.nextPid++, start: this.ticks++, memory };
    this.processes.set(p.pid, p);
    if (cgroup) this.group(cgroup).pids.add(p.pid);
    return p;
  }

  /** Ends a process as a crash would; watchers see the exit. */
  exit(pid: number): void {
    this.processes.delete(pid);
    for (const g of this.cgroups.values()) g.pids.delete(pid);
    for (const w of this.watchers) w.exited(pid);
  }

  private group(name: string): FakeCgroup {
    let g = this.cgroups.get(name);
    if (!g) this.cgroups.set(name, (g = { pids: new Set(), frozen: false, limits: {} }));
    return g;
  }

  /** The cgroup name a cgroup.procs path of this fake names. */
  private static cgroupOf(procsFile: string): string {
    return procsFile.replace(/^fakecg:\//, '').replace(/\/cgroup\.procs$/, '');
  }

  // ---- the ports -------------------------------------------------------

  readonly clock: Clock = {
    now: () => this.now,
    sleep: async (ms) => {
      this.now += ms;
      await new Promise((r) => setImmediate(r));
    },
  };

  readonly proc: ProcessTable = {
    isAlive: (pid) => this.processes.has(pid),
    startTime: (pid) => this.processes.get(pid)?.start,
    mountsUnder: (prefix) =>
      [...this.mounts].filter((m) => m === prefix || m.startsWith(prefix + '/')).sort((a, b) => b.length - a.length),
    mountPropagation: (mp) => (this.mounts.has(mp) ? 'shared' : undefined),
    bootId: () => this.bootId,
  };

  readonly cgroupDriver: CgroupDriver = {
    version: 2,
    cpuControl: true,
    create: (name, limits) => {
      this.record(`cgroups.create ${name}`);
      this.group(name).limits = limits;
    },
    procsFiles: (name) => [`fakecg:/${name}/cgroup.procs`],
    freezerPath: (name) => `fakecg:/${name}`,
    freeze: async (name) => {
      this.record(`cgroups.freeze ${name}`);
      this.group(name).frozen = true;
    },
    thaw: (name) => {
      this.record(`cgroups.thaw ${name}`);
      const g = this.cgroups.get(name);
      if (!g) throw systemError('ENOENT', 'thaw');
      g.frozen = false;
    },
    isFrozen: (name) => this.cgroups.get(name)?.frozen ?? false,
    pids: (name) => [...(this.cgroups.get(name)?.pids ?? [])],
    kill: async (name) => {
      this.record(`cgroups.kill ${name}`);
      for (const pid of this.cgroups.get(name)?.pids ?? []) this.exit(pid);
    },
    remove: (name) => {
      this.record(`cgroups.remove ${name}`);
      this.cgroups.delete(name);
    },
    children: (group) =>
      [...this.cgroups.keys()].filter((n) => n.startsWith(group + '/')).map((n) => n.slice(group.length + 1)),
    oomKills: () => 0,
    cpuUsageUsec: () => 0,
    memoryBytes: (name) => this.memoryBytes.get(name.split('/').at(-1)!.split('.')[0]!) ?? 0,
    ioWeightSupport: () => ({ ok: true, detail: 'fake' }) as ReturnType<CgroupDriver['ioWeightSupport']>,
  };

  readonly helper: HelperClient = {
    ensureRunning: async () => this.record('helper.ensureRunning'),
    run: async (argv) => {
      const verb = argv[1];
      this.record(`helper.${verb}`);
      if (verb === 'create') {
        const cgroup = argv[argv.indexOf('--cgroup') + 1];
        return JSON.stringify({ pid: this.spawn(cgroup && FakeHost.cgroupOf(cgroup), 'fresh').pid }) + '\n';
      }
      return '{}\n';
    },
    daemon: async (_log, argv) => {
      this.record(`helper.daemon ${path.basename(argv[0]!)}`);
      return this.spawn(undefined, 'daemon').pid;
    },
    stop: async () => this.record('helper.stop'),
  };

  readonly criu: CriuClient = {
    ensureRunning: async () => {
      this.record('criu.ensureRunning');
      return 40201;
    },
    tracksWrites: false,
    dump: async (req: CriuDumpRequest) => {
      this.record(`criu.dump ${req.pid}`);
      const p = this.processes.get(req.pid);
      if (!p) throw systemError('ESRCH', 'criu dump');
      fs.writeFileSync(path.join(req.imagesDir, 'memory'), p.memory);
      return { tracked: false };
    },
    restore: async (req: CriuRestoreRequest) => {
      this.record(`criu.restore ${path.basename(req.imagesDir)}`);
      const memory = fs.readFileSync(path.join(req.imagesDir, 'memory'), 'utf8');
      return this.spawn(FakeHost.cgroupOf(req.cgroupProcs![0]!), memory).pid;
    },
    stopOrphanedWorkers: async () => 0,
  };

  /** The layer store; layer folders are made on disk so that the engine's own fs calls find them. */
  layerPort(paths: StatePaths): LayerPort {
    this.paths = paths;
    const need = (ok: boolean, what: string) => {
      if (!ok) throw systemError('ENOENT', what);
    };
    // LayerStore.open makes these; the engine writes process images there.
    for (const dir of [paths.uppers, paths.layers, paths.processImages, paths.scratch])
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    return {
      upperDir: (id) => ({ upper: path.join(paths.upper(id), 'upper'), work: path.join(paths.upper(id), 'work') }),
      createUpper: async (id) => {
        this.record(`layers.createUpper ${id}`);
        this.uppers.set(id, '');
      },
      quotaUnavailable: () => undefined,
      setQuota: () => undefined,
      layerBytes: () => null,
      upperUsage: () => null,
      snapshotUpper: async (id, layerId) => {
        this.record(`layers.snapshotUpper ${id} ${layerId}`);
        need(this.uppers.has(id), `upper ${id}`);
        this.layers.set(layerId, this.uppers.get(id)!);
      },
      resetUpperTo: async (id, layerId) => {
        this.record(`layers.resetUpperTo ${id} ${layerId}`);
        need(this.layers.has(layerId), `layer ${layerId}`);
        this.uppers.set(id, this.layers.get(layerId)!);
      },
      deleteUpper: async (id) => {
        this.record(`layers.deleteUpper ${id}`);
        return this.uppers.delete(id);
      },
      deleteLayer: async (layerId) => {
        this.record(`layers.deleteLayer ${layerId}`);
        return this.layers.delete(layerId);
      },
      hasLayer: (layerId) => this.layers.has(layerId),
      listUppers: () => [...this.uppers.keys()],
      listLayers: () => [...this.layers.keys()],
      sync: async () => this.record('layers.sync'),
      freeBytes: () => Number.MAX_SAFE_INTEGER,
      shmDir: (id) => path.join(paths.uppers, id, 'shm'),
      prepareShm: async (id) => {
        fs.mkdirSync(path.join(paths.uppers, id, 'shm'), { recursive: true });
      },
    };
  }

  readonly native: NativeBinding = (() => {
    const notFaked = (name: string) => () => {
      throw new Error(`native.${name} is not part of the fake`);
    };
    const makeWatcher = (onExit: (id: number) => void) => new FakePidWatcher(this, onExit);
    return {
      mountOverlay: (target: string) => {
        this.record(`native.mountOverlay ${target}`);
        this.mounts.add(target);
      },
      unmount: (target: string) => {
        this.record(`native.unmount ${target}`);
        return this.mounts.delete(target);
      },
      makeDevFolder: async (dir: string) => {
        this.record(`native.makeDevFolder ${dir}`);
      },
      makeSharedMount: (p: string) => {
        this.mounts.add(p);
      },
      mountTmpfs: (p: string) => {
        this.record(`native.mountTmpfs ${p}`);
      },
      flock: () => true,
      criuCgroupModes: { ignore: 0, none: 1, props: 2, soft: 3, full: 4, strict: 5 },
      criuNetworkLocks: { iptables: 1, nftables: 2, skip: 3 },
      openFlags: { O_PATH: 0o10000000, O_DIRECTORY: 0o200000, O_NOFOLLOW: 0o400000, O_NONBLOCK: 0o4000 },
      // `new native.PidWatcher(onExit)`: a constructor that returns the fake.
      PidWatcher: function (onExit: (id: number) => void) {
        return makeWatcher(onExit);
      } as unknown as NativeBinding['PidWatcher'],
      filesystemType: notFaked('filesystemType'),
      subvolumeCreate: notFaked('subvolumeCreate'),
      subvolumeSnapshot: notFaked('subvolumeSnapshot'),
      subvolumeDelete: notFaked('subvolumeDelete'),
      syncFilesystem: notFaked('syncFilesystem'),
      openBeneath: notFaked('openBeneath'),
      openBeneathSync: notFaked('openBeneathSync'),
      openChecked: async (root: string, rel: string) => this.openFile(root, rel),
      openFifoWriter: notFaked('openFifoWriter'),
      quotaEnable: notFaked('quotaEnable'),
      qgroupLimit: notFaked('qgroupLimit'),
      qgroupUsage: notFaked('qgroupUsage'),
      criu: notFaked('criu'),
      seqpacketListening: () => false,
      pidfdOpen: notFaked('pidfdOpen'),
      pidfdSendSignal: notFaked('pidfdSendSignal'),
      hostPidsIn: notFaked('hostPidsIn'),
      idmappedMounts: notFaked('idmappedMounts'),
      shiftOwners: notFaked('shiftOwners'),
      cloneFolder: notFaked('cloneFolder'),
      attachVeth: notFaked('attachVeth'),
      setLinkUp: notFaked('setLinkUp'),
      connectInNetns: notFaked('connectInNetns'),
      // A layer's identity and last change: its content token stands for the transaction.
      subvolumeInfo: (p: string) => ({
        uuid: `fake:${path.basename(p)}`,
        generation: 1,
        ctransid: 1,
        otransid: 1,
        readonly: true,
      }),
    } as NativeBinding;
  })();

  /**
   * openChecked of a regular file below a mounted sandbox root: an fd of a
   * scratch copy of its bytes (read-only; the file API's reads go through it).
   */
  private openFile(root: string, rel: string): OpenedFile {
    const instance = [...this.uppers.keys()].find((k) => this.paths?.sandboxRoot(k) === root);
    const bytes =
      instance !== undefined && this.mounts.has(root)
        ? this.files.get(this.uppers.get(instance)!)?.['/' + rel]
        : undefined;
    if (bytes === undefined) throw Object.assign(systemError('ENOENT', 'openat2'), { path: rel });
    const dir = fs.mkdtempSync(path.join(this.home, '.fake-file-'));
    try {
      const copy = path.join(dir, 'file');
      fs.writeFileSync(copy, bytes);
      const fd = fs.openSync(copy, 'r');
      return { fd, type: 'file', size: Buffer.byteLength(bytes), mode: 0o100644, uid: 0, gid: 0 };
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }

  /** OpenOptions that put a manager on this fake host. */
  openOptions(paths: StatePaths, extra: OpenOptions = {}): OpenOptions {
    return {
      home: this.home,
      native: this.native,
      helper: this.helper,
      criu: this.criu,
      cgroups: this.cgroupDriver,
      layers: this.layerPort(paths),
      proc: this.proc,
      clock: this.clock,
      // Id ranges and idmapped lowers are host mechanics, covered by test/integration/userns.test.ts.
      userNamespaces: false,
      ...extra,
    };
  }

  /** @internal */
  addWatcher(w: FakePidWatcher): void {
    this.watchers.add(w);
  }
  /** @internal */
  removeWatcher(w: FakePidWatcher): void {
    this.watchers.delete(w);
  }
}

/** The addon's pidfd watcher over the fake process table. */
class FakePidWatcher implements PidWatcher {
  private next = 1;
  private readonly byId = new Map<number, number>();
  constructor(
    private readonly host: FakeHost,
    private readonly onExit: (id: number) => void,
  ) {
    host.addWatcher(this);
  }
  watch(pid: number, expectedStart?: number): { id: number; start: number } | null {
    const p = this.host.processes.get(pid);
    if (!p || (expectedStart !== undefined && p.start !== expectedStart)) return null;
    const id = this.next++;
    this.byId.set(id, pid);
    return { id, start: p.start };
  }
  unwatch(id: number): void {
    this.byId.delete(id);
  }
  close(): void {
    this.host.removeWatcher(this);
    this.byId.clear();
  }
  exited(pid: number): void {
    for (const [id, p] of this.byId) {
      if (p !== pid) continue;
      this.byId.delete(id);
      setImmediate(() => this.onExit(id));
    }
  }
}
