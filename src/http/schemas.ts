/**
 * JSON schemas of the API's inputs (validated by fastify with
 * additionalProperties: false) and of its outputs (for the OpenAPI document
 * only: responses are serialised with JSON.stringify, see server.ts).
 */
import { CONTEXT_FORMATS } from '../context/formats.js';
import { LIMITS } from '../lifecycle/create.js';
import { MAX_FORKS } from '../checkpoints/fork.js';
import { MAX_SNAPSHOT_STARTS } from '../snapshots/snapshots.js';
import { LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT } from '../instances/files.js';
import { COMMAND_TIMEOUT_MAX_MS, IMAGE_NAME_MAX, SANDBOX_LIFETIME_MS } from '../limits.js';

type Schema = Record<string, unknown>;

/**
 * The server's ajv options (server.ts): reject what does not fit instead of
 * quietly fixing it, so no type coercion, no stripping of unknown properties.
 */
export const AJV_OPTIONS = {
  removeAdditional: false,
  coerceTypes: false,
  useDefaults: false,
  allErrors: false,
  allowUnionTypes: true,
} as const;

/**
 * What docs/http-reference.md's Routes table says of a route beyond its
 * method and path: its "Body / query" and "Success" cells, word for word.
 * Each route's schema carries it as `x-lockstep-doc`; @fastify/swagger puts
 * `x-` keys of a route schema into the operation in /openapi.json, and
 * fastify compiles only body, querystring, params, headers and response, so
 * it validates nothing. `npm run docs:http` renders the table from the
 * document (scripts/http-reference.mjs).
 */
export interface RouteDoc {
  /** The Body / query cell (none: the route takes no input). */
  input?: string;
  /** The Success cell: the status first, then what comes back and the notes on it. */
  success: string;
}

declare module 'fastify' {
  interface FastifySchema {
    'x-lockstep-doc'?: RouteDoc;
  }
}

const ENV_NAME = '^[A-Za-z_][A-Za-z0-9_]*$';

export const errorBody: Schema = {
  type: 'object',
  description: 'Every error: a stable code, a sentence, and the offending input when there is one',
  properties: {
    error: {
      type: 'object',
      properties: { code: { type: 'string' }, message: { type: 'string' }, field: { type: 'string' } },
      required: ['code', 'message'],
    },
  },
  required: ['error'],
};

/** Error responses every authenticated route can give. */
export function errors(...statuses: number[]): Record<number, Schema> {
  const out: Record<number, Schema> = {};
  for (const s of [400, 401, 404, ...statuses, 500]) out[s] = { ...errorBody, description: STATUS_TEXT[s] ?? 'Error' };
  return out;
}

const STATUS_TEXT: Record<number, string> = {
  400: 'Invalid input (code INVALID_ARGUMENT, INVALID_JSON or PATH_ESCAPES_SANDBOX; `field` names the input)',
  401: 'Missing or unknown bearer token',
  404: "No such sandbox, checkpoint, effect or file for this tenant (another tenant's look exactly like missing ones)",
  409:
    'Conflict with the current state (busy, refused, outcome unknown, ' +
    'idempotency key reused or in progress, checkpoint corrupt)',
  413: 'Body too large',
  415: 'Unsupported Content-Type',
  422:
    'A requested limit this host cannot enforce (LIMIT_UNSUPPORTED; `field` names it), ' +
    'or a bundle it cannot run or does not trust (SNAPSHOT_INCOMPATIBLE, BUNDLE_UNTRUSTED)',
  429:
    'A tenant quota would be exceeded (QUOTA_EXCEEDED), or too many of these requests are in flight ' +
    '(RATE_LIMITED; retry after Retry-After seconds)',
  501: 'No snapshot store is configured on this server (STORE_NOT_CONFIGURED)',
  503: 'The server is shutting down, or the snapshot store cannot be reached (STORE_UNAVAILABLE)',
  507: "A write past the sandbox's disk quota (DISK_QUOTA_EXCEEDED) or a full layer store (DISK_FULL)",
  504: 'The command timed out (COMMAND_TIMEOUT)',
  500: 'Internal error (details only in the server log)',
};

const str = (maxLength: number, extra: Schema = {}): Schema => ({ type: 'string', minLength: 1, maxLength, ...extra });
const int = (minimum: number, maximum: number, description?: string): Schema => ({
  type: 'integer',
  minimum,
  maximum,
  ...(description ? { description } : {}),
});
const bool = (description: string): Schema => ({ type: 'boolean', description });
const flag = (description: string): Schema => ({ type: 'string', enum: ['true', 'false'], description });
const envs: Schema = {
  type: 'object',
  propertyNames: { pattern: ENV_NAME, maxLength: 256 },
  additionalProperties: { type: 'string', maxLength: 131072 },
  maxProperties: 256,
  description: 'Environment variables',
};
const toolCallId = str(200, { description: "The agent's tool-call id, recorded with the observation" });
const anyJson: Schema = { description: 'Any JSON value' };

export const sandboxId = str(64, { pattern: '^sbx_[a-z0-9]+$', description: 'Sandbox id' });
export const checkpointId = str(64, { pattern: '^ckpt_[a-z0-9]+$', description: 'Checkpoint id' });
export const effectId = str(64, { pattern: '^eff_[0-9a-f]+$', description: 'Effect id' });
export const snapshotRef = str(64, {
  pattern: '^(snap_[a-z0-9]+|[a-z0-9][a-z0-9._-]{0,63})$',
  description: 'Snapshot id (snap_…) or name',
});

export const sandboxParams: Schema = {
  type: 'object',
  properties: { id: sandboxId },
  required: ['id'],
  additionalProperties: false,
};
export const checkpointParams: Schema = {
  type: 'object',
  properties: { id: sandboxId, ckpt: checkpointId },
  required: ['id', 'ckpt'],
  additionalProperties: false,
};
export const snapshotParams: Schema = {
  type: 'object',
  properties: { snap: snapshotRef },
  required: ['snap'],
  additionalProperties: false,
};
export const effectParams: Schema = {
  type: 'object',
  properties: { id: sandboxId, effectId },
  required: ['id', 'effectId'],
  additionalProperties: false,
};
export const pidParams: Schema = {
  type: 'object',
  properties: {
    id: sandboxId,
    pid: { type: 'string', pattern: '^[1-9][0-9]{0,8}$', description: 'pid inside the sandbox' },
  },
  required: ['id', 'pid'],
  additionalProperties: false,
};

const obj = (properties: Record<string, Schema>, required: string[] = [], description?: string): Schema => ({
  type: 'object',
  properties,
  required,
  additionalProperties: false,
  ...(description ? { description } : {}),
});

// ---------------------------------------------------------------- inputs

export const createBody = obj({
  image: str(IMAGE_NAME_MAX, { pattern: '^[a-z0-9][a-z0-9._-]*$', description: 'Image name (default "base")' }),
  memoryMb: int(LIMITS.memoryMb.min, LIMITS.memoryMb.max, `Memory limit in MiB (default ${LIMITS.memoryMb.default})`),
  pids: int(LIMITS.pids.min, LIMITS.pids.max, `Most processes (default ${LIMITS.pids.default})`),
  cpuWeight: int(
    LIMITS.cpuWeight.min,
    LIMITS.cpuWeight.max,
    `Relative CPU weight, cgroup v2 scale (default ${LIMITS.cpuWeight.default} or ` +
      `the tenant's default; v1 cpu.shares = weight * 1024 / 100)`,
  ),
  cpus: {
    type: 'number',
    minimum: LIMITS.cpus.min,
    maximum: LIMITS.cpus.max,
    description: 'Hard CPU cap in CPUs, at most two decimals (0.5 = half a core); default none',
  },
  ioWeight: int(
    LIMITS.ioWeight.min,
    LIMITS.ioWeight.max,
    'Relative I/O weight; 422 LIMIT_UNSUPPORTED where no I/O scheduler honours one (see lockstep doctor)',
  ),
  diskMb: int(
    LIMITS.diskMb.min,
    LIMITS.diskMb.max,
    'Disk quota of the writable layer in MiB (writes past it fail with EDQUOT); default none',
  ),
  envs,
  network: {
    type: 'string',
    enum: ['none', 'egress'],
    description:
      '"none": loopback only (default, or the tenant\'s default); "egress": a routed address, outbound under allowOut',
  },
  allowOut: {
    type: 'array',
    maxItems: 256,
    items: str(300),
    description:
      'Allow list of an egress sandbox: IPv4 addresses or CIDRs and domain names (with their subdomains), each optionally with :PORT or :LOW-HIGH; empty: anywhere outside the deny list',
  },
  bandwidthMbit: int(1, 100_000, 'Bandwidth cap of an egress sandbox, Mbit/s each way'),
  timeoutMs: int(
    SANDBOX_LIFETIME_MS.min,
    SANDBOX_LIFETIME_MS.max,
    'Lifetime: the sandbox is removed this long after creation',
  ),
  fromSnapshot: {
    ...snapshotRef,
    description:
      'Start from this snapshot (its processes, files and lineage) instead of an image; takes none of the other fields',
  },
  metadata: {
    type: 'object',
    additionalProperties: { type: 'string', maxLength: 1024 },
    maxProperties: 64,
    description: 'Free-form string labels',
  },
});

export const runBody = obj(
  {
    cmd: {
      oneOf: [
        str(131072, { description: 'Run through /bin/sh -c' }),
        {
          type: 'array',
          items: { type: 'string', maxLength: 131072 },
          minItems: 1,
          maxItems: 4096,
          description: 'argv, run directly',
        },
      ],
    },
    cwd: str(4096, { pattern: '^/', description: 'Working directory (default /workspace)' }),
    envs,
    timeoutMs: int(1, COMMAND_TIMEOUT_MAX_MS, 'Kill the command after this long (504 COMMAND_TIMEOUT)'),
    toolCallId,
    background: bool('Start it in the background and return its pid at once'),
    stdin: bool('With background: keep its stdin open for POST .../stdin (default: /dev/null)'),
  },
  ['cmd'],
);

const dimension = (what: string): Schema => int(1, 65535, what);
export const ptyCreateBody = obj(
  {
    cols: dimension('Terminal width in columns'),
    rows: dimension('Terminal height in rows'),
    cmd: {
      oneOf: [
        str(131072, { description: 'Run through /bin/sh -c' }),
        {
          type: 'array',
          items: { type: 'string', maxLength: 131072 },
          minItems: 1,
          maxItems: 4096,
          description: 'argv, run directly',
        },
      ],
      description: 'Default /bin/sh -i',
    },
    cwd: str(4096, { pattern: '^/', description: 'Working directory (default /workspace)' }),
    envs,
  },
  ['cols', 'rows'],
);
export const ptyResizeBody = obj({ cols: dimension('Columns'), rows: dimension('Rows') }, ['cols', 'rows']);
/** `GET /sandboxes?metadata.KEY=VALUE`: only sandboxes with every label named (the names are free-form). */
export const sandboxListQuery: Schema = {
  type: 'object',
  patternProperties: {
    '^metadata\\..+$': { type: 'string', maxLength: 1024, description: 'A label the sandbox must have (KEY=VALUE)' },
  },
  additionalProperties: false,
};
export const offsetQuery = obj({
  offset: { type: 'string', pattern: '^(0|[1-9][0-9]{0,15})$', description: 'Byte offset to read from (default 0)' },
});

export const waitBody = obj({ timeoutMs: int(1, 24 * 3600 * 1000) });
export const killBody = obj({
  signal: { type: 'string', enum: ['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2'] },
});

export const pathQuery = (extra: Record<string, Schema> = {}): Schema =>
  obj(
    {
      path: str(4096, { description: 'Path inside the sandbox (relative paths are under /workspace)' }),
      toolCallId,
      ...extra,
    },
    ['path'],
  );

export const readQuery = pathQuery({
  encoding: {
    type: 'string',
    enum: ['utf8', 'base64'],
    description: 'Default: utf8 when the bytes are valid UTF-8, else base64',
  },
});
/** A directory page: entries sorted by name, at most `limit`, after `cursor` (src/instances/dir-page.ts). */
export const listQuery = pathQuery({
  // A query string is text (no coercion here): the range is checked by the library.
  limit: {
    type: 'string',
    pattern: '^[1-9][0-9]{0,5}$',
    description: `Entries in this page (default ${LIST_DEFAULT_LIMIT}, at most ${LIST_MAX_LIMIT})`,
  },
  cursor: str(4096, { description: "The previous page's nextCursor: the entries whose names sort after it" }),
});
export const existsQuery = obj({ path: str(4096) }, ['path']);

export const writeJsonBody = obj(
  {
    content: { type: 'string', maxLength: 16 * 1024 * 1024 },
    encoding: { type: 'string', enum: ['utf8', 'base64'], description: 'Encoding of content (default utf8)' },
    mode: int(0, 0o7777, 'File mode (default 0644)'),
    toolCallId,
  },
  ['content'],
);

const contextSchema: Schema = {
  type: ['object', 'array'],
  description:
    `The agent's context: a whole context object {format: ${CONTEXT_FORMATS.join('|')}, ...}, or ` +
    `with contextFormat just its messages/items array. For "bytes", data is base64.`,
};

export const checkpointBody = obj({
  label: { type: 'string', maxLength: 200, pattern: '^[^\\n\\u0000]*$' },
  context: contextSchema,
  contextFormat: { type: 'string', enum: [...CONTEXT_FORMATS] },
});

export const rollbackBody = obj(
  {
    checkpointId,
    policy: {
      type: 'string',
      enum: ['warn', 'refuse'],
      description: '"refuse" blocks the rollback when irreversible effects happened after the checkpoint (409)',
    },
    failure: { type: 'string', maxLength: 4000, description: 'Why the abandoned attempt failed' },
    lessons: { type: 'array', items: { type: 'string', maxLength: 2000 }, maxItems: 100 },
    withRecoverySummary: bool('Include recoverySummary and contextWithRecovery (default true)'),
  },
  ['checkpointId'],
);

export const forkBody = obj({ checkpointId, count: int(1, MAX_FORKS) }, ['checkpointId']);
const snapshotName = str(64, {
  pattern: '^[a-z0-9][a-z0-9._-]{0,63}$',
  description: "Unique among the tenant's snapshots",
});
const labels: Schema = {
  type: 'object',
  additionalProperties: { type: 'string', maxLength: 1024 },
  maxProperties: 64,
  description: 'Free-form labels',
};
export const snapshotBody = obj({ checkpointId, name: snapshotName, metadata: labels }, ['checkpointId']);
export const snapshotStartBody = obj({ count: int(1, MAX_SNAPSHOT_STARTS) });
export const importQuery = obj({ name: snapshotName });
export const pullBody = obj(
  {
    from: str(2048, { description: "Base URL of the source server (one of this server's LOCKSTEP_PULL_SOURCES)" }),
    snapshot: snapshotRef,
    token: str(512, { description: 'A token of the tenant on the source server' }),
    name: snapshotName,
  },
  ['from', 'snapshot', 'token'],
);

export const storeKey = str(128, {
  pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$',
  description: "A bundle's key in the tenant's part of the snapshot store",
});
export const storeKeyParams: Schema = {
  type: 'object',
  properties: { key: storeKey },
  required: ['key'],
  additionalProperties: false,
};
export const pushBody = obj({ key: storeKey });
export const storePullBody = obj({ name: snapshotName });

const reversibility: Schema = { type: 'string', enum: ['sandbox-local', 'compensable', 'irreversible'] };

export const effectBeginBody = obj(
  {
    kind: str(200),
    input: anyJson,
    reversibility,
    scope: { type: 'string', enum: ['lineage', 'branch'] },
    key: str(200, { description: 'Caller-chosen idempotency key' }),
    toolCallId,
    compensation: obj({ kind: str(200), input: anyJson }, ['kind', 'input'], 'How to take a compensable effect back'),
  },
  ['kind', 'input', 'reversibility'],
);

export const effectCommitBody = obj({ output: anyJson });
export const effectFailBody = obj(
  {
    error: {
      oneOf: [
        { type: 'string', maxLength: 4000 },
        obj({ name: str(200), message: { type: 'string', maxLength: 4000 }, code: str(200) }, ['message']),
      ],
    },
    definite: bool('True if the effect certainly did not happen (it may then be retried)'),
  },
  ['error', 'definite'],
);
export const effectResolveBody = obj({ outcome: { type: 'string', enum: ['committed', 'failed'] }, output: anyJson }, [
  'outcome',
]);

export const verdictBody = obj({ path: str(4096), verdict: str(500), toolCallId }, ['path', 'verdict']);
export const observationsQuery = obj({ includeStale: flag('Include observations a rollback made stale') });
export const verdictsQuery = obj({ stale: flag('Only verdicts whose file changed since') });

// ---------------------------------------------------------------- outputs (documentation)

const loose = (description: string, properties: Record<string, Schema> = {}): Schema => ({
  type: 'object',
  description,
  properties,
  additionalProperties: true,
});

export const sandboxInfo = loose('A sandbox', {
  id: { type: 'string' },
  image: { type: 'string' },
  state: { type: 'string', enum: ['creating', 'running', 'stopped', 'removing'] },
  memoryMb: { type: ['number', 'null'] },
  pids: { type: ['integer', 'null'] },
  cpuWeight: { type: ['integer', 'null'] },
  cpus: { type: ['number', 'null'] },
  ioWeight: { type: ['integer', 'null'] },
  diskMb: { type: ['number', 'null'] },
  headCheckpointId: { type: ['string', 'null'] },
  forkedFrom: { type: ['string', 'null'] },
  tenant: { type: ['string', 'null'], description: "The owning tenant's name" },
  tenantId: { type: ['string', 'null'], description: "The owning tenant's immutable id (tn_…)" },
  metadata: { type: 'object', additionalProperties: { type: 'string' } },
  createdAt: { type: 'string', format: 'date-time' },
  expiresAt: { type: ['string', 'null'], format: 'date-time' },
  network: loose('Network mode, addresses and allow list', {
    mode: { type: 'string', enum: ['none', 'egress'] },
    address: { type: ['string', 'null'] },
    gateway: { type: ['string', 'null'] },
    allowOut: { type: 'array', items: { type: 'string' } },
    bandwidthMbit: { type: ['integer', 'null'] },
  }),
});
export const runResult = loose('The finished command (or {pid} for background)', {
  exitCode: { type: 'integer' },
  stdout: { type: 'string' },
  stderr: { type: 'string' },
  signal: { type: 'string' },
  truncated: { type: 'boolean' },
  durationMs: { type: 'number' },
  observationId: { type: 'string' },
  pid: { type: 'integer' },
});
export const checkpointInfo = loose('A checkpoint', {
  id: { type: 'string' },
  parentId: { type: ['string', 'null'] },
  label: { type: ['string', 'null'] },
  contextId: { type: ['string', 'null'] },
  createdAt: { type: 'string' },
});
export const rollbackReport = loose(
  'The rollback report: restored process, context at the checkpoint, ' +
    'stale observations, effects after, recovery summary',
  {
    checkpointId: { type: 'string' },
    branchId: { type: 'string' },
    context: {},
    contextWithRecovery: {},
    staleObservations: { type: 'array', items: { type: 'object', additionalProperties: true } },
    effectsAfter: { type: 'array', items: { type: 'object', additionalProperties: true } },
    staleVerdicts: { type: 'array', items: { type: 'object', additionalProperties: true } },
    warnings: { type: 'array', items: { type: 'object', additionalProperties: true } },
    recoverySummary: { type: 'object', additionalProperties: true },
  },
);
export const forkResult = loose(
  'One result per sandbox asked for, in order (`results`); `ids` and `errors` list the same without the order',
  {
    results: {
      type: 'array',
      items: {
        oneOf: [
          {
            type: 'object',
            description: 'Started: its id and how long it took (ms)',
            properties: { id: { type: 'string' }, ms: { type: 'integer' } },
            required: ['id', 'ms'],
          },
          {
            type: 'object',
            description: 'Failed: its error body (code, message, field?) with the status that error has alone',
            properties: {
              error: {
                type: 'object',
                properties: {
                  code: { type: 'string' },
                  message: { type: 'string' },
                  field: { type: 'string' },
                  status: { type: 'integer' },
                },
                required: ['code', 'message', 'status'],
              },
            },
            required: ['error'],
          },
        ],
      },
    },
    ids: { type: 'array', items: { type: 'string' }, description: 'The ids of those started' },
    errors: {
      type: 'array',
      items: { type: 'object', additionalProperties: true },
      description: 'The errors (code, message) of those that failed',
    },
  },
);
export const effectRecord = loose('A ledger row', {
  id: { type: 'string' },
  kind: { type: 'string' },
  status: { type: 'string' },
  idempotencyKey: { type: 'string' },
});
export const beginResult = loose(
  'Run the effect now (replayed: false), or what it returned last time (replayed: true)',
  { replayed: { type: 'boolean' }, effectId: { type: 'string' }, output: {} },
);
export const arrayOf = (items: Schema, description: string): Schema => ({ type: 'array', items, description });
export const anyObject = (description: string): Schema => loose(description);
export const storedBundle = loose('A bundle in the snapshot store', {
  name: { type: 'string' },
  digest: { type: 'string' },
  bytes: { type: 'integer' },
  chunks: { type: 'integer' },
  chunkBytes: { type: 'integer' },
  createdAt: { type: 'string' },
});
export const snapshotInfo = loose('A snapshot', {
  id: { type: 'string' },
  name: { type: ['string', 'null'] },
  tenant: { type: ['string', 'null'] },
  metadata: { type: 'object', additionalProperties: { type: 'string' } },
  sizeBytes: { type: 'integer' },
  image: { type: 'string' },
  lineageId: { type: 'string' },
  sourceSandboxId: { type: ['string', 'null'] },
  sourceCheckpointId: { type: ['string', 'null'] },
  digest: { type: ['string', 'null'] },
  memoryMb: { type: ['number', 'null'] },
  createdAt: { type: 'string', format: 'date-time' },
});
