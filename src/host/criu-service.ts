/**
 * CRIU, driven through its RPC protocol. A long-lived `criu service` per
 * state directory (a daemon child of the supervisor) answers every dump and
 * restore, so no call pays for exec'ing criu; libcriu in the addon speaks
 * the protocol. Failures carry the tail of CRIU's own log.
 */
import fs from 'node:fs';
import path from 'node:path';
import { native, type CriuRequest } from '../native/binding.js';
import { CriuError, HostError, SETUP_HINT } from '../errors.js';
import type { StatePaths } from '../paths.js';
import type { Supervisor } from './supervisor.js';
import { sleep } from './proc.js';

/** Where scripts/provision-host.sh puts the CRIU 4.x wrapper; LOCKSTEP_CRIU overrides. */
export const criuBinary = () => process.env.LOCKSTEP_CRIU ?? '/opt/lockstep/bin/criu';
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
async function serviceVersion(socket: string): Promise<number | undefined> {
  if (!fs.existsSync(socket)) return undefined;
  try {
    return await native().criu({ op: 'version', serviceAddress: socket });
  } catch {
    return undefined;
  }
}

/** Client of the state directory's CRIU service. */
export class CriuService {
  /** The version verified by the last successful RPC; reset when a call cannot reach the service. */
  private verified: number | undefined;
  constructor(
    private readonly paths: StatePaths,
    private readonly supervisor: Supervisor,
  ) {}

  get address(): string {
    return this.paths.criuSocket;
  }

  /** Starts the service when needed and checks its version (once per process while it answers). */
  async ensureRunning(): Promise<number> {
    // A verified service is trusted until a call fails to reach it: the
    // version RPC costs ~0.6 ms, a visible share of a 20 ms checkpoint.
    if (this.verified !== undefined && fs.existsSync(this.paths.criuSocket)) return this.verified;
    let v = await serviceVersion(this.paths.criuSocket);
    if (v === undefined) {
      const bin = criuBinary();
      if (!fs.existsSync(bin)) {
        throw new HostError('CRIU_NOT_INSTALLED', `CRIU is not installed at ${bin}: ${SETUP_HINT}`);
      }
      fs.rmSync(this.paths.criuSocket, { force: true });
      await this.supervisor.daemon(this.paths.criuLog, [bin, 'service', '--address', this.paths.criuSocket], { isolatedRun: true });
      // A deadline, not a count of polls: at load average 80 on 2 cores the
      // service once took longer to answer than 400 polls of 5 ms lasted.
      const deadline = Date.now() + 15_000;
      while (v === undefined && Date.now() < deadline) {
        await sleep(5);
        v = await serviceVersion(this.paths.criuSocket);
      }
      if (v === undefined) throw new CriuError('CRIU_UNAVAILABLE', 'The CRIU service did not start', criuLogTail(this.paths.criuLog));
    }
    if (v < MIN_CRIU_VERSION) {
      throw new HostError('CRIU_TOO_OLD', `CRIU ${formatVersion(v)} is too old: Lockstep needs 4.0 or later (Debian 12's 3.17 fails on current kernels; see docs)`);
    }
    this.verified = v;
    return v;
  }

  /** One RPC; if the service cannot be reached (it died), start it again and retry once. */
  private async call(req: CriuRequest): Promise<number> {
    try {
      return await native().criu({ ...req, serviceAddress: this.paths.criuSocket });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ECONNREFUSED' && code !== 'ENOENT' && code !== 'ECONNRESET' && code !== 'EPIPE') throw e;
      this.verified = undefined;
      await this.ensureRunning();
      return native().criu({ ...req, serviceAddress: this.paths.criuSocket });
    }
  }

  async dump(req: Omit<CriuRequest, 'op' | 'serviceAddress'> & { imagesDir: string; pid: number }): Promise<void> {
    const logFile = req.logFile ?? 'dump.log';
    try {
      await this.call({ ...req, op: 'dump', logFile });
    } catch (e) {
      throw new CriuError('CRIU_DUMP_FAILED', `CRIU could not dump process ${req.pid}: ${(e as Error).message}`, criuLogTail(path.join(req.imagesDir, logFile)), e);
    }
  }

  /**
   * Restores a tree; returns the host pid of its root. CRIU works (and logs)
   * in a scratch folder of its own, since the images are read-only checkpoint
   * data; the folder goes afterwards unless LOCKSTEP_KEEP_CRIU_LOGS is set.
   */
  async restore(request: Omit<CriuRequest, 'op' | 'serviceAddress' | 'workDir'> & { imagesDir: string; workDirOwner?: number }): Promise<number> {
    const { workDirOwner, ...req } = request;
    const logFile = req.logFile ?? 'restore.log';
    const workDir = fs.mkdtempSync(path.join(this.paths.scratch, 'restore-'));
    // A tree restored into a user namespace works in it as its own root.
    if (workDirOwner !== undefined) {
      fs.chownSync(workDir, 0, workDirOwner);
      fs.chmodSync(workDir, 0o770);
    }
    try {
      return await this.call({ ...req, op: 'restore', logFile, workDir });
    } catch (e) {
      throw new CriuError('CRIU_RESTORE_FAILED', `CRIU could not restore from ${req.imagesDir}: ${(e as Error).message}`, criuLogTail(path.join(workDir, logFile)), e);
    } finally {
      if (!process.env.LOCKSTEP_KEEP_CRIU_LOGS) fs.rmSync(workDir, { recursive: true, force: true });
    }
  }
}

export function formatVersion(v: number): string {
  return `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
}
