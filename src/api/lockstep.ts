/**
 * Lockstep: the manager of one state directory. Open it, then create, get,
 * list and remove sandboxes; checkpoint, rollback and fork them. The CLI,
 * the HTTP server and the MCP server all call these same methods.
 */
import fs from 'node:fs';
import path from 'node:path';
import type net from 'node:net';
import { createHash } from 'node:crypto';
import type BetterSqlite3 from 'better-sqlite3';
import { Catalog } from '../catalog/catalog.js';
import { migrateExtension } from '../catalog/extensions.js';
import { detectCgroups, type CgroupDriver } from '../host/cgroups.js';
import { CriuService } from '../host/criu-service.js';
import { Supervisor } from '../host/supervisor.js';
import { DockerEngine, type DockerPort } from '../host/docker.js';
import { ImageStore } from '../images/image-store.js';
import { LayerStore } from '../layers/layer-store.js';
import { StatePaths } from '../paths.js';
import { SandboxRuntime } from '../instances/runtime.js';
import { ProcessExits } from '../instances/process-exits.js';
import { InitWatcher } from '../instances/init-watcher.js';
import { SandboxLocks, type Engine } from './engine.js';
import { Admission } from '../admission.js';
import { LISTING_LIMITS } from './observed-files.js';
import { envFaultHook, type FaultHook } from '../faults.js';
import { createLogger, type Logger } from '../log.js';
import { assertSupportedPlatform, native as loadNative } from '../native/binding.js';
import { HostError, InvalidArgumentError } from '../errors.js';
import { reap, type ReapReport } from '../lifecycle/reaper.js';
import { AgentState } from '../agent-state/agent-state.js';
import { Tenants } from './tenants.js';
import { createSandbox, type CreateOptions } from '../lifecycle/create.js';
import { removeSandbox } from '../lifecycle/remove.js';
import { Sandbox, sandboxInfo, type SandboxInfo } from './sandbox.js';
import { openHomeForUserNamespaces } from '../instances/id-ranges.js';
import { resolveConfig, type ConfigOptions, type LockstepConfig } from '../config.js';
import { Snapshots } from './snapshots.js';
import { startFromSnapshot } from '../snapshots/snapshots.js';
import { LockstepError, type ErrorCode } from '../errors.js';
import { HostNetwork } from '../host/network/host-network.js';
import { SandboxResolver, systemUpstream } from '../network/dns.js';
import { ExposedPorts, type ExposureCredentials } from '../network/exposed-ports.js';
import {
  procfs,
  systemClock,
  type Clock,
  type CriuClient,
  type HelperClient,
  type LayerPort,
  type NativeBinding,
  type ProcessTable,
} from '../ports.js';

export interface OpenOptions {
  /** State directory (default: LOCKSTEP_HOME or /var/lib/lockstep). */
  home?: string | undefined;
  /** Settings that beat their environment variables (src/config.ts); resolved once, here. */
  config?: ConfigOptions | undefined;
  logger?: Logger | undefined;
  docker?: DockerPort | undefined;
  /** Crash-injection hook for tests (default: LOCKSTEP_FAULT). */
  fault?: FaultHook | undefined;
  /**
   * Give new sandboxes a user namespace, root inside mapped to an unprivileged host
   * id range (default: yes, unless LOCKSTEP_USERNS=off).
   */
  userNamespaces?: boolean | undefined;
  // The ports (src/ports.ts). Each defaults to the real host's; a manager
  // given all the privileged ones (native, helper, criu, cgroups, layers)
  // does not need root, which is how test/unit/ runs the engine.
  /** The native addon's surface. */
  native?: NativeBinding | undefined;
  /** The supervisor client (starts inits and the CRIU service). */
  helper?: HelperClient | undefined;
  criu?: CriuClient | undefined;
  cgroups?: CgroupDriver | undefined;
  layers?: LayerPort | undefined;
  proc?: ProcessTable | undefined;
  clock?: Clock | undefined;
}

/** What open() has resolved before it takes the state directory's lock. */
interface Opening {
  opts: OpenOptions;
  config: LockstepConfig;
  native: NativeBinding;
  proc: ProcessTable;
  clock: Clock;
  paths: StatePaths;
  lockFd: number;
  fault: FaultHook;
}

/** Manager of one state directory. */
export class Lockstep {
  /** @internal */
  readonly engine: Engine;
  readonly home: string;
  /**
   * The tenants of this state directory: bearer tokens, quotas, usage and
   * stored idempotent replies (what `lockstep tenant` and the HTTP server use).
   */
  readonly tenants: Tenants;
  /** What the reaper cleaned up when this manager opened. */
  readonly reaped: ReapReport | null;
  /** Named snapshots: checkpoints promoted to outlive their sandbox, exported, imported, pulled. */
  readonly snapshots: Snapshots;
  private lockFd: number | null;
  private closed = false;

  private constructor(engine: Engine, lockFd: number, reaped: ReapReport | null) {
    this.engine = engine;
    this.home = engine.paths.home;
    this.tenants = new Tenants(engine);
    this.lockFd = lockFd;
    this.reaped = reaped;
    this.snapshots = new Snapshots(engine, () => this.assertOpen());
  }

  /** Opens (and if needed initialises) a state directory; reaps what a crashed manager left. */
  static async open(opts: OpenOptions = {}): Promise<Lockstep> {
    assertSupportedPlatform();
    const privileged = !(opts.native && opts.helper && opts.criu && opts.cgroups && opts.layers);
    if (privileged && process.getuid?.() !== 0)
      throw new HostError('NOT_ROOT', 'Lockstep manages namespaces, cgroups and mounts: run it as root');
    const config = resolveConfig({ ...opts.config, home: opts.home ?? opts.config?.home });
    const native = opts.native ?? loadNative();
    const paths = new StatePaths(config.home);
    fs.mkdirSync(paths.home, { recursive: true, mode: 0o700 });
    fs.chmodSync(paths.home, 0o700);
    for (const d of [paths.images, paths.runtime, paths.run, paths.sandboxesRun, paths.locks])
      fs.mkdirSync(d, { recursive: true, mode: 0o700 });

    const lockFd = fs.openSync(paths.managerLock, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
    const fault = opts.fault ?? envFaultHook(config.fault);
    // A manager that failed to open must let go of the lock (other managers
    // would wait for it, then fail with HOME_LOCKED) and of the database.
    const opened: { catalog?: Catalog } = {};
    try {
      const opening: Opening = {
        opts,
        config,
        native,
        proc: opts.proc ?? procfs,
        clock: opts.clock ?? systemClock,
        paths,
        lockFd,
        fault,
      };
      return await Lockstep.openLocked(opening, (c) => (opened.catalog = c));
    } catch (e) {
      try {
        opened.catalog?.close();
      } finally {
        fs.closeSync(lockFd);
      }
      throw e;
    }
  }

  /** open()'s steps once the state directory's lock file is open; open() unwinds them on failure. */
  private static async openLocked(opening: Opening, opened: (c: Catalog) => void): Promise<Lockstep> {
    const { opts, config, native, proc, clock, paths, lockFd, fault } = opening;
    const exclusive = native.flock(lockFd, true);
    if (!exclusive) {
      for (let i = 0; !native.flock(lockFd, false); i++) {
        if (i > 2000)
          throw new HostError('HOME_LOCKED', `Cannot open ${paths.home}: another manager holds it exclusively`);
        await clock.sleep(5);
      }
    }

    const log = opts.logger ?? createLogger(config.logLevel);
    const catalog = new Catalog(paths.catalog);
    opened(catalog);
    fault('open:catalog');
    const layers = opts.layers ?? LayerStore.open(paths, config);
    ensureSharedRunFolder(native, proc, paths.sandboxesRun);
    const userNamespaces = opts.userNamespaces ?? config.userNamespaces;
    if (userNamespaces) openHomeForUserNamespaces(paths);
    const supervisor = opts.helper ?? new Supervisor(paths, config.criuBinary, config.wpKeeper);
    await supervisor.ensureRunning();
    const cgroups = opts.cgroups ?? detectCgroups();
    const homeTag = createHash('sha256').update(paths.home).digest('hex').slice(0, 10);
    const network = new HostNetwork(
      { range: config.networkRange, deny: config.networkDeny },
      homeTag,
      log,
      `${paths.run}/network-used`,
    );
    const runtime = new SandboxRuntime(paths, cgroups, layers, supervisor, homeTag, native, proc, network);
    const upstream = config.dnsUpstream;
    const dns = new SandboxResolver(network, () => upstream ?? systemUpstream(), log);
    let docker: DockerPort | undefined = opts.docker;
    const images = new ImageStore(
      paths,
      catalog,
      () => (docker ??= new DockerEngine({ socketPath: config.dockerSocket })),
      { cacheDir: config.cacheDir, native },
    );
    const locks = new SandboxLocks((id) => paths.sandboxLock(id), native.flock.bind(native), clock);
    const withSandboxLock: Engine['withSandboxLock'] = (id, fn, o) => locks.with(id, fn, o?.timeoutMs);
    const engine: Engine = {
      config,
      paths,
      catalog,
      native,
      proc,
      clock,
      cgroups,
      layers,
      supervisor,
      criu: opts.criu ?? new CriuService(paths, supervisor, config, native, log),
      images,
      runtime,
      log,
      fault,
      agent: new AgentState(catalog.db, catalog, { owner: exclusive }),
      inits: new InitWatcher(catalog, runtime, withSandboxLock, log, (onExit) => new native.PidWatcher(onExit)),
      exits: new ProcessExits((onExit) => new native.PidWatcher(onExit)),
      userNamespaces,
      listings: new Admission(LISTING_LIMITS),
      network,
      dns,
      exposures: new ExposedPorts({ catalog, clock, config, native, proc }),
      withSandboxLock,
      drainLocks: () => locks.drain(),
    };
    let reaped: ReapReport | null = null;
    if (exclusive) {
      reaped = await reap(engine);
      fault('open:reaped');
      if (reaped.operations.length || reaped.sandboxes.length || reaped.orphans.length)
        log.warn({ reaped }, 'cleaned up after a previous manager');
      native.flock(lockFd, false); // downgrade: other managers may now share the directory
    }
    // Every init found running is watched from now on (the reaper has
    // already stopped the ones that died while no manager was open).
    for (const row of catalog.allSandboxes()) {
      engine.inits.track(row);
      if (row.state === 'running') void dns.open(row);
    }
    const ls = new Lockstep(engine, lockFd, reaped);
    if (exclusive) await ls.sweepExpired();
    return ls;
  }

  /** LOCKSTEP_PUBLIC_URL: where `lockstep serve` is reached from outside (the base of exposed ports' URLs), if set. */
  get publicUrl(): string | undefined {
    return this.engine.config.publicUrl;
  }

  get images(): ImageStore {
    return this.engine.images;
  }

  /** The manager's logger (OpenOptions.logger, or its own pino logger); front ends log through child loggers of it. */
  get logger(): Logger {
    return this.engine.log;
  }

  /**
   * The catalog's SQLite database, for a catalog extension that keeps its
   * own tables in it (the LangGraph saver, src/integrations/langgraph.ts):
   * first brings the tables of the extension registered under `name`
   * (src/catalog/extensions.ts) to their latest version. Refuses an
   * unregistered name (INVALID_ARGUMENT) and tables written by a newer
   * Lockstep (CATALOG_TOO_NEW). The extension reads and writes its own
   * tables only; the catalog's are the manager's.
   */
  extensionDatabase(name: string): BetterSqlite3.Database {
    this.assertOpen();
    migrateExtension(this.engine.catalog.db, name);
    return this.engine.catalog.db;
  }

  /**
   * Creates and starts a sandbox from an image (default "base"), or from a
   * snapshot (`fromSnapshot`: its processes, files and lineage resume; its
   * limits are the snapshot's source's).
   */
  async create(opts: CreateOptions = {}): Promise<Sandbox> {
    this.assertOpen();
    if (opts.fromSnapshot !== undefined) {
      const other = (
        [
          'image',
          'memoryMb',
          'pids',
          'cpuWeight',
          'cpus',
          'ioWeight',
          'diskMb',
          'envs',
          'metadata',
          'hostname',
          'timeoutMs',
        ] as const
      ).find((k) => opts[k] !== undefined);
      if (other)
        throw new InvalidArgumentError(
          other,
          "nothing with fromSnapshot (a sandbox started from a snapshot has its source's image and limits)",
          opts[other],
        );
      if (typeof opts.fromSnapshot !== 'string' || !opts.fromSnapshot)
        throw new InvalidArgumentError('fromSnapshot', 'a snapshot id or name', opts.fromSnapshot);
      const [r] = await startFromSnapshot(this.engine, opts.fromSnapshot, { tenant: opts.tenant });
      if (!r!.ok) throw new LockstepError(r!.error.code as ErrorCode, r!.error.message);
      return new Sandbox(this.engine, r!.id);
    }
    const row = await createSandbox(this.engine, opts);
    return new Sandbox(this.engine, row.id);
  }

  /** A handle on an existing sandbox; SANDBOX_NOT_FOUND otherwise (also for another tenant's). */
  get(id: string, tenant?: string | null): Sandbox {
    this.assertOpen();
    if (typeof id !== 'string' || !id) throw new InvalidArgumentError('id', 'a sandbox id', id);
    this.engine.catalog.requireSandbox(id, tenant);
    return new Sandbox(this.engine, id);
  }

  /** The sandboxes (a tenant's, when given), oldest first; with `metadata`, those whose labels include every pair. */
  list(tenant?: string | null, filter: { metadata?: Record<string, string> | undefined } = {}): SandboxInfo[] {
    this.assertOpen();
    const metadata = validateMetadataFilter(filter.metadata);
    return this.engine.catalog.sandboxes(tenant, metadata).map((r) => sandboxInfo(r, this.engine.config.networkRange));
  }

  /**
   * A connection to an exposed port (`sandbox.ports.expose`) for whoever
   * presents its token or is its tenant: what `lockstep serve`'s proxy calls
   * per request. EXPOSURE_NOT_FOUND for a wrong token, another tenant or a
   * closed port alike; PORT_NOT_LISTENING, PORT_UNREACHABLE (no accept in
   * time), SANDBOX_NOT_RUNNING, QUOTA_EXCEEDED (too many open at once).
   */
  async connectExposedPort(
    id: string,
    creds: ExposureCredentials,
  ): Promise<{ socket: net.Socket; sandboxId: string; port: number }> {
    this.assertOpen();
    const target = this.engine.exposures.authorize(id, creds);
    return { socket: await this.engine.exposures.connect(target), sandboxId: target.sandboxId, port: target.port };
  }

  /** Removes a sandbox with its processes, layers and checkpoints. Idempotent for missing ids only via the error. */
  async remove(id: string, tenant?: string | null): Promise<void> {
    this.assertOpen();
    this.engine.catalog.requireSandbox(id, tenant);
    await this.engine.withSandboxLock(id, () => removeSandbox(this.engine, id));
  }

  /** Removes sandboxes whose lifetime (create's timeoutMs) has passed; returns their ids. */
  async sweepExpired(now = this.engine.clock.now()): Promise<string[]> {
    this.assertOpen();
    const expired = this.engine.catalog
      .allSandboxes()
      .filter((s) => s.expires_at !== null && s.expires_at <= now && s.state !== 'removing');
    for (const s of expired)
      await this.engine
        .withSandboxLock(s.id, () => removeSandbox(this.engine, s.id))
        .catch((err) => this.engine.log.warn({ err, sandboxId: s.id }, 'could not remove an expired sandbox'));
    return expired.map((s) => s.id);
  }

  /** Closes the catalog and releases the state directory; sandboxes keep running. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.engine.inits.close();
    this.engine.exits.close();
    await this.engine.drainLocks(); // background standby work needs the catalog
    await this.engine.dns.closeAll();
    this.engine.network.close();
    this.engine.catalog.close();
    if (this.lockFd !== null) {
      fs.closeSync(this.lockFd);
      this.lockFd = null;
    }
  }

  /**
   * Removes every sandbox, stops the supervisor and CRIU service, and
   * unmounts the layer store. For tests and uninstall; the state directory's
   * files stay unless `deleteFiles` is set.
   */
  async destroyAll(opts: { deleteFiles?: boolean } = {}): Promise<void> {
    await this.engine.drainLocks();
    for (const s of this.engine.catalog.allSandboxes()) await removeSandbox(this.engine, s.id).catch(() => undefined);
    await this.engine.supervisor.stop();
    await this.close();
    try {
      this.engine.cgroups.remove(this.engine.runtime.cgroupGroup);
    } catch {
      /* not empty: a sandbox of this directory could not be removed */
    }
    for (const m of this.engine.proc.mountsUnder(this.engine.paths.run)) this.engine.native.unmount(m, true);
    // An injected layer store is its owner's to unmount.
    if (this.engine.layers instanceof LayerStore) LayerStore.unmount(this.engine.paths);
    if (opts.deleteFiles) {
      // The state directory's own nftables table goes with it (only if egress was ever used: no nft run otherwise).
      if (fs.existsSync(this.engine.network.markerFile)) await this.engine.network.removeTable();
      // A process of a sandbox killed a moment ago may still be writing its last bytes below home:
      // rm retries ENOTEMPTY/EBUSY (seen once in a test's teardown) instead of failing at once.
      fs.rmSync(this.home, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 });
    }
  }

  private assertOpen(): void {
    if (this.closed) throw new HostError('MANAGER_CLOSED', 'This Lockstep manager has been closed');
  }
}

/**
 * The sandboxes' run folder is a shared mount, so that roots and network
 * namespaces mounted there later also appear in the CRIU service's mount
 * namespace (a slave of the host's). It is a tmpfs: it holds only mount
 * points, `/dev` folders and id-mapped views, all of them gone at a reboot,
 * and each fork makes and later removes a few dozen of those inodes: an
 * instance folder's life costs 0.34-0.36 ms on tmpfs against 0.9-1.3 ms on
 * ext4 (docs/decisions/run-folder-tmpfs.md, "The run folder on tmpfs"). A folder that is
 * already shared (this boot's tmpfs, or an earlier version's bind mount with
 * live sandboxes below it) is kept as it is. A folder that is no mount at
 * all holds a previous boot's leftovers: with nothing mounted below it,
 * they are removed first, so nothing stays hidden under the tmpfs.
 */
function ensureSharedRunFolder(native: NativeBinding, proc: ProcessTable, dir: string): void {
  const propagation = proc.mountPropagation(dir);
  if (propagation === 'shared') return;
  if (propagation === undefined) {
    if (proc.mountsUnder(dir).length === 0)
      for (const name of fs.readdirSync(dir)) fs.rmSync(path.join(dir, name), { recursive: true, force: true });
    native.mountTmpfs(dir, `mode=0700,size=${RUN_FOLDER_BYTES}`);
  }
  native.makeSharedMount(dir, false);
}

/** The sandboxes' run folder's size: inodes only (folders, device nodes, links), a few KiB a sandbox. */
const RUN_FOLDER_BYTES = 64 << 20;

/** A list filter on labels: an object of at most 64 string values (a sandbox has at most 64 labels). */
function validateMetadataFilter(metadata: unknown): Record<string, string> {
  if (metadata === undefined) return {};
  if (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata))
    throw new InvalidArgumentError('metadata', 'an object of string values', metadata);
  const entries = Object.entries(metadata);
  if (entries.length > 64) throw new InvalidArgumentError('metadata', 'at most 64 labels', entries.length);
  for (const [k, v] of entries)
    if (typeof v !== 'string') throw new InvalidArgumentError(`metadata.${k}`, 'a string', v);
  return metadata as Record<string, string>;
}
