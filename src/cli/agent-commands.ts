/**
 * CLI commands for the agent's side: contexts on checkpoints, the rollback
 * report, and the effect ledger.
 */
import fs from 'node:fs';
import { EXIT, Progress, UsageError, printJson, table } from './output.js';
import { need, parse } from './args.js';
import { CONTEXT_FORMATS, type AgentContext } from '../context/formats.js';
import { InvalidArgumentError } from '../errors.js';
import type { JsonValue } from '../effects/idempotency.js';
import type { Reversibility } from '../effects/effect-ledger.js';
import { withLockstep } from './session.js';
import { command, subcommandUsage } from './command-table.js';

type Handler = (argv: string[]) => Promise<number>;

function jsonArg(text: string | undefined, field: string): JsonValue {
  if (text === undefined) throw new InvalidArgumentError(field, 'a JSON value', undefined);
  try {
    return JSON.parse(text) as JsonValue;
  } catch {
    throw new InvalidArgumentError(field, 'valid JSON', text);
  }
}

/**
 * Reads a context file. JSON formats accept either the whole context object
 * ({format, messages, ...}) or just the payload (the messages array, or the
 * object without "format"); "bytes" takes the file's raw bytes.
 */
export function readContextFile(file: string, format: string | undefined, mediaType: string | undefined): AgentContext {
  if (format !== undefined && !(CONTEXT_FORMATS as readonly string[]).includes(format)) {
    throw new InvalidArgumentError('context-format', CONTEXT_FORMATS.join(', '), format);
  }
  let raw: Buffer;
  try {
    raw = fs.readFileSync(file);
  } catch {
    throw new InvalidArgumentError('context', 'a readable file', file);
  }
  if (format === 'bytes')
    return { format: 'bytes', mediaType: mediaType ?? 'application/octet-stream', data: new Uint8Array(raw) };
  let value: unknown;
  try {
    value = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new InvalidArgumentError('context', 'a JSON file (or --context-format bytes)', file);
  }
  if (value && typeof value === 'object' && !Array.isArray(value) && 'format' in value) return value as AgentContext;
  if (!format) throw new UsageError('--context-format is required when the file holds only the payload');
  switch (format) {
    case 'openai-chat':
    case 'ai-sdk':
      return {
        format,
        messages: Array.isArray(value) ? value : (value as { messages: unknown[] }).messages,
      } as AgentContext;
    case 'openai-responses':
      return { format, items: Array.isArray(value) ? value : (value as { items: unknown[] }).items } as AgentContext;
    case 'anthropic':
      return (Array.isArray(value) ? { format, messages: value } : { format, ...(value as object) }) as AgentContext;
    case 'langgraph':
      return { format, ...(value as object) } as AgentContext;
    default:
      throw new InvalidArgumentError('context-format', CONTEXT_FORMATS.join(', '), format);
  }
}

export const agentCommands: Record<string, Handler> = {
  async checkpoint(argv) {
    const { options, usage } = command('checkpoint');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    const context = values.context
      ? readContextFile(values.context, values['context-format'], values['media-type'])
      : undefined;
    return withLockstep(async (ls) => {
      // A large sandbox takes a while: a spinner on a terminal, nothing otherwise.
      const progress = new Progress(values.json === true, { ttyOnly: true });
      progress.update(`checkpointing ${id}`);
      const ck = await ls
        .get(id!)
        .checkpoint({ label: values.label, context })
        .finally(() => progress.done());
      if (values.json) printJson(ck);
      else
        process.stdout.write(
          `${ck.id}  (${ck.timings.totalMs?.toFixed(1)} ms, frozen ${ck.timings.frozenMs?.toFixed(1)} ms)\n`,
        );
      return EXIT.ok;
    });
  },

  async rollback(argv) {
    const { options, usage } = command('rollback');
    const { values, positionals } = parse(argv, options, usage);
    const [id, ckpt] = need(positionals, 2, usage);
    return withLockstep(async (ls) => {
      const progress = new Progress(values.json === true, { ttyOnly: true });
      progress.update(`rolling ${id} back to ${ckpt}`);
      const r = await ls
        .get(id!)
        .rollback(ckpt!, {
          policy: values.policy as 'warn' | 'refuse' | undefined,
          failure: values.failure,
          lessons: values.lesson,
        })
        .finally(() => progress.done());
      if (values.json) printJson(r);
      else {
        process.stdout.write(
          `${id} rolled back to ${ckpt} in ${r.timings.totalMs.toFixed(1)} ms (new branch ${r.branchId})\n`,
        );
        if (r.staleObservations.length)
          process.stdout.write(`${r.staleObservations.length} observation(s) went stale\n`);
        for (const w of r.warnings) process.stderr.write(`warning: ${w.message}\n`);
      }
      return EXIT.ok;
    });
  },

  async effect(argv) {
    const [sub, ...rest] = argv;
    if (sub === 'begin') {
      const { options, usage } = command('effect begin');
      const { values, positionals } = parse(rest, options, usage);
      const [id] = need(positionals, 1, usage);
      if (!values.kind) throw new InvalidArgumentError('kind', 'an effect kind such as "email.send"', undefined);
      if (values.irreversible && values.compensable)
        throw new UsageError('--irreversible and --compensable exclude each other');
      const reversibility: Reversibility = values.irreversible
        ? 'irreversible'
        : values.compensable
          ? 'compensable'
          : 'sandbox-local';
      if (values.scope !== undefined && values.scope !== 'lineage' && values.scope !== 'branch')
        throw new InvalidArgumentError('scope', '"lineage" or "branch"', values.scope);
      return withLockstep(async (ls) => {
        const r = ls.get(id!).effects.begin({
          kind: values.kind!,
          input: jsonArg(values.input, 'input'),
          reversibility,
          ...(values.key ? { key: values.key } : {}),
          ...(values.scope ? { scope: values.scope as 'lineage' | 'branch' } : {}),
          ...(values['tool-call'] ? { toolCallId: values['tool-call'] } : {}),
          ...(values.compensation ? { compensation: jsonArg(values.compensation, 'compensation') as never } : {}),
        });
        printJson(
          r.replayed
            ? { effectId: r.effectId, idempotencyKey: r.idempotencyKey, replayed: true, output: r.output ?? null }
            : { effectId: r.effectId, idempotencyKey: r.idempotencyKey, replayed: false },
        );
        return EXIT.ok;
      });
    }
    if (sub === 'commit') {
      const { options, usage } = command('effect commit');
      const { values, positionals } = parse(rest, options, usage);
      const [id, effectId] = need(positionals, 2, usage);
      return withLockstep(async (ls) => {
        const fx = ls.get(id!).effects;
        fx.get(effectId!);
        fx.commit(effectId!, values.output === undefined ? undefined : jsonArg(values.output, 'output'));
        printJson({ effectId, status: fx.get(effectId!).status });
        return EXIT.ok;
      });
    }
    if (sub === 'fail') {
      const { options, usage } = command('effect fail');
      const { values, positionals } = parse(rest, options, usage);
      const [id, effectId] = need(positionals, 2, usage);
      return withLockstep(async (ls) => {
        const fx = ls.get(id!).effects;
        fx.get(effectId!);
        fx.fail(effectId!, new Error(values.error ?? 'failed'), { definite: values.definite === true });
        printJson({ effectId, status: fx.get(effectId!).status });
        return EXIT.ok;
      });
    }
    throw new UsageError(`usage:\n${subcommandUsage('effect')}`);
  },

  async effects(argv) {
    const { options, usage } = command('effects');
    const { values, positionals } = parse(argv, options, usage);
    const [id] = need(positionals, 1, usage);
    return withLockstep(async (ls) => {
      const list = ls.get(id!).effects.list();
      if (values.json) printJson(list);
      else
        process.stdout.write(
          table(
            ['EFFECT', 'KIND', 'STATUS', 'REVERSIBILITY', 'SCOPE', 'TOOL CALL'],
            list.map((e) => [e.id, e.kind, e.status, e.reversibility, e.scope, e.toolCallId ?? '']),
          ) + '\n',
        );
      return EXIT.ok;
    });
  },
};
