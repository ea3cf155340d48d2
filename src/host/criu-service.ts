/**
 * CRIU, driven through its RPC protocol. A long-lived `criu service` per
 * state directory (a daemon child of the supervisor) answers every dump and
 * restore, so no call pays for exec'ing criu; libcriu in the addon speaks
 * the protocol. Failures carry the tail of CRIU's own log.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { native, type CriuRequest } from '../native/binding.js';
import { CriuError, HostError } from '../errors.js';
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

function socketAnswers(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(socket);
    c.on('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.on('error', () => resolve(false));
  });
}

/** Client of the state directory's CRIU service. */
export class CriuService {
  private version: number | undefined;
  constructor(
    private readonly paths: StatePaths,
    private readonly supervisor: Supervisor,
  ) {}

  get address(): string {
    return this.paths.criuSocket;
  }

  /** Starts the service when needed and checks its version (once per process). */
  async ensureRunning(): Promise<number> {
    if (!(await socketAnswers(this.paths.criuSocket))) {
      const bin = criuBinary();
      if (!fs.existsSync(bin)) {
        throw new HostError('CRIU_NOT_INSTALLED', `CRIU is not installed at ${bin}: run scripts/provision-host.sh (npm run setup) as root`);
      }
      try {
        fs.unlinkSync(this.paths.criuSocket);
      } catch {
        /* not there */
      }
      await this.supervisor.daemon(this.paths.criuLog, [bin, 'service', '--address', this.paths.criuSocket]);
      for (let i = 0; i < 400 && !(await socketAnswers(this.paths.criuSocket)); i++) await sleep(5);
      if (!(await socketAnswers(this.paths.criuSocket))) {
        throw new CriuError('CRIU_UNAVAILABLE', 'The CRIU service did not start', criuLogTail(this.paths.criuLog));
      }
    }
    if (this.version === undefined) {
      const v = await native().criu({ op: 'version', serviceAddress: this.paths.criuSocket });
      if (v < MIN_CRIU_VERSION) {
        throw new HostError('CRIU_TOO_OLD', `CRIU ${formatVersion(v)} is too old: Lockstep needs 4.0 or later (Debian 12's 3.17 fails on current kernels; see docs)`);
      }
      this.version = v;
    }
    return this.version;
  }

  async dump(req: Omit<CriuRequest, 'op' | 'serviceAddress'> & { imagesDir: string; pid: number }): Promise<void> {
    const logFile = req.logFile ?? 'dump.log';
    try {
      await native().criu({ ...req, op: 'dump', serviceAddress: this.paths.criuSocket, logFile });
    } catch (e) {
      throw new CriuError('CRIU_DUMP_FAILED', `CRIU could not dump process ${req.pid}: ${(e as Error).message}`, criuLogTail(path.join(req.imagesDir, logFile)), e);
    }
  }

  /** Restores a tree; returns the host pid of its root. */
  async restore(req: Omit<CriuRequest, 'op' | 'serviceAddress'> & { imagesDir: string }): Promise<number> {
    const logFile = req.logFile ?? 'restore.log';
    try {
      return await native().criu({ ...req, op: 'restore', serviceAddress: this.paths.criuSocket, logFile });
    } catch (e) {
      throw new CriuError('CRIU_RESTORE_FAILED', `CRIU could not restore from ${req.imagesDir}: ${(e as Error).message}`, criuLogTail(path.join(req.imagesDir, logFile)), e);
    }
  }
}

export function formatVersion(v: number): string {
  return `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
}
