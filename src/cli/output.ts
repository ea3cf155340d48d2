/**
 * CLI output: stable JSON with --json, readable text otherwise; colour only
 * on a terminal and never when NO_COLOR or CI is set. Exit codes are
 * documented in the README ("Exit codes").
 */
import { LockstepError } from '../errors.js';
import { envValue } from '../config.js';

export const EXIT = {
  ok: 0,
  failure: 1,
  usage: 2,
  notFound: 3,
  conflict: 4,
  host: 5,
} as const;

export const useColor = () => process.stdout.isTTY === true && !envValue('NO_COLOR') && !envValue('CI');

export function printJson(value: unknown): void {
  process.stdout.write(JSON.stringify(value, null, 2) + '\n');
}

/** A usage error (bad flags, missing arguments). */
export class UsageError extends LockstepError {
  constructor(message: string) {
    super('USAGE', message);
  }
}

export function exitCodeFor(e: unknown): number {
  if (!(e instanceof LockstepError)) return EXIT.failure;
  if (
    e.code === 'USAGE' ||
    e.code === 'INVALID_ARGUMENT' ||
    e.code === 'PATH_ESCAPES_SANDBOX' ||
    e.code === 'CONFIG_INVALID'
  )
    return EXIT.usage;
  if (e.code.endsWith('_NOT_FOUND')) return EXIT.notFound;
  if (
    e.code.endsWith('_EXISTS') ||
    e.code.startsWith('IDEMPOTENCY_KEY_') ||
    [
      'SANDBOX_BUSY',
      'IMAGE_IN_USE',
      'ROLLBACK_REFUSED_IRREVERSIBLE',
      'EFFECT_OUTCOME_UNKNOWN',
      'QUOTA_EXCEEDED',
      'TENANT_HAS_SANDBOXES',
      'SNAPSHOT_BUSY',
    ].includes(e.code)
  )
    return EXIT.conflict;
  if (
    e.code.startsWith('CRIU_') ||
    e.code.startsWith('HOST') ||
    e.code.startsWith('NATIVE_') ||
    ['NOT_ROOT', 'UNSUPPORTED_PLATFORM', 'CATALOG_TOO_NEW'].includes(e.code)
  )
    return EXIT.host;
  return EXIT.failure;
}

export function reportError(e: unknown, json: boolean): number {
  const code = exitCodeFor(e);
  if (json) {
    const err =
      e instanceof LockstepError
        ? e.toJSON()
        : { name: (e as Error)?.name ?? 'Error', code: 'INTERNAL', message: String((e as Error)?.message ?? e) };
    process.stdout.write(JSON.stringify({ error: err }, null, 2) + '\n');
  } else {
    const msg = e instanceof Error ? e.message : String(e);
    process.stderr.write(`lockstep: ${msg}\n`);
    if (!(e instanceof LockstepError) && envValue('LOCKSTEP_DEBUG')) process.stderr.write(`${(e as Error).stack}\n`);
  }
  return code;
}

/** Left-aligned text table. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (c ?? '').padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** Progress on stderr: a spinner on a terminal, plain lines otherwise. */
export class Progress {
  private timer: NodeJS.Timeout | undefined;
  private text = '';
  private frame = 0;
  private readonly tty = process.stderr.isTTY === true && !envValue('CI');
  /** ttyOnly: for short operations, draw on a terminal but print nothing to a pipe or log. */
  constructor(
    private readonly quiet = false,
    private readonly opts: { ttyOnly?: boolean } = {},
  ) {}
  update(text: string): void {
    if (this.quiet) return;
    this.text = text;
    if (!this.tty) {
      if (!this.opts.ttyOnly) process.stderr.write(`${text}\n`);
      return;
    }
    if (!this.timer) {
      this.timer = setInterval(() => this.draw(), 80);
      this.timer.unref();
    }
    this.draw();
  }
  private draw(): void {
    const frames = '⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏';
    process.stderr.write(
      `\r\x1b[2K${frames[this.frame++ % frames.length]} ${this.text.slice(0, (process.stderr.columns ?? 80) - 3)}`,
    );
  }
  done(text?: string): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.tty && !this.quiet) process.stderr.write('\r\x1b[2K');
    if (text && !this.quiet) process.stderr.write(`${text}\n`);
  }
}
