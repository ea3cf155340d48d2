/**
 * The sandbox runtime: the ordered low-level steps that bring a sandbox's
 * pieces up and down (run folder, cgroup, writable layer, overlay root,
 * namespaces and init). Each step is idempotent so that teardown after a
 * failure or a crash can run them all without knowing how far setup got.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { helperPath, initPath, native } from '../native/binding.js';
import { HostError, SystemCallError, isNativeError } from '../errors.js';
import { parseHelperAnswer, type Supervisor } from '../host/supervisor.js';
import { mountsUnder, startTime } from '../host/proc.js';
import { killAndRemove, type CgroupDriver, type CgroupLimits } from '../host/cgroups.js';
import type { LayerStore } from '../layers/layer-store.js';
import type { StatePaths } from '../paths.js';

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
}

export class SandboxRuntime {
  private runtimeLayer: string | undefined;
  constructor(
    readonly paths: StatePaths,
    readonly cgroups: CgroupDriver,
    readonly layers: LayerStore,
    readonly supervisor: Supervisor,
    readonly homeTag: string,
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
   * /.lockstep/init and the mount-point directories. Content-addressed by the
   * init binary, so checkpoints made with one build keep restoring with it.
   */
  ensureRuntimeLayer(): string {
    // Every create and fork asks; the init binary cannot change under a
    // running manager, so it is read and hashed once.
    if (this.runtimeLayer) return this.runtimeLayer;
    const bin = fs.readFileSync(initPath);
    const hash = createHash('sha256').update(bin).digest('hex').slice(0, 16);
    const dir = this.paths.runtimeLayer(hash);
    if (fs.existsSync(path.join(dir, '.lockstep', 'init'))) return (this.runtimeLayer = hash);
    const tmp = `${dir}.tmp-${process.pid}`;
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.mkdirSync(tmp, { recursive: true, mode: 0o755 });
    for (const [d, mode] of RUNTIME_DIRS) {
      fs.mkdirSync(path.join(tmp, d), { mode });
      fs.chmodSync(path.join(tmp, d), mode);
    }
    fs.writeFileSync(path.join(tmp, '.lockstep', 'init'), bin, { mode: 0o755 });
    try {
      fs.renameSync(tmp, dir);
    } catch (e) {
      fs.rmSync(tmp, { recursive: true, force: true });
      if (!fs.existsSync(path.join(dir, '.lockstep', 'init'))) throw e;
    }
    return (this.runtimeLayer = hash);
  }

  /** Run folder, device folder and the cgroup. */
  prepare(id: string, limits: CgroupLimits): void {
    fs.mkdirSync(this.paths.sandboxRoot(id), { recursive: true, mode: 0o700 });
    fs.mkdirSync(this.paths.sandboxDev(id), { recursive: true, mode: 0o755 });
    this.cgroups.create(this.cgroupName(id), limits);
  }

  /** Mounts the overlay root (runtime layer and image below, the writable layer on top), then sets the layer's disk quota. */
  mountRoot(host: SandboxHost): void {
    const target = this.paths.sandboxRoot(host.id);
    if (!mountsUnder(target).includes(target)) {
      const { upper, work } = this.layers.upperDir(host.id);
      try {
        native().mountOverlay(target, [this.paths.runtimeLayer(host.runtimeLayer), host.imageRootfs], upper, work);
      } catch (e) {
        if (isNativeError(e)) {
          const hint = e.code === 'ELOOP' ? 'overlay directories may not overlap' : e.code === 'ENOENT' ? 'a layer directory is missing' : e.message;
          throw new SystemCallError('OVERLAY_MOUNT_FAILED', `Cannot mount the sandbox root at ${target}: ${hint}`, e);
        }
        throw e;
      }
    }
    this.layers.setQuota(host.id, host.diskBytes ?? null);
  }

  /** Starts namespaces + init under the supervisor; returns the init's host pid and start time. */
  async startInit(host: SandboxHost): Promise<{ pid: number; start: number }> {
    const argv = [
      helperPath,
      'create',
      '--root',
      this.paths.sandboxRoot(host.id),
      '--dev',
      this.paths.sandboxDev(host.id),
      '--hostname',
      host.hostname,
      ...this.cgroups.procsFiles(this.cgroupName(host.id)).flatMap((f) => ['--cgroup', f]),
    ];
    const answer = await this.supervisor.run(argv);
    const { pid } = parseHelperAnswer<{ pid: number }>(answer, `starting sandbox ${host.id}`);
    const start = startTime(pid);
    if (start === undefined) throw new HostError('SANDBOX_INIT_DIED', `The init of sandbox ${host.id} exited right after it started`);
    return { pid, start };
  }

  /** The /dev folder of a sandbox CRIU will restore into (forks); its network namespace is made by the restore. */
  async prepareForRestore(id: string): Promise<void> {
    const answer = await this.supervisor.run([helperPath, 'prepare', '--dev', this.paths.sandboxDev(id)]);
    parseHelperAnswer(answer, `preparing sandbox ${id}`);
  }

  /** Kills every process of the sandbox (idempotent). */
  async killProcesses(id: string): Promise<void> {
    await this.cgroups.kill(this.cgroupName(id));
  }

  /** Unmounts the root (lazily: a process of another tool may still look at it). */
  unmountRoot(id: string): void {
    for (const m of mountsUnder(this.paths.sandboxRoot(id))) native().unmount(m, true);
  }

  /** Everything a sandbox has on the host, removed in reverse order; safe to repeat. */
  async destroy(id: string): Promise<void> {
    await this.killProcesses(id).catch(() => undefined);
    for (const m of mountsUnder(this.paths.sandboxRun(id))) native().unmount(m, true);
    await this.layers.deleteUpper(id);
    fs.rmSync(this.paths.sandboxRun(id), { recursive: true, force: true });
    await killAndRemove(this.cgroups, this.cgroupName(id));
  }
}
