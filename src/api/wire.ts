/**
 * What travels as JSON and what the library takes: agent contexts (whose
 * "bytes" format carries a Uint8Array, base64 on the wire), rollback
 * reports, and the field names the SDK uses where the library's differ.
 */
import { CONTEXT_FORMATS, validateContext, type AgentContext, type ContextFormat } from '../context/formats.js';
import { InvalidArgumentError, LockstepError } from '../errors.js';
import type { RollbackReport } from '../checkpoints/rollback.js';

/**
 * A context as sent: either a whole context object ({format, ...}), or with
 * `contextFormat` just its payload (the messages or items array, or the
 * object without "format"). For "bytes", `data` is base64.
 */
export function contextFromWire(context: unknown, contextFormat: string | undefined): AgentContext {
  if (contextFormat !== undefined && !(CONTEXT_FORMATS as readonly string[]).includes(contextFormat)) {
    throw new InvalidArgumentError('contextFormat', `one of ${CONTEXT_FORMATS.join(', ')}`, contextFormat);
  }
  let ctx: Record<string, unknown>;
  if (Array.isArray(context)) {
    if (contextFormat === undefined)
      throw new InvalidArgumentError('contextFormat', 'the format of the context array', undefined);
    const key =
      contextFormat === 'openai-responses'
        ? 'items'
        : contextFormat === 'langgraph' || contextFormat === 'bytes'
          ? undefined
          : 'messages';
    if (!key) throw new InvalidArgumentError('context', `an object for format ${contextFormat}`, context);
    ctx = { format: contextFormat, [key]: context };
  } else if (typeof context === 'object' && context !== null) {
    ctx = { ...(context as Record<string, unknown>) };
    if (ctx.format === undefined) {
      if (contextFormat === undefined)
        throw new InvalidArgumentError(
          'context.format',
          `one of ${CONTEXT_FORMATS.join(', ')} (or give contextFormat)`,
          undefined,
        );
      ctx.format = contextFormat;
    } else if (contextFormat !== undefined && ctx.format !== contextFormat) {
      throw new InvalidArgumentError(
        'contextFormat',
        `the context's own format ${JSON.stringify(ctx.format)}`,
        contextFormat,
      );
    }
  } else {
    throw new InvalidArgumentError('context', 'an object or an array', context);
  }
  if (ctx.format === 'bytes') {
    if (typeof ctx.data !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(ctx.data))
      throw new InvalidArgumentError('context.data', 'base64 text', ctx.data);
    ctx.data = new Uint8Array(Buffer.from(ctx.data, 'base64'));
  }
  return validateContext(ctx);
}

/** A stored context as JSON: Uint8Array (bytes data, or binary inside messages) becomes base64. */
export function contextToWire(ctx: AgentContext | null): unknown {
  return ctx === null ? null : toJsonSafe(ctx);
}

function toJsonSafe(v: unknown): unknown {
  if (v instanceof Uint8Array) return Buffer.from(v).toString('base64');
  if (Array.isArray(v)) return v.map(toJsonSafe);
  if (v && typeof v === 'object' && !(v instanceof Date)) {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toJsonSafe(x)]));
  }
  return v;
}

/** A rollback report as JSON; without the recovery summary and annotated context unless asked for. */
export function rollbackToWire(r: RollbackReport, withRecoverySummary: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = {
    ...r,
    context: contextToWire(r.context),
    contextWithRecovery: contextToWire(r.contextWithRecovery),
  };
  if (!withRecoverySummary) {
    delete out.contextWithRecovery;
    delete out.recoverySummary;
  }
  return out;
}

/** The library names some inputs differently from the SDK's wire names (command → cmd, env → envs). */
export function renameField(err: unknown, names: Record<string, string>): unknown {
  if (!(err instanceof LockstepError)) return err;
  const field = typeof err.details.field === 'string' ? err.details.field : undefined;
  if (field === undefined) return err;
  const head = /^[^.[]+/.exec(field)?.[0] ?? field;
  const renamed = names[head];
  if (renamed === undefined) return err;
  const newField = renamed + field.slice(head.length);
  (err.details as Record<string, unknown>).field = newField;
  if (err instanceof InvalidArgumentError) (err as { field: string }).field = newField;
  Object.defineProperty(err, 'message', { value: err.message.replace(`Invalid ${field}:`, `Invalid ${newField}:`) });
  return err;
}

export type { ContextFormat };
