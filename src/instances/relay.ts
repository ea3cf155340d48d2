/**
 * The manager's end of an interactive process: input for a relay
 * (native/init/lockstep-relay.c) that runs inside the sandbox and holds
 * everything a checkpoint must see (the terminal pair, the command's stdin
 * pipe, a FIFO it reads records from). The manager only appends records to
 * that FIFO, through a write end opened from the host (openFifoWriter: the
 * leaf must be a FIFO below the sandbox root, nothing else is opened), so
 * the process tree never depends on anything the manager holds.
 *
 * Input is bounded: each FIFO gets one writer per manager, whose queue of
 * bytes the relay has not taken yet may hold MAX_PENDING_INPUT_BYTES; past
 * that, a write is refused whole with STDIN_FULL (nothing of it is sent), so
 * a process that never reads its input cannot make the manager buffer
 * without end, and nothing in the manager ever blocks on it.
 */
import net from 'node:net';
import type { NativeBinding } from '../native/binding.js';
import { InvalidStateError, LockstepError, isNativeError } from '../errors.js';
import { sleep } from '../host/proc.js';

/** Bytes of input a manager queues for one process that is not reading (the FIFO's own 64 KiB come on top). */
export const MAX_PENDING_INPUT_BYTES = 1 << 20;
/** Largest payload of one record (the relay's MAX_RECORD). */
const MAX_RECORD = 65536;
/** The relay makes its FIFO right after it starts: how long an open waits for it. */
const OPEN_WAIT_MS = 10_000;
/** A writer with nothing queued closes its fd after this long unused (the next write opens it again). */
const IDLE_CLOSE_MS = 30_000;

/** Record types the relay reads. */
const DATA = 0x64; // 'd'
const CLOSE = 0x63; // 'c'
const RESIZE = 0x72; // 'r'

function record(type: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(5);
  h[0] = type;
  h.writeUInt32LE(payload.length, 1);
  return Buffer.concat([h, payload]);
}

/** Input bytes as records of at most MAX_RECORD bytes each. */
export function dataRecords(data: Buffer): Buffer {
  const parts: Buffer[] = [];
  for (let at = 0; at < data.length; at += MAX_RECORD) parts.push(record(DATA, data.subarray(at, at + MAX_RECORD)));
  return Buffer.concat(parts);
}

export function closeRecord(): Buffer {
  return record(CLOSE, Buffer.alloc(0));
}

export function resizeRecord(cols: number, rows: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt16LE(cols, 0);
  p.writeUInt16LE(rows, 2);
  return record(RESIZE, p);
}

/**
 * Names one process tree of a sandbox: every restore (rollback, either path)
 * gives the init a new start time, and the standby path a new instance too.
 * Writers are keyed by it, so input after a rollback never goes to a FIFO of
 * the tree that was replaced.
 */
export function timelineOf(row: { instance: string; init_pid: number | null; init_start: number | null }): string {
  return `${row.instance}:${row.init_pid ?? 0}:${row.init_start ?? 0}`;
}

/** Where a relay's FIFO is: the sandbox root on the host and the path below it. */
export interface FifoAddress {
  /** Identifies the process across calls: its tree (timelineOf) and pid. */
  key: string;
  root: string;
  /** Relative to root. */
  path: string;
  /** Whether the relay still runs (an open that finds no reader waits only while it does). */
  running: () => boolean;
}

/**
 * Waits until the relay has made its FIFO (it does so first thing, after its
 * output files): from then on the process can be reached by id through every
 * API, also by a client that asks right after the start. False if the relay
 * stopped before, or did not get there in OPEN_WAIT_MS.
 */
export async function relayReady(exists: () => Promise<boolean>, running: () => boolean): Promise<boolean> {
  const deadline = Date.now() + OPEN_WAIT_MS;
  for (;;) {
    if (await exists()) return true;
    if (!running() || Date.now() > deadline) return false;
    await sleep(10);
  }
}

/** What the writers use of the addon: the FIFO open. */
type RelayNative = Pick<NativeBinding, 'openFifoWriter'>;

/** One FIFO's writer in this manager. */
class FifoWriter {
  private socket: net.Socket | undefined;
  private opening: Promise<net.Socket> | undefined;
  private idle: NodeJS.Timeout | undefined;
  closed: string | undefined;

  constructor(
    private readonly native: RelayNative,
    private readonly address: FifoAddress,
    /** Called when the writer let its fd go while idle: the owner forgets it. */
    private readonly onIdle: () => void,
  ) {}

  /**
   * Arms the idle timer: the fd of a process that exited (or of an instance
   * a rollback replaced) is never written again and would stay open
   * forever; one unused for IDLE_CLOSE_MS with nothing queued is closed.
   */
  private touch(): void {
    clearTimeout(this.idle);
    this.idle = setTimeout(() => {
      if (this.pending() > 0 || this.opening) return this.touch();
      this.socket?.destroy();
      this.socket = undefined;
      this.onIdle();
    }, IDLE_CLOSE_MS).unref();
  }

  private async open(): Promise<net.Socket> {
    const deadline = Date.now() + OPEN_WAIT_MS;
    for (;;) {
      try {
        const fd = await this.native.openFifoWriter(this.address.root, this.address.path);
        const socket = new net.Socket({ fd, readable: false, writable: true });
        // Input in flight does not keep a manager's process alive (a script that exits loses what was still queued).
        socket.unref();
        socket.on('error', (e) => {
          // EPIPE: the relay is gone (exited, killed, or its timeline rolled back).
          this.closed ??= `the process's input is gone (${(e as NodeJS.ErrnoException).code ?? e.message})`;
          socket.destroy();
        });
        return socket;
      } catch (e) {
        const code = isNativeError(e) ? e.code : undefined;
        // Not made yet (ENOENT), or made and not opened yet (ENXIO): the relay is starting.
        if ((code === 'ENOENT' || code === 'ENXIO') && Date.now() < deadline && this.address.running()) {
          await sleep(20);
          continue;
        }
        throw new InvalidStateError(
          'STDIN_CLOSED',
          `Cannot reach the process's input: ${code === 'ENOTSUP' ? 'its FIFO was replaced by something else' : code === 'ENOENT' || code === 'ENXIO' ? 'the process is not running' : ((e as Error).message ?? 'failed')}`,
          { sysCode: code },
        );
      }
    }
  }

  /** Queues records whole, or refuses them whole (STDIN_FULL, STDIN_CLOSED). */
  async write(bytes: Buffer): Promise<void> {
    if (this.closed) throw new InvalidStateError('STDIN_CLOSED', `Stdin is closed: ${this.closed}`);
    if (!this.socket) {
      this.opening ??= this.open().finally(() => (this.opening = undefined));
      this.socket = await this.opening;
    }
    const s = this.socket;
    if (this.closed || s.destroyed)
      throw new InvalidStateError('STDIN_CLOSED', `Stdin is closed: ${this.closed ?? 'the process is gone'}`);
    if (s.writableLength + bytes.length > MAX_PENDING_INPUT_BYTES) {
      throw new InvalidStateError(
        'STDIN_FULL',
        `The process is not reading its input: ${s.writableLength} bytes are still waiting, and ${bytes.length} more would pass the bound of ${MAX_PENDING_INPUT_BYTES}`,
        { pendingBytes: s.writableLength, maxPendingBytes: MAX_PENDING_INPUT_BYTES },
      );
    }
    s.write(bytes);
    this.touch();
  }

  /** Bytes queued in this manager that the relay has not taken yet. */
  pending(): number {
    return this.socket?.writableLength ?? 0;
  }

  end(reason: string): void {
    this.closed ??= reason;
    clearTimeout(this.idle);
    this.socket?.end();
  }
}

/**
 * The writers of one manager, by process. A process's writer lives until
 * its input is closed or found gone; entries of sandbox instances that no
 * longer exist fail on their next write and are dropped then.
 */
export class RelayInputs {
  private readonly writers = new Map<string, FifoWriter>();

  constructor(private readonly native: RelayNative) {}

  private writer(address: FifoAddress): FifoWriter {
    let w = this.writers.get(address.key);
    if (!w) {
      const created = new FifoWriter(this.native, address, () => {
        if (this.writers.get(address.key) === created) this.writers.delete(address.key);
      });
      this.writers.set(address.key, created);
      w = created;
    }
    return w;
  }

  async send(address: FifoAddress, bytes: Buffer): Promise<void> {
    const w = this.writer(address);
    try {
      await w.write(bytes);
    } catch (e) {
      if (e instanceof LockstepError && e.code === 'STDIN_CLOSED' && this.writers.get(address.key) === w)
        this.writers.delete(address.key);
      throw e;
    }
  }

  /** Sends the close record, then forgets the writer: later sends are refused with STDIN_CLOSED. */
  async close(address: FifoAddress): Promise<void> {
    const w = this.writer(address);
    await w.write(closeRecord());
    w.end('closed by the caller');
  }

  /** Whether this manager closed the process's input. */
  isClosed(key: string): boolean {
    return this.writers.get(key)?.closed !== undefined;
  }

  pending(key: string): number {
    return this.writers.get(key)?.pending() ?? 0;
  }

  /** Drops the writers of a sandbox instance (it was removed or replaced). */
  forget(keyPrefix: string): void {
    for (const [k, w] of this.writers) {
      if (!k.startsWith(keyPrefix)) continue;
      w.end('the sandbox instance is gone');
      this.writers.delete(k);
    }
  }
}

const perEngine = new WeakMap<object, RelayInputs>();

/** The writers of one engine (one manager process holds one per open Lockstep), opening FIFOs with its binding. */
export function relayInputs(engine: { native: RelayNative }): RelayInputs {
  let r = perEngine.get(engine);
  if (!r) {
    r = new RelayInputs(engine.native);
    perEngine.set(engine, r);
  }
  return r;
}
