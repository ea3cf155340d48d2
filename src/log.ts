/** Structured logging: one pino root logger, child loggers bound to sandbox and checkpoint ids. */
import fs from 'node:fs';
import pino from 'pino';
import { DEFAULTS, envValue } from './config.js';

export type Logger = pino.Logger;

/** syslog priority of each pino level (journald files the line under it). */
const PRIORITY: Record<number, number> = { 10: 7, 20: 7, 30: 6, 40: 4, 50: 3, 60: 2 };

/**
 * True when stderr is a journald stream: systemd sets JOURNAL_STREAM to the
 * stream's "device:inode" (sd_journal_stream_fd(3) says to compare them).
 */
export function stderrIsJournal(env: NodeJS.ProcessEnv = process.env): boolean {
  const [dev, ino] = (env.JOURNAL_STREAM ?? '').split(':');
  if (!dev || !ino) return false;
  try {
    const st = fs.fstatSync(2, { bigint: true });
    return String(st.dev) === dev && String(st.ino) === ino;
  } catch {
    return false;
  }
}

/**
 * Under journald each JSON line gets a `<N>` syslog prefix, which journald
 * strips and stores as the entry's PRIORITY (`journalctl -p warning` then
 * works); the message stays the bare JSON line.
 */
export function journalDestination(dest: pino.DestinationStream): pino.DestinationStream {
  return {
    write(line: string) {
      const level = /^\{"level":(\d+)/.exec(line);
      dest.write(`<${PRIORITY[Number(level?.[1])] ?? 6}>${line}`);
    },
  };
}

/** Logs JSON to stderr; LOCKSTEP_LOG_LEVEL sets the level (default warn, so CLI output stays clean). */
export function createLogger(level: string = envValue('LOCKSTEP_LOG_LEVEL') ?? DEFAULTS.logLevel): Logger {
  const dest = pino.destination(2);
  return pino({ level, base: { app: 'lockstep' } }, stderrIsJournal() ? journalDestination(dest) : dest);
}
