/**
 * The sandbox runtime: the ordered low-level steps that bring a sandbox's
 * pieces up and down (run folder, cgroup, writable layer, overlay root,
 * namespaces and init). Each step is idempotent so that teardown after a
 * failure or a crash can run them all without knowing how far setup got.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { helperPath, initPath, relayPath } from '../native/binding.js';
import { HostError, StoreFullError, SystemCallError, isNativeError } from '../errors.js';
import { createArgs, parseHelperAnswer } from '../host/helper-protocol.js';
import { killAndRemove, type CgroupDriver, type CgroupLimits } from '../host/cgroups.js';
import type { HelperClient, LayerPort, NativeBinding, ProcessTable } from '../ports.js';
import type { StatePaths } from '../paths.js';
import { ID_RANGE_SIZE } from './id-ranges.js';
import type { HostNetwork } from '../host/network/host-network.js';

/** Directories every sandbox root has, whatever the image: they sit in the runtime layer. */
const RUNTIME_DIRS: [string, number][] = [
  ['.lockstep', 0o755],
  ['proc', 0o555],
  ['dev', 0o755],
  ['sys', 0o555],
  ['tmp', 0o1777],
  ['workspace', 0o755],
  ['root', 0o700],
  ['run', 0o755],
];

/** The pieces of one sandbox on the host. */
export interface SandboxHost {
  id: string;
  imageRootfs: string;
  runtimeLayer: string;
  hostname: string;
  /** Disk quota of the writable layer in bytes; null or absent for none. */
  diskBytes?: number | null | undefined;
  /** First host id of the sandbox's user namespace; null or absent without one (see id-ranges.ts). */
  idBase?: number | null | undefined;
}

export class SandboxRuntime {
  private runtimeLayer: string | undefined;
  constructor(
    readonly paths: StatePaths,
    readonly cgroups: CgroupDriver,
    readonly layers: LayerPort,
    readonly supervisor: HelperClient,
    readonly homeTag: string,
    readonly native: NativeBinding,
    readonly proc: ProcessTable,
    /** Egress instances' veth pairs go in destroy(); absent in unit tests' runtimes. */
    readonly network?: HostNetwork,
  ) {}

  /** cgroup name of a sandbox: lockstep/<homeTag>/<id>. */
  cgroupName(id: string): string {
    return `lockstep/${this.homeTag}/${id}`;
  }

  get cgroupGroup(): string {
    return `lockstep/${this.homeTag}`;
  }

  /**
   * The runtime layer: a read-only lower layer on top of the image holding
   * /.lockstep/init, /.lockstep/relay (interactive processes: relay.ts) and
   * the mount-point directories. Content-addressed by the two binaries, so
   * checkpoints made with one build keep restoring with it.
   */
  ensureRuntimeLayer(): string {
    // Every create and fork asks; the binaries cannot change under a
    // running manager, so they are read and hashed once.
    if (this.runtimeLayer) return this.runtimeLayer;
    const bin = fs.readFileSync(initPath);
    const relay = fs.readFileSync(relayPath);
    const hash = createHash('sha256').update(bin).update(relay).digest('hex').slice(0, 16);
    const dir = this.paths.runtimeLayer(hash);
    if (fs.existsSync(path.join(dir, '.lockstep', 'relay'))) return (this.runtimeLayer = hash);
    const tmp = `${dir}.tmp-${process.pid}`;
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.mkdirSync(tmp, { recursive: true, mode: 0o755 });
    for (const [d, mode] of RUNTIME_DIRS) {
      fs.mkdirSync(path.join(tmp, d), { mode });
      fs.chmodSync(path.join(tmp, d), mode);
    }
    fs.writeFileSync(path.join(tmp, '.lockstep', 'init'), bin, { mode: 0o755 });
    fs.writeFileSync(path.join(tmp, '.lockstep', 'relay'), relay, { mode: 0o755 });
    try {
      fs.renameSync(tmp, dir);
    } catch (e) {
      fs.rmSync(tmp, { recursive: true, force: true });
      if (!fs.existsSync(path.join(dir, '.lockstep', 'relay'))) throw e;
    }
    return (this.runtimeLayer = hash);
  }

  /**
   * Run folder, device folder and the cgroup. With a user namespace the run
   * folder is open to the sandbox's root group (0750): CRIU resolves the
   * root and /dev paths from inside the restored namespace (before its maps
   * are written as host root, after as the sandboxes's root), and no other
   * host user (nor another sandbox's ids) may enter it.
   */
  prepare(id: string, limits: CgroupLimits, owner: number | null = null): void {
    fs.mkdirSync(this.paths.sandboxRoot(id), { recursive: true, mode: 0o700 });
    if (owner !== null) {
      fs.chownSync(this.paths.sandboxRun(id), 0, owner);
      fs.chmodSync(this.paths.sandboxRun(id), 0o750);
    }
    fs.mkdirSync(this.paths.sandboxDev(id), { recursive: true, mode: 0o755 });
    this.cgroups.create(this.cgroupName(id), limits);
  }

  /**
   * Mounts the overlay root: runtime layer and image below, the writable
   * layer on top; then sets the layer's disk quota. With a user namespace
   * the lower layers go in through idmapped mounts (on-disk id N reads as
   * idBase+N), so the image stays shared and untouched, while the writable
   * layer holds the sandbox's host ids on disk (its top directory belongs to
   * the sandbox's root).
   */
  async mountRoot(host: SandboxHost, opts: { fresh?: boolean } = {}): Promise<void> {
    const target = this.paths.sandboxRoot(host.id);
    // A new instance (`fresh`: its key was just made) has nothing mounted yet;
    // mountinfo grows with every sandbox on the host, so it is not read then.
    const mounted = opts.fresh ? [] : this.proc.mountsUnder(this.paths.sandboxRun(host.id));
    if (!mounted.includes(target)) {
      const { upper, work } = this.layers.upperDir(host.id);
      try {
        let lowers = [this.paths.runtimeLayer(host.runtimeLayer), host.imageRootfs];
        const idBase = host.idBase ?? null;
        if (idBase !== null) lowers = await this.idmappedLowers(host.id, lowers, idBase, mounted);
        this.native.mountOverlay(target, lowers, upper, work);
      } catch (e) {
        // overlayfs makes its work directory in the writable layer at mount time.
        if (isNativeError(e) && e.code === 'ENOSPC')
          throw new StoreFullError(`Cannot mount the sandbox root at ${target}`, e);
        if (isNativeError(e)) {
          const hint =
            e.code === 'ELOOP'
              ? 'overlay directories may not overlap'
              : e.code === 'ENOENT'
                ? 'a layer directory is missing'
                : e.message;
          throw new SystemCallError('OVERLAY_MOUNT_FAILED', `Cannot mount the sandbox root at ${target}: ${hint}`, e);
        }
        throw e;
      }
    }
    await this.layers.prepareShm(host.id, host.idBase ?? null);
    this.layers.setQuota(host.id, host.diskBytes ?? null);
  }

  /**
   * The idmapped views of the lower layers, under the instance's run folder
   * (so destroy unmounts them); `mounted`: the mounts already under that
   * folder (a crashed attempt's are replaced).
   */
  private async idmappedLowers(id: string, dirs: string[], idBase: number, mounted: string[]): Promise<string[]> {
    const root = this.paths.sandboxLowers(id);
    const targets = dirs.map((_, i) => path.join(root, String(i)));
    for (const m of mounted) if (m === root || m.startsWith(root + '/')) this.native.unmount(m, true);
    for (const t of targets) fs.mkdirSync(t, { recursive: true, mode: 0o700 });
    await this.native.idmappedMounts(
      dirs.map((d, i) => [d, targets[i]!]),
      idBase,
      ID_RANGE_SIZE,
      true,
    );
    return targets;
  }

  /** Starts namespaces + init under the supervisor; returns the init's host pid and start time. */
  async startInit(host: SandboxHost): Promise<{ pid: number; start: number }> {
    const argv = [
      helperPath,
      ...createArgs({
        root: this.paths.sandboxRoot(host.id),
        dev: this.paths.sandboxDev(host.id),
        shm: this.layers.shmDir(host.id),
        hostname: host.hostname,
        cgroupProcs: this.cgroups.procsFiles(this.cgroupName(host.id)),
        idRange: host.idBase == null ? null : { base: host.idBase, count: ID_RANGE_SIZE },
      }),
    ];
    const answer = await this.supervisor.run(argv);
    const { pid } = parseHelperAnswer<{ pid: number }>(answer, `starting sandbox ${host.id}`);
    const start = this.proc.startTime(pid);
    if (start === undefined)
      throw new HostError('SANDBOX_INIT_DIED', `The init of sandbox ${host.id} exited right after it started`);
    return { pid, start };
  }

  /**
   * The /dev folder of a sandbox CRIU will restore into (forks, standbys);
   * its network namespace is made by the restore. The addon makes it in
   * place: no helper process is spawned for it (see dev-folder.h).
   */
  async prepareForRestore(id: string): Promise<void> {
    try {
      await this.native.makeDevFolder(this.paths.sandboxDev(id));
    } catch (e) {
      if (isNativeError(e))
        throw new SystemCallError('DEV_FOLDER_FAILED', `Cannot make the /dev folder of sandbox ${id}: ${e.message}`, e);
      throw e;
    }
  }

  /** Kills every process of the sandbox (idempotent). */
  async killProcesses(id: string): Promise<void> {
    await this.cgroups.kill(this.cgroupName(id));
  }

  /** Unmounts the root (lazily: a process of another tool may still look at it). */
  unmountRoot(id: string): void {
    for (const m of this.proc.mountsUnder(this.paths.sandboxRoot(id))) this.native.unmount(m, true);
    for (const m of this.proc.mountsUnder(this.paths.sandboxLowers(id))) this.native.unmount(m, true);
  }

  /** Everything a sandbox has on the host, removed in reverse order; safe to repeat. */
  async destroy(id: string): Promise<void> {
    await this.killProcesses(id).catch(() => undefined);
    // A pair whose sandbox side was never moved (a restore that failed before
    // setup-namespaces) would outlive the processes; a moved one dies with
    // its namespace, and deleting it now only does that sooner.
    await this.network?.removeLinks(id);
    for (const m of this.proc.mountsUnder(this.paths.sandboxRun(id))) this.native.unmount(m, true);
    await this.layers.deleteUpper(id);
    fs.rmSync(this.paths.sandboxRun(id), { recursive: true, force: true });
    await killAndRemove(this.cgroups, this.cgroupName(id));
  }
}
