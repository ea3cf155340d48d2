/**
 * The per-state-directory supervisor (`lockstep-helper supervise`): a child
 * subreaper that is the parent of every sandbox init and of the CRIU service.
 * Sandboxes therefore outlive the manager process, and nothing they leave
 * becomes a zombie even on hosts whose pid 1 does not reap orphans.
 *
 * Protocol (its framing in helper-protocol.ts): one request per connection,
 * NUL-separated tokens ending with an empty token. "run ARGV..." answers
 * with the child's stdout; "daemon LOG ARGV..." answers {"pid":N}. The supervisor serves only peers with its own
 * uid (SO_PEERCRED) and only its allow-list: the helper's create/prepare
 * verbs, and the CRIU service (the binary it was started with, socket and
 * log in the run folder); anything else is refused with EPERM.
 */
import fs from 'node:fs';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { helperPath } from '../native/binding.js';
import { criuBinary } from './criu-service.js';
import { isAlive, sleep } from './proc.js';
import { HostError } from '../errors.js';
import { encodeSupervisorRequest, parseHelperAnswer } from './helper-protocol.js';
import type { StatePaths } from '../paths.js';
import type { HelperClient } from '../ports.js';

function request(socket: string, tokens: string[], timeoutMs = 30_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const data = encodeSupervisorRequest(tokens); // a bad token is refused before anything is sent
    const conn = net.connect(socket);
    let out = '';
    const timer = setTimeout(() => {
      conn.destroy();
      reject(new HostError('SUPERVISOR_TIMEOUT', `The supervisor did not answer within ${timeoutMs} ms`));
    }, timeoutMs);
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(data));
    conn.on('data', (d: string) => (out += d));
    conn.on('end', () => {
      clearTimeout(timer);
      resolve(out);
    });
    conn.on('error', (e) => {
      clearTimeout(timer);
      reject(
        new HostError(
          'SUPERVISOR_UNREACHABLE',
          `The supervisor at ${socket} dropped the request: ${(e as NodeJS.ErrnoException).code ?? e.message}`,
          { cause: e },
        ),
      );
    });
  });
}

function canConnect(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const conn = net.connect(socket);
    conn.on('connect', () => {
      conn.destroy();
      resolve(true);
    });
    conn.on('error', () => resolve(false));
  });
}

/** Client of one state directory's supervisor; starts it when it is not running. */
export class Supervisor implements HelperClient {
  constructor(
    private readonly paths: StatePaths,
    /** The one CRIU binary the supervisor will agree to run as a daemon. */
    private readonly criu: string = criuBinary(),
    /** The written-page keeper it will also agree to run as a daemon (null: none). */
    private readonly wpKeeper: string | null = null,
  ) {}

  async ensureRunning(): Promise<void> {
    if (await canConnect(this.paths.supervisorSocket)) return;
    fs.mkdirSync(this.paths.run, { recursive: true, mode: 0o700 });
    const log = fs.openSync(this.paths.supervisorLog, 'a', 0o600);
    const child = spawn(
      helperPath,
      ['supervise', '--socket', this.paths.supervisorSocket, '--pidfile', this.paths.supervisorPidfile],
      {
        detached: true,
        env: { ...process.env, LOCKSTEP_CRIU: this.criu, LOCKSTEP_WP_KEEPER: this.wpKeeper ?? '' },
        stdio: ['ignore', log, log],
      },
    );
    child.unref();
    fs.closeSync(log);
    for (let i = 0; i < 200; i++) {
      if (await canConnect(this.paths.supervisorSocket)) return;
      await sleep(5);
    }
    throw new HostError('SUPERVISOR_START_FAILED', `The supervisor did not start; see ${this.paths.supervisorLog}`);
  }

  /** Runs ARGV as the supervisor's child and returns its stdout. */
  async run(argv: string[], timeoutMs?: number): Promise<string> {
    return this.call(['run', ...argv], timeoutMs);
  }

  /**
   * One request; if nobody listens (the supervisor was killed), start a new
   * one and ask again. Sandboxes it started keep running without it
   * (orphaned to the host's init); nothing was started by the failed
   * connect, so asking again cannot run anything twice.
   */
  private async call(tokens: string[], timeoutMs?: number): Promise<string> {
    try {
      return await request(this.paths.supervisorSocket, tokens, timeoutMs);
    } catch (e) {
      // request() wraps the socket's error as SUPERVISOR_UNREACHABLE; its cause says why.
      const errno = ((e as { cause?: NodeJS.ErrnoException }).cause ?? (e as NodeJS.ErrnoException)).code;
      if (errno !== 'ECONNREFUSED' && errno !== 'ENOENT') throw e;
      await this.ensureRunning();
      return request(this.paths.supervisorSocket, tokens, timeoutMs);
    }
  }

  /**
   * Starts a long-lived child of the supervisor, logging to logFile.
   * `isolatedRun` gives it a mount namespace of its own with a tmpfs /run.
   */
  async daemon(logFile: string, argv: string[], opts: { isolatedRun?: boolean } = {}): Promise<number> {
    const text = await this.call([opts.isolatedRun ? 'daemon-isolated' : 'daemon', logFile, ...argv]);
    return parseHelperAnswer<{ pid: number }>(text, `starting ${argv[0]}`).pid;
  }

  /** Stops the supervisor (and the CRIU service); running sandboxes are not touched. */
  async stop(): Promise<void> {
    let pid: number;
    try {
      pid = Number(fs.readFileSync(this.paths.supervisorPidfile, 'utf8').trim());
    } catch {
      return;
    }
    if (!pid) return;
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      return;
    }
    for (let i = 0; i < 400 && isAlive(pid); i++) await sleep(5);
  }
}
