/**
 * Idempotency keys for the effect ledger: a stable hash of what an effect is, so the same
 * effect requested again (after a rollback, in a fork, by a retrying agent) is recognised.
 */
import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../errors.js';

/** A JSON value as the ledger stores it. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** Where a key must be unique: the whole lineage (every branch and fork) or one branch. */
export type EffectScope = 'lineage' | 'branch';

/** Inputs to deriveKey. */
export interface KeyParts {
  lineageId: string;
  /** Required when scope is 'branch'. */
  branchId?: string;
  /** Folded into the key when given: the effect is then distinct per tool call. */
  toolCallId?: string;
  kind: string;
  input: unknown;
  scope: EffectScope;
  /** Caller-chosen key; replaces kind/input/toolCallId but stays namespaced by lineage (and branch). */
  key?: string;
}

// Bump if the key derivation ever changes, so old and new keys cannot be confused.
const KEY_DOMAIN = 'lockstep.effect-key.v1';

/**
 * Canonical JSON (RFC 8785 style): object keys sorted by UTF-16 code units, no whitespace,
 * numbers in ECMAScript shortest form. Refuses anything JSON cannot represent faithfully
 * (undefined outside object properties, functions, symbols, BigInt, NaN/Infinity, cycles,
 * non-plain objects such as Date or Map) instead of letting JSON.stringify change it silently.
 * Object properties whose value is undefined are omitted, as in JSON.stringify.
 */
export function canonicalJson(value: unknown, field = 'input'): string {
  return encode(value, field, new Set());
}

function encode(v: unknown, f: string, path: Set<object>): string {
  switch (typeof v) {
    case 'string':
      return JSON.stringify(v);
    case 'boolean':
      return v ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(v)) throw new InvalidArgumentError(f, 'a finite number (JSON has no NaN or Infinity)', v);
      return JSON.stringify(v);
    case 'object':
      break;
    default:
      throw new InvalidArgumentError(f, 'a JSON value', v);
  }
  if (v === null) return 'null';
  if (path.has(v)) throw new InvalidArgumentError(f, 'acyclic JSON', v);
  path.add(v);
  let out: string;
  if (Array.isArray(v)) {
    out = `[${v.map((x, i) => encode(x, `${f}[${i}]`, path)).join(',')}]`;
  } else {
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) {
      throw new InvalidArgumentError(
        f,
        'a plain JSON object',
        `an instance of ${v.constructor?.name ?? 'an unknown class'}`,
      );
    }
    const o = v as Record<string, unknown>;
    const parts: string[] = [];
    for (const k of Object.keys(o).sort()) {
      if (o[k] === undefined) continue;
      parts.push(`${JSON.stringify(k)}:${encode(o[k], `${f}.${k}`, path)}`);
    }
    out = `{${parts.join(',')}}`;
  }
  path.delete(v);
  return out;
}

/**
 * The idempotency key of an effect: sha256 (hex) of a canonical JSON tuple. Lineage-scoped keys
 * omit the branch so forks and rollbacks of one lineage share them; branch-scoped keys include
 * it. A caller-given key replaces kind/input/toolCallId but is still namespaced the same way,
 * so two lineages (or tenants) choosing the same key never collide.
 */
export function deriveKey(parts: KeyParts): string {
  nonEmpty(parts.lineageId, 'lineageId');
  if (parts.scope !== 'lineage' && parts.scope !== 'branch')
    throw new InvalidArgumentError('scope', "'lineage' or 'branch'", parts.scope);
  const branch = parts.scope === 'branch' ? nonEmpty(parts.branchId, 'branchId') : null;
  let json: string;
  if (parts.key !== undefined) {
    json = canonicalJson([KEY_DOMAIN, 'caller', parts.lineageId, parts.scope, branch, nonEmpty(parts.key, 'key')]);
  } else {
    const toolCallId = parts.toolCallId === undefined ? null : nonEmpty(parts.toolCallId, 'toolCallId');
    const head = canonicalJson([
      KEY_DOMAIN,
      'derived',
      parts.lineageId,
      parts.scope,
      branch,
      nonEmpty(parts.kind, 'kind'),
      toolCallId,
    ]);
    // Encoded on its own so a bad value is reported as `input...`, the field the caller passed.
    json = `${head.slice(0, -1)},${canonicalJson(parts.input, 'input')}]`;
  }
  return createHash('sha256').update(json).digest('hex');
}

function nonEmpty(v: unknown, field: string): string {
  if (typeof v !== 'string' || v === '') throw new InvalidArgumentError(field, 'a non-empty string', v);
  return v;
}
