/** Structured logging: one pino root logger, child loggers bound to sandbox and checkpoint ids. */
import pino from 'pino';

export type Logger = pino.Logger;

/** Logs JSON to stderr; LOCKSTEP_LOG_LEVEL sets the level (default warn, so CLI output stays clean). */
export function createLogger(level = process.env.LOCKSTEP_LOG_LEVEL ?? 'warn'): Logger {
  return pino({ level, base: { app: 'lockstep' } }, pino.destination(2));
}
