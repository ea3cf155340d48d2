/**
 * One long-lived `nft -i` for the changes the manager makes at the rate
 * sandboxes ask (the resolver's learned addresses, its UDP 53 opening):
 * forking an `nft` per DNS answer let a sandbox make the manager run a
 * hundred of them at once. Each `apply` is one line on nft's stdin, so one
 * transaction (commands on the line are joined with ";").
 *
 * nft prints no prompt on a pipe, so every line is followed by a stateless
 * `describe` whose one-line output marks the end of that line's work;
 * stderr is merged into stdout (`2>&1` in front of `exec`, so the process is
 * nft itself), and whatever came before the marker is the line's error.
 * Lines are answered strictly in order.
 *
 * If nft dies, every pending line is failed with NETWORK_SETUP_FAILED
 * naming the exit, and the next `apply` starts a new one. A line that gets
 * no answer within the timeout kills the process (which fails the rest).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { HostError } from '../../errors.js';

export const TOOLS = { nft: '/usr/sbin/nft', ip: '/usr/sbin/ip', tc: '/usr/sbin/tc' } as const;

const MARKER_COMMAND = 'describe meta length';
const MARKER = 'meta expression, datatype integer (integer), 32 bits\n';
const LINE_TIMEOUT_MS = 15_000;

interface Pending {
  line: string;
  resolve: () => void;
  reject: (e: Error) => void;
}

/** How the session starts its process (a fake in unit tests). */
export type NftSpawner = () => ChildProcessWithoutNullStreams;

export const spawnNft: NftSpawner = () =>
  spawn('/bin/sh', ['-c', `exec ${TOOLS.nft} -i 2>&1`], { stdio: ['pipe', 'pipe', 'pipe'] });

export class NftSession {
  private child: ChildProcessWithoutNullStreams | undefined;
  private readonly pending: Pending[] = [];
  private output = '';
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  /** Processes started so far (tests check that a flood does not start more). */
  spawned = 0;

  constructor(private readonly start: NftSpawner = spawnNft) {}

  /** Runs `script` (one or more commands, one per line) as one transaction. */
  apply(script: string): Promise<void> {
    const line = script
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean)
      .join('; ');
    if (!line) return Promise.resolve();
    if (this.closed)
      return Promise.reject(new HostError('NETWORK_SETUP_FAILED', 'The nft session is closed (the manager closed)'));
    return new Promise<void>((resolve, reject) => {
      const child = this.ensureChild();
      this.pending.push({ line, resolve, reject });
      child.stdin.write(`${line}\n${MARKER_COMMAND}\n`);
      this.armTimer();
    });
  }

  /** Ends nft; pending lines fail. Idempotent. */
  close(): void {
    this.closed = true;
    this.stop('the manager closed');
  }

  private ensureChild(): ChildProcessWithoutNullStreams {
    if (this.child) return this.child;
    const child = this.start();
    this.spawned++;
    this.child = child;
    this.output = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (s: string) => this.onOutput(child, s));
    child.stdin.on('error', () => undefined); // its exit tells
    child.on('error', (e) => this.died(child, `cannot run nft: ${e.message}`));
    child.on('close', (code, signal) => this.died(child, `nft exited (${signal ?? `code ${code}`})`));
    // An idle session must not keep a program that opened a Lockstep alive.
    child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) (s as unknown as { unref?: () => void }).unref?.();
    return child;
  }

  private onOutput(child: ChildProcessWithoutNullStreams, s: string): void {
    if (child !== this.child) return;
    this.output += s;
    let at;
    while ((at = this.output.indexOf(MARKER)) !== -1) {
      const before = this.output.slice(0, at).trim();
      this.output = this.output.slice(at + MARKER.length);
      const p = this.pending.shift();
      if (!p) continue;
      if (!before) p.resolve();
      else
        p.reject(
          new HostError('NETWORK_SETUP_FAILED', `nft refused a change: ${before.split('\n')[0]}`, {
            details: { command: 'nft', stderr: before.slice(0, 2000), script: p.line.slice(0, 2000) },
          }),
        );
    }
    this.armTimer();
  }

  private armTimer(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.pending.length === 0) return;
    this.timer = setTimeout(() => this.stop(`nft did not answer within ${LINE_TIMEOUT_MS} ms`), LINE_TIMEOUT_MS);
  }

  private died(child: ChildProcessWithoutNullStreams, why: string): void {
    if (child !== this.child) return;
    this.child = undefined;
    clearTimeout(this.timer);
    this.timer = undefined;
    const failed = this.pending.splice(0);
    for (const p of failed)
      p.reject(new HostError('NETWORK_SETUP_FAILED', `The nft session ended before applying a change: ${why}`));
  }

  private stop(why: string): void {
    const child = this.child;
    if (!child) return;
    this.died(child, why);
    child.stdin.end();
    child.kill('SIGKILL');
  }
}
