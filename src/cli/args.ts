/** Argument helpers over node:util parseArgs, with errors that name the flag. */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError } from './output.js';

export type Options = NonNullable<ParseArgsConfig['options']>;

type Value<O> = O extends { type: 'boolean' }
  ? O extends { multiple: true }
    ? boolean[]
    : boolean
  : O extends { multiple: true }
    ? string[]
    : string;
export interface Parsed<T extends Options> {
  values: { [K in keyof T]?: Value<T[K]> };
  positionals: string[];
}

export function parse<T extends Options>(argv: string[], options: T, usage: string): Parsed<T> {
  try {
    return parseArgs({ args: argv, options, allowPositionals: true, strict: true }) as unknown as Parsed<T>;
  } catch (e) {
    throw new UsageError(`${(e as Error).message}\nusage: ${usage}`);
  }
}

/** Splits argv at the first "--": flags before, command after. */
export function splitCommand(argv: string[]): [string[], string[]] {
  const i = argv.indexOf('--');
  return i < 0 ? [argv, []] : [argv.slice(0, i), argv.slice(i + 1)];
}

export function intFlag(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^-?\d+$/.test(value)) throw new UsageError(`--${flag} must be an integer, got ${JSON.stringify(value)}`);
  return Number(value);
}

/** A decimal flag (--cpus 0.5); range checks are the library's, which name the field. */
export function numberFlag(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^-?\d+(\.\d+)?$/.test(value)) throw new UsageError(`--${flag} must be a number, got ${JSON.stringify(value)}`);
  return Number(value);
}

/** ["K=V", ...] -> { K: V } */
export function envFlags(values: string[] | undefined): Record<string, string> | undefined {
  if (!values?.length) return undefined;
  const env: Record<string, string> = {};
  for (const kv of values) {
    const i = kv.indexOf('=');
    if (i <= 0) throw new UsageError(`--env takes KEY=VALUE, got ${JSON.stringify(kv)}`);
    env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return env;
}

export function need(positionals: string[], n: number, usage: string): string[] {
  if (positionals.length < n) throw new UsageError(`missing arguments\nusage: ${usage}`);
  if (positionals.length > n)
    throw new UsageError(`unexpected argument ${JSON.stringify(positionals[n])}\nusage: ${usage}`);
  return positionals;
}
