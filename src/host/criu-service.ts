/**
 * CRIU, driven through its RPC protocol. A long-lived `criu service` per
 * state directory (a daemon child of the supervisor) answers every dump and
 * restore, so no call pays for exec'ing criu; libcriu in the addon speaks
 * the protocol. Failures carry the tail of CRIU's own log.
 */
import fs from 'node:fs';
import path from 'node:path';
import { native as loadNative, type CriuRequest, type NativeBinding } from '../native/binding.js';
import { CriuError, HostError, SETUP_HINT } from '../errors.js';
import type { StatePaths } from '../paths.js';
import type { CriuClient, CriuDumpRequest, CriuRestoreRequest, HelperClient } from '../ports.js';
import { DEFAULTS, envValue } from '../config.js';
import { sleep, startTime } from './proc.js';
import type { Logger } from '../log.js';

/**
 * Where scripts/provision-host.sh puts the CRIU 4.x wrapper; LOCKSTEP_CRIU
 * overrides (a manager reads its config instead).
 */
export const criuBinary = () =>
  envValue('LOCKSTEP_CRIU') ??
  (envValue('LOCKSTEP_WP_KEEPER') === 'off' ? DEFAULTS.stockCriuBinary : DEFAULTS.criuBinary);
export const MIN_CRIU_VERSION = 40000;

/** Last lines of a CRIU log, errors first: what a person needs to act on a failure. */
export function criuLogTail(file: string, lines = 25): string {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
  const all = text.split('\n').filter(Boolean);
  // "Can't setup RLIMIT_NOFILE" is printed by every criu call on these hosts and is harmless.
  const errors = all.filter((l) => /Error|error/.test(l) && !/RLIMIT_NOFILE/.test(l));
  const tail = all.slice(-lines);
  return [...new Set([...errors.slice(-10), ...tail])].join('\n');
}

/** The service socket is SOCK_SEQPACKET, so liveness is checked with a real RPC (version). */
async function serviceVersion(native: NativeBinding, socket: string): Promise<number | undefined> {
  if (!fs.existsSync(socket)) return undefined;
  try {
    return await native.criu({ op: 'version', serviceAddress: socket });
  } catch {
    return undefined;
  }
}

/** A keeper that would not start is tried again after this long; dumps meanwhile are whole. */
const KEEPER_RETRY_MS = 30_000;

/** Client of the state directory's CRIU service. */
export class CriuService implements CriuClient {
  /** The version verified by the last successful RPC; reset when a call cannot reach the service. */
  private verified: number | undefined;
  /** When the written-page keeper last failed to start (0: never). */
  private keeperFailedAt = 0;
  constructor(
    private readonly paths: StatePaths,
    private readonly supervisor: HelperClient,
    private readonly options: { criuBinary: string; keepCriuLogs: boolean; wpKeeper: string | null } = {
      criuBinary: criuBinary(),
      keepCriuLogs: envValue('LOCKSTEP_KEEP_CRIU_LOGS') !== undefined,
      wpKeeper: envValue('LOCKSTEP_WP_KEEPER') === 'off' ? null : (envValue('LOCKSTEP_WP_KEEPER') ?? DEFAULTS.wpKeeper),
    },
    private readonly native: NativeBinding = loadNative(),
    private readonly log: Pick<Logger, 'warn'> = { warn: () => undefined },
  ) {}

  get tracksWrites(): boolean {
    return this.options.wpKeeper !== null;
  }

  get address(): string {
    return this.paths.criuSocket;
  }

  /** Starts the service when needed and checks its version (once per process while it answers). */
  async ensureRunning(): Promise<number> {
    // A verified service is trusted until a call fails to reach it: the
    // version RPC costs ~0.6 ms, a visible share of a 20 ms checkpoint.
    if (this.verified !== undefined && fs.existsSync(this.paths.criuSocket)) return this.verified;
    let v = await serviceVersion(this.native, this.paths.criuSocket);
    if (v === undefined) {
      const bin = this.options.criuBinary;
      if (!fs.existsSync(bin)) {
        throw new HostError('CRIU_NOT_INSTALLED', `CRIU is not installed at ${bin}: ${SETUP_HINT}`);
      }
      fs.rmSync(this.paths.criuSocket, { force: true });
      await this.supervisor.daemon(this.paths.criuLog, [bin, 'service', '--address', this.paths.criuSocket], {
        isolatedRun: true,
      });
      // A deadline, not a count of polls: at load average 80 on 2 cores the
      // service once took longer to answer than 400 polls of 5 ms lasted.
      const deadline = Date.now() + 15_000;
      while (v === undefined && Date.now() < deadline) {
        await sleep(5);
        v = await serviceVersion(this.native, this.paths.criuSocket);
      }
      if (v === undefined)
        throw new CriuError('CRIU_UNAVAILABLE', 'The CRIU service did not start', criuLogTail(this.paths.criuLog));
    }
    if (v < MIN_CRIU_VERSION) {
      throw new HostError(
        'CRIU_TOO_OLD',
        `CRIU ${formatVersion(v)} is too old: Lockstep needs 4.0 or later ` +
          `(Debian 12's 3.17 fails on current kernels; see docs)`,
      );
    }
    this.verified = v;
    return v;
  }

  /** One RPC; if the service cannot be reached (it died), start it again and retry once. */
  private async call(req: CriuRequest): Promise<number> {
    try {
      return await this.native.criu({ ...req, serviceAddress: this.paths.criuSocket });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ECONNREFUSED' && code !== 'ENOENT' && code !== 'ECONNRESET' && code !== 'EPIPE') throw e;
      this.verified = undefined;
      await this.ensureRunning();
      return this.native.criu({ ...req, serviceAddress: this.paths.criuSocket });
    }
  }

  /**
   * Makes sure the written-page keeper listens (a supervisor daemon, like the
   * service) and that the configuration file naming it exists. False when it
   * cannot run: the dump is then an ordinary whole one, correct and larger.
   */
  private async keeperReady(): Promise<boolean> {
    const keeper = this.options.wpKeeper;
    if (keeper === null) return false;
    const socket = this.paths.wpKeeperSocket;
    if (this.native.seqpacketListening(socket)) return true;
    if (this.keeperFailedAt && Date.now() - this.keeperFailedAt < KEEPER_RETRY_MS) return false;
    try {
      if (!fs.existsSync(keeper))
        throw new HostError(
          'CRIU_NOT_INSTALLED',
          `The written-page keeper is not installed at ${keeper}: ${SETUP_HINT}`,
        );
      const line = `wp-keeper ${socket}\n`;
      if (fs.readFileSync(this.paths.criuTrackingConfig, { encoding: 'utf8', flag: 'a+' }) !== line)
        fs.writeFileSync(this.paths.criuTrackingConfig, line, { mode: 0o600 });
      fs.rmSync(socket, { force: true });
      await this.supervisor.daemon(this.paths.wpKeeperLog, [keeper, socket]);
      const deadline = Date.now() + 5_000;
      while (!this.native.seqpacketListening(socket)) {
        if (Date.now() > deadline)
          throw new HostError(
            'CRIU_UNAVAILABLE',
            `The written-page keeper did not start; see ${this.paths.wpKeeperLog}`,
          );
        await sleep(2);
      }
      this.keeperFailedAt = 0;
      return true;
    } catch (err) {
      this.keeperFailedAt = Date.now();
      this.log.warn({ err }, 'written-page tracking unavailable: checkpoints store every page until the keeper starts');
      return false;
    }
  }

  async dump(req: CriuDumpRequest): Promise<{ tracked: boolean }> {
    const logFile = req.logFile ?? 'dump.log';
    // Tracked: the dump arms (or re-arms) the processes' written-page
    // tracking, and stores only what was written since parentImg, when
    // that is the dump that last armed it (native/criu/README.md).
    const tracked = req.trackMem === true && this.tracksWrites && (await this.keeperReady());
    const request: CriuRequest = tracked
      ? { ...req, op: 'dump', logFile, trackMem: true, configFile: this.paths.criuTrackingConfig }
      : { ...req, op: 'dump', logFile, trackMem: false };
    if (!tracked) delete request.parentImg;
    // A worker that dies after forking (its first fork is a kerndat probe
    // child, made before the dump starts) leaves that fork holding the RPC
    // socket: the call would wait forever, with the tree frozen. Seen once in
    // a CI run: a checkpoint hung 30 min on a dead worker's probe child.
    const watch = this.watchForOrphans();
    try {
      await this.call(request);
      return { tracked };
    } catch (e) {
      const why = watch.fired ? ' (the CRIU worker died; the forks it left were killed)' : '';
      throw new CriuError(
        'CRIU_DUMP_FAILED',
        `CRIU could not dump process ${req.pid}${why}: ${(e as Error).message}`,
        criuLogTail(path.join(req.imagesDir, logFile)),
        e,
      );
    } finally {
      watch.stop();
    }
  }

  /**
   * Restores a tree; returns the host pid of its root. CRIU works (and logs)
   * in a scratch folder of its own, since the images are read-only checkpoint
   * data; the folder goes afterwards unless LOCKSTEP_KEEP_CRIU_LOGS is set.
   */
  async restore(request: CriuRestoreRequest & { workDirOwner?: number }): Promise<number> {
    const { workDirOwner, armTracking, ...rest } = request;
    // Armed: the restored processes' next dump with this image as parent stores only what they wrote since.
    const req: CriuRequest & { imagesDir: string } =
      armTracking === true && this.tracksWrites && (await this.keeperReady())
        ? { ...rest, op: 'restore', configFile: this.paths.criuTrackingConfig }
        : { ...rest, op: 'restore' };
    const logFile = req.logFile ?? 'restore.log';
    // On libuv's pool, like its removal below: the store's metadata calls can
    // wait for another fork's snapshot to commit, and forks run side by side.
    const workDir = await fs.promises.mkdtemp(path.join(this.paths.scratch, 'restore-'));
    // A tree restored into a user namespace works in it as its own root.
    if (workDirOwner !== undefined) {
      await fs.promises.chown(workDir, 0, workDirOwner);
      await fs.promises.chmod(workDir, 0o770);
    }
    const watch = this.watchForOrphans(req.cgroupProcs?.[0]);
    try {
      return await this.call({ ...req, op: 'restore', logFile, workDir });
    } catch (e) {
      const why = watch.fired ? ' (the CRIU worker died; the tasks it had restored were killed)' : '';
      throw new CriuError(
        'CRIU_RESTORE_FAILED',
        `CRIU could not restore from ${req.imagesDir}${why}: ${(e as Error).message}`,
        criuLogTail(path.join(workDir, logFile)),
        e,
      );
    } finally {
      watch.stop();
      if (!this.options.keepCriuLogs) await fs.promises.rm(workDir, { recursive: true, force: true });
    }
  }

  /**
   * Kills the service's workers and waits until they are gone. Only the
   * reaper calls this, holding the state directory alone: a worker still
   * busy then serves a manager that died mid-call, and left alone it would
   * go on writing into a checkpoint folder being discarded, or put back the
   * freezer state it found (frozen) after the reaper thawed the sandbox.
   * Returns how many there were.
   */
  async stopOrphanedWorkers(): Promise<number> {
    const service = servicePid(this.paths.criuSocket);
    if (service === undefined) return 0;
    const workers = childrenOf(service);
    const running = () => workers.some((w) => childrenOf(service).includes(w));
    // First let them finish: a dump cut by SIGKILL leaves CRIU's parasite
    // code and ptrace stops in the tasks it had seized, which then never
    // answer again (seen in faults-random-kill). A dump or restore takes well
    // under a second; one still running after the grace period is killed.
    for (let i = 0; i < ORPHAN_GRACE_MS / 10 && running(); i++) await sleep(10);
    for (const w of workers) {
      try {
        process.kill(w, 'SIGKILL');
      } catch {
        // finished meanwhile
      }
    }
    for (let i = 0; i < 1000 && running(); i++) await sleep(5);
    return workers.length;
  }

  /**
   * A CRIU worker killed half-way through a restore leaves the tasks it had
   * already made (and moved into the sandbox's cgroup) behind, stopped, and
   * they hold copies of the worker's end of the RPC socket, so the reply
   * never comes and the call would wait forever. While the call is pending,
   * a restored root whose parent is the supervisor (it was orphaned: a live
   * worker is its parent until it answers) for several checks in a row means
   * the worker is gone: its tasks are killed, which closes the socket and
   * fails the call. A dump has no restored tasks (no `procsFile`): only the
   * worker's orphaned forks are looked for.
   */
  private watchForOrphans(procsFile?: string): { stop: () => void; readonly fired: boolean } {
    let strikes = 0;
    const state = { fired: false, stop: () => clearInterval(timer) };
    const timer = setInterval(() => {
      const pids = procsFile === undefined ? [] : readPids(procsFile);
      let supervisor = 0;
      try {
        supervisor = Number(fs.readFileSync(this.paths.supervisorPidfile, 'utf8').trim());
      } catch {
        return;
      }
      // A worker killed before it moved anything into the cgroup leaves its
      // own forks (same argv as the service) behind, orphaned to the
      // supervisor: a live worker's forks are its children, and the service
      // itself is the one with that argv the supervisor started.
      const stray = criuOrphans(supervisor, this.paths.criuSocket);
      const orphaned = stray.length > 0 || pids.some((p) => parentOf(p) === supervisor);
      strikes = orphaned ? strikes + 1 : 0;
      if (strikes < ORPHAN_STRIKES) return;
      state.fired = true;
      for (const p of [...pids, ...stray]) {
        try {
          process.kill(p, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    }, ORPHAN_CHECK_MS);
    timer.unref();
    return state;
  }
}

/** How long the reaper lets a dead manager's CRIU workers finish before it kills them. */
const ORPHAN_GRACE_MS = 15_000;

/**
 * A restore's tasks orphaned for this many checks this far apart: its worker is
 * dead (a live one answers within a loop turn).
 */
const ORPHAN_CHECK_MS = 250;
const ORPHAN_STRIKES = 4;

/**
 * The pid of the `criu service` listening on socket, found in /proc (the
 * supervisor started it; nothing records it).
 */
function servicePid(socket: string): number | undefined {
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      if (argv.includes('service') && argv.includes(socket)) return Number(p);
    } catch {
      // exited meanwhile
    }
  }
  return undefined;
}

/**
 * CRIU processes whose parent is the supervisor, other than the `criu
 * service` listening on socket: forks of a worker that died, which hold its
 * end of the RPC socket. They are known by their executable (the service's:
 * CRIU runs through the private prefix's loader), not their argv: a restore
 * rewrites its title in place ("criu: restore --rpc"), and such orphans were
 * missed (faults-criu-killed hung 15 min in a fresh-clone run). A live
 * worker's forks are the worker's children; restored tasks have their own
 * executable back by the time the worker hands them over.
 */
function criuOrphans(supervisor: number, socket: string): number[] {
  const children = childrenOf(supervisor);
  const services = children.filter((p) => {
    try {
      const argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      return argv.includes('service') && argv.includes(socket);
    } catch {
      return false;
    }
  });
  if (services.length === 0) return [];
  // The service is the oldest: every other one was forked from it, later.
  const service = services.map((p) => ({ p, at: startTime(p) ?? Infinity })).reduce((a, b) => (b.at < a.at ? b : a)).p;
  const exe = exeOf(service);
  if (exe === undefined) return [];
  return children.filter((p) => p !== service && exeOf(p) === exe);
}

function exeOf(pid: number): string | undefined {
  try {
    return fs.readlinkSync(`/proc/${pid}/exe`);
  } catch {
    return undefined;
  }
}

function childrenOf(pid: number): number[] {
  try {
    return fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function readPids(procsFile: string): number[] {
  try {
    return fs.readFileSync(procsFile, 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function parentOf(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return undefined;
  }
}

export function formatVersion(v: number): string {
  return `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
}
