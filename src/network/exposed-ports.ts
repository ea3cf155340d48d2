/**
 * Exposed ports: a port a sandbox listens on, reached from outside through
 * the manager (E2B's `getHost`). An exposure is a catalog row (sandbox, port,
 * the sha256 of a random token, the tenant); the token is shown once, when
 * the port is exposed. Whoever presents the token, or the owning tenant's own
 * credentials, may open connections to it; the HTTP server's proxy
 * (src/http/routes/ports.ts) does so per request.
 *
 * A connection is made by the manager itself, inside the sandbox's network
 * namespace, to 127.0.0.1:port (native/addon/netns.cc, `connectInNetns`:
 * a thread of its own joins the namespace through a pidfd of the init, pinned
 * by its start time), so `none` sandboxes (loopback only) are reachable too,
 * and nothing the sandbox controls (a path, an address) is followed.
 *
 * Lifetime: an exposure belongs to its sandbox id. It stays across a
 * rollback (the next connection reaches the restored tree's listener); a fork
 * does not inherit it (it is another sandbox); it is closed when the sandbox
 * stops, is removed, or its tenant is removed (src/catalog/catalog.ts deletes
 * the rows; connections open through it end with the processes that held
 * their other end).
 */
import fs from 'node:fs';
import net from 'node:net';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { SandboxRow, Catalog } from '../catalog/catalog.js';
import { InvalidArgumentError, InvalidStateError, LockstepError, NotFoundError } from '../errors.js';
import { DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';
import type { Clock, NativeBinding, ProcessTable } from '../ports.js';
import type { LockstepConfig } from '../config.js';

/** What exposed-ports.ts uses of the manager's services (api/engine.ts builds them). */
export interface ExposedPortsDeps {
  catalog: Catalog;
  clock: Clock;
  config: LockstepConfig;
  native: NativeBinding;
  proc: ProcessTable;
}

/** How long a connect inside the sandbox may take (a full accept queue drops SYNs: the connect would wait). */
export const CONNECT_TIMEOUT_MS = 3000;
/** Exposed ports per sandbox. */
export const MAX_EXPOSURES_PER_SANDBOX = 16;
/** Connections open at once through one sandbox's exposures (beyond: QUOTA_EXCEEDED). */
export const MAX_CONNECTIONS_PER_SANDBOX = 64;

/** An exposed port as callers see it (no token). */
export interface ExposureInfo {
  /** `exp_…`: names the exposure in its URL. */
  id: string;
  sandboxId: string;
  port: number;
  /** The proxy path on `lockstep serve`: `/ports/<id>/`. */
  path: string;
  /** `path` under LOCKSTEP_PUBLIC_URL (default http://127.0.0.1:7878). */
  url: string;
  createdAt: string;
}

/** What `expose` returns: the info and, this once, the token. */
export interface ExposedPort extends ExposureInfo {
  /** Send as `X-Lockstep-Token` (or `?lockstep_token=`); only its sha256 is kept. */
  token: string;
}

interface ExposureRow {
  id: string;
  sandbox_id: string;
  tenant: string | null;
  port: number;
  token_hash: string;
  created_at: number;
}

/** Rejects anything but an integer port number 1-65535, naming the field. */
export function validatePort(port: unknown, field = 'port'): number {
  const n = typeof port === 'string' && /^\d{1,5}$/.test(port) ? Number(port) : port;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 65535)
    throw new InvalidArgumentError(field, 'a port number, an integer from 1 to 65535', port);
  return n;
}

const sha256 = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/** Who asks to use an exposure: a token, and/or the tenant its bearer token authenticated. */
export interface ExposureCredentials {
  token?: string | undefined;
  /** The tenant id of valid tenant credentials; null: the SDK's own (no tenant). */
  tenant?: string | null | undefined;
}

/** The manager's exposed ports (one per Lockstep). */
export class ExposedPorts {
  /** Open proxied connections, per sandbox (bounded; destroyed when an exposure or its sandbox goes here). */
  private readonly open = new Map<string, Set<{ exposure: string; socket?: net.Socket }>>();

  constructor(private readonly engine: ExposedPortsDeps) {}

  private get db() {
    return this.engine.catalog.db;
  }

  private info(r: ExposureRow): ExposureInfo {
    const path = `/ports/${r.id}/`;
    const base = this.engine.config.publicUrl ?? `http://${DEFAULT_HOST}:${DEFAULT_PORT}`;
    return {
      id: r.id,
      sandboxId: r.sandbox_id,
      port: r.port,
      path,
      url: base + path,
      createdAt: new Date(r.created_at).toISOString(),
    };
  }

  /**
   * Exposes a port the running sandbox listens on (a connect to it must
   * succeed: PORT_NOT_LISTENING otherwise). Exposing an exposed port again
   * replaces its token (the old one stops working).
   */
  async expose(row: SandboxRow, portArg: unknown): Promise<ExposedPort> {
    const port = validatePort(portArg);
    const existing = this.rows(row.id);
    if (!existing.some((e) => e.port === port) && existing.length >= MAX_EXPOSURES_PER_SANDBOX)
      throw new LockstepError(
        'QUOTA_EXCEEDED',
        `Sandbox ${row.id} already exposes ${MAX_EXPOSURES_PER_SANDBOX} ports`,
        {
          details: { sandboxId: row.id, limit: MAX_EXPOSURES_PER_SANDBOX },
        },
      );
    (await this.connectTo(row, port)).destroy();
    const token = `lsp_${randomBytes(24).toString('base64url')}`;
    const r: ExposureRow = {
      id: `exp_${randomBytes(8).toString('hex')}`,
      sandbox_id: row.id,
      tenant: row.tenant,
      port,
      token_hash: sha256(token).toString('hex'),
      created_at: this.engine.clock.now(),
    };
    this.engine.catalog.tx(() => {
      // The sandbox may have gone while the connect ran: never an exposure of a missing sandbox.
      const now = this.engine.catalog.sandbox(row.id);
      if (!now || now.state !== 'running')
        throw new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${row.id} is not running`, { sandboxId: row.id });
      const old = this.db.prepare('SELECT id FROM exposures WHERE sandbox_id = ? AND port = ?').get(row.id, port) as
        { id: string } | undefined;
      if (old) {
        this.db.prepare('DELETE FROM exposures WHERE id = ?').run(old.id);
        this.dropConnections(row.id, old.id);
      }
      this.db
        .prepare(
          'INSERT INTO exposures (id, sandbox_id, tenant, port, token_hash, created_at) VALUES (@id, @sandbox_id, @tenant, @port, @token_hash, @created_at)',
        )
        .run(r);
    });
    return { ...this.info(r), token };
  }

  private rows(sandboxId: string): ExposureRow[] {
    return this.db
      .prepare('SELECT * FROM exposures WHERE sandbox_id = ? ORDER BY port')
      .all(sandboxId) as ExposureRow[];
  }

  /** The sandbox's exposed ports, by port. */
  list(sandboxId: string): ExposureInfo[] {
    return this.rows(sandboxId).map((r) => this.info(r));
  }

  /** Closes an exposed port and the connections open through it; false when it was not exposed. */
  close(sandboxId: string, portArg: unknown): boolean {
    const port = validatePort(portArg);
    const r = this.rows(sandboxId).find((e) => e.port === port);
    if (!r) return false;
    this.db.prepare('DELETE FROM exposures WHERE id = ?').run(r.id);
    this.dropConnections(sandboxId, r.id);
    return true;
  }

  /** Ends every proxied connection to a sandbox (it is being removed). */
  dropSandbox(sandboxId: string): void {
    this.dropConnections(sandboxId);
  }

  private dropConnections(sandboxId: string, exposure?: string): void {
    for (const c of this.open.get(sandboxId) ?? [])
      if (exposure === undefined || c.exposure === exposure) c.socket?.destroy();
  }

  /**
   * The exposure `id`, if the credentials open it: its token (compared in
   * constant time against the stored hash) or its tenant's. Every failure is
   * the same EXPOSURE_NOT_FOUND, so a wrong token and a missing id look alike.
   */
  authorize(id: unknown, creds: ExposureCredentials): { id: string; sandboxId: string; port: number } {
    const notFound = () => new NotFoundError('exposure', typeof id === 'string' ? id.slice(0, 64) : String(id));
    if (typeof id !== 'string' || !/^exp_[0-9a-f]{16}$/.test(id)) throw notFound();
    const r = this.db.prepare('SELECT * FROM exposures WHERE id = ?').get(id) as ExposureRow | undefined;
    // Hash the presented token whether or not the row exists: the time taken says nothing about which.
    const presented = sha256(creds.token ?? '');
    const expected = r ? Buffer.from(r.token_hash, 'hex') : sha256(randomBytes(16).toString('hex'));
    const tokenOk = creds.token !== undefined && timingSafeEqual(presented, expected);
    const tenantOk =
      r !== undefined && creds.tenant !== undefined && creds.tenant !== null && r.tenant === creds.tenant;
    if (!r || !(tokenOk || tenantOk)) throw notFound();
    return { id: r.id, sandboxId: r.sandbox_id, port: r.port };
  }

  /**
   * A connected socket to the exposure's port inside its sandbox, counted
   * against the sandbox's connection limit until it closes.
   */
  async connect(exposure: { id: string; sandboxId: string; port: number }): Promise<net.Socket> {
    const row = this.engine.catalog.sandbox(exposure.sandboxId);
    if (!row) throw new NotFoundError('exposure', exposure.id);
    const set = this.open.get(row.id) ?? new Set();
    if (set.size >= MAX_CONNECTIONS_PER_SANDBOX)
      throw new LockstepError(
        'QUOTA_EXCEEDED',
        `Sandbox ${row.id} has ${MAX_CONNECTIONS_PER_SANDBOX} proxied connections open`,
        { details: { sandboxId: row.id, limit: MAX_CONNECTIONS_PER_SANDBOX } },
      );
    // The slot is taken while the connect runs, so that a burst of requests cannot pass the limit.
    const entry: { exposure: string; socket?: net.Socket } = { exposure: exposure.id };
    set.add(entry);
    this.open.set(row.id, set);
    const release = () => {
      set.delete(entry);
      if (set.size === 0 && this.open.get(row.id) === set) this.open.delete(row.id);
    };
    let socket: net.Socket;
    try {
      socket = await this.connectTo(row, exposure.port);
    } catch (e) {
      release();
      throw e;
    }
    // Closed meanwhile (close, or the exposure replaced)?
    const still = this.db.prepare('SELECT 1 FROM exposures WHERE id = ?').get(exposure.id);
    if (!still) {
      release();
      socket.destroy();
      throw new NotFoundError('exposure', exposure.id);
    }
    entry.socket = socket;
    socket.once('close', release);
    return socket;
  }

  /** connectInNetns for the row's init, pinned by pidfd + start time. */
  private async connectTo(row: SandboxRow, port: number): Promise<net.Socket> {
    const notRunning = () =>
      new InvalidStateError('SANDBOX_NOT_RUNNING', `Sandbox ${row.id} is not running (state: ${row.state})`, {
        sandboxId: row.id,
      });
    if (row.state !== 'running' || row.init_pid === null || row.init_start === null) throw notRunning();
    let pidfd: number;
    try {
      pidfd = this.engine.native.pidfdOpen(row.init_pid);
    } catch {
      throw notRunning();
    }
    let fd: number;
    try {
      // The pidfd names one process from here on; its start time says it is the init the row names.
      if (this.engine.proc.startTime(row.init_pid) !== row.init_start) throw notRunning();
      fd = await this.engine.native.connectInNetns(pidfd, port, CONNECT_TIMEOUT_MS);
    } catch (e) {
      if (e instanceof LockstepError) throw e;
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ECONNREFUSED')
        throw new InvalidStateError(
          'PORT_NOT_LISTENING',
          `Nothing listens on port ${port} (127.0.0.1) in sandbox ${row.id}`,
          { sandboxId: row.id, port, field: 'port' },
        );
      if (code === 'ESRCH') throw notRunning();
      throw new LockstepError(
        'PORT_UNREACHABLE',
        code === 'ETIMEDOUT'
          ? `Port ${port} of sandbox ${row.id} did not accept a connection within ${CONNECT_TIMEOUT_MS} ms`
          : `Cannot connect to port ${port} of sandbox ${row.id}: ${(e as Error).message}`,
        { cause: e, details: { sandboxId: row.id, port } },
      );
    } finally {
      fs.closeSync(pidfd);
    }
    return new net.Socket({ fd, readable: true, writable: true });
  }
}
