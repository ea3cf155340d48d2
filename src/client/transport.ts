/**
 * The client's one way to the server: fetch with the tenant's bearer token,
 * typed errors, and retries that cannot run anything twice.
 *
 * A request is retried only when doing it again is safe: GET, PUT (a file
 * write with a body the client still holds) and DELETE are idempotent by
 * nature, and every POST carries an Idempotency-Key, chosen once per call and
 * sent again on each attempt, so that the server replays its first answer
 * instead of running the command, checkpoint or fork a second time. What is
 * retried: a connection that failed or was cut before an answer, 503 (the
 * server is draining for a restart) and 409 IDEMPOTENCY_KEY_IN_PROGRESS (the
 * first attempt is still running on the server).
 */
import { randomUUID } from 'node:crypto';
import { InvalidArgumentError, LockstepError } from '../errors.js';
import { DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';
import { ConnectionError, RequestAbortedError, errorFromResponse } from '../errors-from-wire.js';

/** Where the server is and who is calling. */
export interface ConnectionOptions {
  /** Base URL of `lockstep serve` (default: LOCKSTEP_API_URL, else where `lockstep serve` listens by default). */
  apiUrl?: string | undefined;
  /** The tenant's bearer token (default: LOCKSTEP_API_KEY). */
  apiKey?: string | undefined;
  /** Attempts per request, the first included (default 4). */
  maxAttempts?: number | undefined;
  /** Delay before the first retry, doubled after each (default 200 ms). */
  retryDelayMs?: number | undefined;
  /** Time limit of each request in ms (default none; long commands set their own). */
  requestTimeoutMs?: number | undefined;
}

/** Per-call options every method takes. */
export interface CallOptions {
  signal?: AbortSignal | undefined;
  /** The key of this call (default: a new random one per call, reused on its retries). */
  idempotencyKey?: string | undefined;
}

export const DEFAULT_API_URL = `http://${DEFAULT_HOST}:${DEFAULT_PORT}`;

type Body = { json: unknown } | { bytes: Uint8Array } | { stream: AsyncIterable<Uint8Array | string> } | undefined;

export interface RequestSpec extends CallOptions {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: string;
  query?: Record<string, string | undefined> | undefined;
  body?: Body;
  accept?: string | undefined;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }
    function onAbort() {
      clearTimeout(t);
      reject(signal!.reason);
    }
    signal?.addEventListener('abort', onAbort, { once: true });
  });

/** Resolved connection settings plus the request loop. */
export class Transport {
  readonly apiUrl: string;
  private readonly apiKey: string;
  private readonly maxAttempts: number;
  private readonly retryDelayMs: number;
  private readonly requestTimeoutMs: number | undefined;

  constructor(opts: ConnectionOptions = {}) {
    const url = opts.apiUrl ?? process.env.LOCKSTEP_API_URL ?? DEFAULT_API_URL;
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new InvalidArgumentError('apiUrl', 'an http(s) URL', url);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')
      throw new InvalidArgumentError('apiUrl', 'an http(s) URL', url);
    this.apiUrl = parsed.href.replace(/\/+$/, '');
    const key = opts.apiKey ?? process.env.LOCKSTEP_API_KEY;
    if (typeof key !== 'string' || !/^[\x21-\x7e]+$/.test(key))
      throw new InvalidArgumentError(
        'apiKey',
        'the tenant token printed by `lockstep tenant add NAME` (or LOCKSTEP_API_KEY)',
        key,
      );
    this.apiKey = key;
    this.maxAttempts = opts.maxAttempts ?? 4;
    if (!Number.isInteger(this.maxAttempts) || this.maxAttempts < 1)
      throw new InvalidArgumentError('maxAttempts', 'an integer of at least 1', opts.maxAttempts);
    this.retryDelayMs = opts.retryDelayMs ?? 200;
    this.requestTimeoutMs = opts.requestTimeoutMs;
  }

  /** Sends a request and returns the 2xx response (its body unread); any other answer throws the typed error. */
  async send(spec: RequestSpec): Promise<Response> {
    const url = new URL(this.apiUrl + '/v1' + spec.path);
    for (const [k, v] of Object.entries(spec.query ?? {})) if (v !== undefined) url.searchParams.set(k, v);
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.apiKey}`,
      accept: spec.accept ?? 'application/json',
    };
    if (spec.method === 'POST') headers['idempotency-key'] = spec.idempotencyKey ?? randomUUID();
    // A stream can be sent once: a retry would send nothing.
    const replayable = !(spec.body && 'stream' in spec.body);
    for (let attempt = 1; ; attempt++) {
      if (spec.signal?.aborted) throw new RequestAbortedError(spec.signal.reason);
      const init: RequestInit & { duplex?: 'half' } = { method: spec.method, headers: { ...headers } };
      if (spec.body && 'json' in spec.body) {
        (init.headers as Record<string, string>)['content-type'] = 'application/json';
        init.body = JSON.stringify(spec.body.json);
      } else if (spec.body && 'bytes' in spec.body) {
        (init.headers as Record<string, string>)['content-type'] = 'application/octet-stream';
        init.body = spec.body.bytes;
      } else if (spec.body && 'stream' in spec.body) {
        (init.headers as Record<string, string>)['content-type'] = 'application/octet-stream';
        init.body = toWebStream(spec.body.stream);
        init.duplex = 'half';
      }
      const signals = [
        spec.signal,
        this.requestTimeoutMs ? AbortSignal.timeout(this.requestTimeoutMs) : undefined,
      ].filter((s): s is AbortSignal => s !== undefined);
      if (signals.length) init.signal = signals.length === 1 ? signals[0]! : AbortSignal.any(signals);
      let res: Response;
      try {
        res = await fetch(url, init);
      } catch (e) {
        if (spec.signal?.aborted) throw new RequestAbortedError(spec.signal.reason);
        const err = new ConnectionError(`Cannot reach ${this.apiUrl}: ${describeFetchError(e)}`, e);
        if (replayable && attempt < this.maxAttempts) {
          await this.pause(attempt, spec.signal);
          continue;
        }
        throw err;
      }
      if (res.ok) return res;
      const err = await errorFromResponse(res);
      if (replayable && attempt < this.maxAttempts && retryable(res.status, err)) {
        await this.pause(attempt, spec.signal);
        continue;
      }
      throw err;
    }
  }

  /** The back-off before attempt + 1; an abort during it ends the call. */
  private async pause(attempt: number, signal: AbortSignal | undefined): Promise<void> {
    try {
      await sleep(this.retryDelayMs * 2 ** (attempt - 1), signal);
    } catch {
      throw new RequestAbortedError(signal?.reason);
    }
  }

  /** send() and the JSON of the answer. */
  async json<T>(spec: RequestSpec): Promise<T> {
    const res = await this.send(spec);
    return (await res.json()) as T;
  }
}

function retryable(status: number, err: LockstepError): boolean {
  if (err.code === 'IDEMPOTENCY_KEY_IN_PROGRESS') return true;
  // 503 is also a host that is not set up (CRIU_NOT_INSTALLED, ...): that does not pass by waiting.
  return status === 503 && err.code === 'SERVER_SHUTTING_DOWN';
}

function describeFetchError(e: unknown): string {
  const cause = (e as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? (e as Error).message ?? String(e);
}

function toWebStream(source: AsyncIterable<Uint8Array | string>): ReadableStream<Uint8Array> {
  const it = source[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await it.next();
      if (done) controller.close();
      else controller.enqueue(typeof value === 'string' ? Buffer.from(value, 'utf8') : value);
    },
    async cancel() {
      await it.return?.();
    },
  });
}

/** Longest single wait request; fetch gives up on answers that take 300 s. */
export const WAIT_SLICE_MS = 60_000;
/** The events of a newline-delimited JSON response, one object a line. */
export async function* ndjsonEvents(res: Response): AsyncGenerator<Record<string, unknown> & { type: string }> {
  if (!res.body) return;
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.trim()) yield JSON.parse(line) as Record<string, unknown> & { type: string };
    }
  }
  if (buf.trim()) yield JSON.parse(buf) as Record<string, unknown> & { type: string };
}
