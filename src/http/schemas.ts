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
//
// What the handlers answer, field by field (test/integration/http-responses.test.ts
// validates real answers against these, as /openapi.json carries them).
// Objects are closed (additionalProperties: false) unless they are open by
// nature (labels, a context, a JSON value the caller chose); `required` names
// the fields always present; `nullable` (OpenAPI 3.0.3) those that can be null.

/** A closed object: these properties, those in `required` always present. */
const shape = (
  description: string,
  properties: Record<string, Schema>,
  required: string[] | 'all' = 'all',
): Schema => ({
  type: 'object',
  description,
  properties,
  required: required === 'all' ? Object.keys(properties) : required,
  additionalProperties: false,
});
const t = (type: string, description?: string): Schema => ({ type, ...(description ? { description } : {}) });
/** Null too (OpenAPI 3.0.3: `nullable`, and an enum lists null as well). */
const nullable = (schema: Schema): Schema => ({
  ...schema,
  nullable: true,
  ...(Array.isArray(schema.enum) ? { enum: [...(schema.enum as unknown[]), null] } : {}),
});
const S_ = t('string');
const I_ = t('integer');
const N_ = t('number');
const B_ = t('boolean');
const strings: Schema = { type: 'array', items: S_ };
const dateTime = (description?: string): Schema => ({
  type: 'string',
  format: 'date-time',
  ...(description ? { description } : {}),
});
const epochMs = (description: string): Schema => ({ type: 'number', description });
const stringMap = (description: string): Schema => ({
  type: 'object',
  additionalProperties: { type: 'string' },
  description,
});
/** A JSON value the caller chose (an effect's input or output): anything, null included. */
const json = (description: string): Schema => ({ description });
const contextOut: Schema = {
  description: 'A stored agent context ({format, ...}; "bytes" data as base64), or null if none',
  type: 'object',
  additionalProperties: true,
  nullable: true,
};
const pidOf = I_;
const effectStatus: Schema = { type: 'string', enum: ['pending', 'committed', 'failed', 'unknown', 'compensated'] };

export const networkInfo = shape('Network mode, addresses and allow list', {
  mode: { type: 'string', enum: ['none', 'egress'] },
  address: nullable(t('string', "The sandbox's own address, or null for none")),
  gateway: nullable(t('string', 'Its gateway and resolver, or null for none')),
  allowOut: strings,
  bandwidthMbit: nullable(I_),
});

export const sandboxInfo = shape('A sandbox', {
  id: S_,
  image: S_,
  state: { type: 'string', enum: ['creating', 'running', 'stopped', 'removing'] },
  memoryMb: nullable(N_),
  pids: nullable(I_),
  cpuWeight: nullable(I_),
  cpus: nullable(N_),
  ioWeight: nullable(I_),
  diskMb: nullable(N_),
  lineageId: t('string', 'The lineage it shares with its forks and their checkpoints'),
  branchId: t('string', 'Its current timeline (a rollback starts a new one)'),
  headCheckpointId: nullable(S_),
  forkedFrom: nullable(S_),
  tenant: nullable(t('string', "The owning tenant's name")),
  tenantId: nullable(t('string', "The owning tenant's immutable id (tn_…)")),
  metadata: stringMap('Free-form string labels'),
  createdAt: dateTime(),
  expiresAt: nullable(dateTime()),
  network: networkInfo,
});

export const runResult: Schema = {
  description: 'The finished command, or {pid} for background',
  oneOf: [
    shape(
      'The finished command',
      {
        exitCode: I_,
        stdout: S_,
        stderr: S_,
        signal: t('string', 'Signal that ended it, if any'),
        truncated: B_,
        durationMs: N_,
        observationId: S_,
      },
      ['exitCode', 'stdout', 'stderr', 'truncated', 'durationMs'],
    ),
    shape('A background command started', { pid: pidOf }),
  ],
};
export const pidOnly = shape('{pid}', { pid: pidOf });
export const pidBytes = shape('{pid, bytes}: bytes written', { pid: pidOf, bytes: I_ });
export const pidKilled = shape('{pid, killed}', { pid: pidOf, killed: B_ });
export const processState = shape('{pid, running, exitCode}', {
  pid: pidOf,
  running: B_,
  exitCode: nullable(I_),
});
export const commandExit = shape('{pid, exitCode} (null if killed before reporting one)', {
  pid: pidOf,
  exitCode: nullable(I_),
});
export const commandOutput = shape('Output since the offsets asked for', {
  pid: pidOf,
  stdout: S_,
  stderr: S_,
  offsets: shape('Where to continue from', { stdout: I_, stderr: I_ }),
  rewound: t('boolean', 'The files were shorter than the offsets (a rollback rewound them): this starts at 0'),
  running: B_,
});
export const ptyOutput = shape('Transcript since the offset asked for', {
  pid: pidOf,
  data: t('string', 'base64'),
  offset: t('integer', 'Where to continue from'),
  rewound: B_,
  running: B_,
});
export const ptySize = shape('{pid, cols, rows}', { pid: pidOf, cols: I_, rows: I_ });
export const ptyExit = shape('How the PTY ended', {
  pid: pidOf,
  exitCode: nullable(I_),
  reason: { type: 'string', enum: ['exited', 'killed', 'rolled-back'] },
});

const numbers = (names: string[], description: string): Schema => ({
  type: 'object',
  description,
  properties: Object.fromEntries(names.map((n) => [n, N_])),
  additionalProperties: false,
});
export const checkpointInfo = shape('A checkpoint', {
  id: S_,
  parentId: nullable(S_),
  sandboxId: S_,
  layerId: S_,
  branchId: S_,
  label: nullable(S_),
  createdAt: dateTime(),
  contextId: nullable(S_),
  ledgerCursor: I_,
  sizes: shape(
    'Bytes it holds (layerBytes absent when the store has no quotas on)',
    { processImageBytes: I_, layerBytes: I_, contextBytes: I_ },
    ['processImageBytes'],
  ),
  timings: numbers(
    [
      'freezeMs',
      'snapshotMs',
      'dumpMs',
      'frozenMs',
      'deltaMs',
      'persistMs',
      'commitMs',
      'syncMs',
      'hashMs',
      'toDurableMs',
      'totalMs',
    ],
    'How long its steps took (ms)',
  ),
  durableAt: nullable(dateTime('When its files were made durable; null while that runs')),
});
export const checkpointContext = shape('{checkpointId, context}', { checkpointId: S_, context: contextOut });
export const snapshotContext = shape('{snapshotId, context}', { snapshotId: S_, context: contextOut });

export const observation = shape('An observation', {
  id: S_,
  seq: I_,
  sandboxId: S_,
  branchId: S_,
  lineageId: S_,
  epochCheckpointId: nullable(S_),
  kind: { type: 'string', enum: ['command', 'file-read', 'file-write', 'file-list', 'verdict'] },
  toolCallId: nullable(S_),
  subject: S_,
  contentHash: nullable(S_),
  exitCode: nullable(I_),
  summary: nullable(S_),
  sealedBy: nullable(S_),
  staleRollbackId: nullable(S_),
  staleAt: nullable(epochMs('When a rollback made it stale (ms since the epoch)')),
  inheritedFrom: nullable(S_),
  createdAt: epochMs('ms since the epoch'),
});
const verdictFields: Record<string, Schema> = {
  id: S_,
  seq: I_,
  sandboxId: S_,
  branchId: S_,
  path: S_,
  contentHash: t('string', 'sha256 of the file, or identity:… over 64 MiB'),
  verdict: S_,
  toolCallId: nullable(S_),
  observationId: nullable(S_),
  inheritedFrom: nullable(S_),
  sealedBy: nullable(S_),
  abandonedBy: nullable(S_),
  createdAt: epochMs('ms since the epoch'),
};
export const verdict = shape('A verdict', verdictFields);
const currentHash = nullable(t('string', "The file's hash now (null: it is gone)"));
export const listedVerdict = shape(
  'A verdict (with stale=true, also the hash the file has now)',
  { ...verdictFields, currentHash },
  Object.keys(verdictFields),
);
const staleVerdict = shape('A verdict whose file changed', { ...verdictFields, currentHash });

const recordedError = shape('An error as recorded', { name: S_, message: S_, code: S_ }, ['name', 'message']);
const compensation = shape('How to take a compensable effect back', { kind: S_, input: json('Its input') });
export const effectRecord = shape(
  'A ledger row',
  {
    id: S_,
    seq: I_,
    lineageId: S_,
    sandboxId: S_,
    branchId: S_,
    epochCheckpointId: nullable(S_),
    sealedBy: nullable(S_),
    abandonedBy: nullable(S_),
    kind: S_,
    input: json('The input it was begun with'),
    output: json('Its output (absent: not committed, or committed without one)'),
    reversibility,
    scope: { type: 'string', enum: ['lineage', 'branch'] },
    idempotencyKey: S_,
    toolCallId: nullable(S_),
    compensation: nullable(compensation),
    status: effectStatus,
    definite: nullable(t('boolean', 'For failed: true if it certainly did not happen')),
    error: nullable(recordedError),
    attempt: I_,
    compensatesId: nullable(S_),
    compensatedBy: nullable(S_),
    commitOrder: nullable(I_),
    createdAt: epochMs('ms since the epoch'),
    settledAt: nullable(epochMs('ms since the epoch')),
  },
  [
    'id',
    'seq',
    'lineageId',
    'sandboxId',
    'branchId',
    'epochCheckpointId',
    'sealedBy',
    'abandonedBy',
    'kind',
    'input',
    'reversibility',
    'scope',
    'idempotencyKey',
    'toolCallId',
    'compensation',
    'status',
    'definite',
    'error',
    'attempt',
    'compensatesId',
    'compensatedBy',
    'commitOrder',
    'createdAt',
    'settledAt',
  ],
);
export const beginResult = shape(
  'Run the effect now (replayed: false, with its attempt), or what it returned last time (replayed: true, with output)',
  {
    replayed: B_,
    effectId: S_,
    idempotencyKey: S_,
    attempt: t('integer', 'When replayed is false'),
    output: json('When replayed is true: what it returned last time'),
  },
  ['replayed', 'effectId', 'idempotencyKey'],
);

const effectSummary = shape(
  'An effect on the abandoned timeline',
  {
    effectId: S_,
    kind: S_,
    input: json('Its input'),
    output: json('Its output, if any'),
    status: effectStatus,
    reversibility,
    compensates: nullable(S_),
  },
  ['effectId', 'kind', 'input', 'status', 'reversibility', 'compensates'],
);
export const recoverySummary = shape('What the abandoned attempt did, as data and as a note for the model', {
  structured: shape('The machine-readable summary', {
    targetCheckpoint: shape('The checkpoint rolled back to', { id: S_, label: nullable(S_) }),
    failure: nullable(S_),
    commandsRun: {
      type: 'array',
      items: shape('A command run', {
        command: S_,
        exitCode: nullable(I_),
        summary: nullable(S_),
        toolCallId: nullable(S_),
      }),
    },
    filesTouched: {
      type: 'array',
      items: shape('A path touched', {
        path: S_,
        how: { type: 'array', items: { type: 'string', enum: ['read', 'write', 'list'] } },
      }),
    },
    effectsCommitted: { type: 'array', items: effectSummary },
    irreversibleEffects: { type: 'array', items: effectSummary },
    staleVerdicts: {
      type: 'array',
      items: shape('A verdict the rollback made stale', {
        path: S_,
        verdict: S_,
        contentHash: S_,
        currentHash: nullable(S_),
      }),
    },
    lessons: strings,
  }),
  text: S_,
});
export const rollbackReport = shape(
  'The rollback report: restored process, context at the checkpoint, ' +
    'stale observations, effects after, recovery summary',
  {
    sandboxId: S_,
    checkpointId: S_,
    branchId: t('string', 'The new timeline'),
    previousBranchId: S_,
    pid: t('integer', "The restored init's host pid"),
    path: { type: 'string', enum: ['standby', 'restore'] },
    connectionsReset: {
      type: 'array',
      items: shape('A TCP connection to the outside the rollback reset', { local: S_, remote: S_ }),
    },
    timings: numbers(['killMs', 'layerMs', 'mountMs', 'restoreMs', 'commitMs', 'totalMs'], 'ms'),
    context: contextOut,
    contextWithRecovery: { ...contextOut, description: 'The context with the recovery note (withRecoverySummary)' },
    staleObservations: { type: 'array', items: observation },
    effectsAfter: { type: 'array', items: effectRecord },
    staleVerdicts: { type: 'array', items: staleVerdict },
    warnings: {
      type: 'array',
      items: shape('An effect on the abandoned timeline the rollback does not undo', {
        effectId: S_,
        kind: S_,
        status: effectStatus,
        reversibility,
        reason: { type: 'string', enum: ['irreversible', 'outcome-unknown', 'not-compensated'] },
        message: S_,
      }),
    },
    recoverySummary,
  },
  [
    'sandboxId',
    'checkpointId',
    'branchId',
    'previousBranchId',
    'pid',
    'path',
    'connectionsReset',
    'timings',
    'context',
    'staleObservations',
    'effectsAfter',
    'staleVerdicts',
    'warnings',
  ],
);
export const forkResult = shape(
  'One result per sandbox asked for, in order (`results`); `ids` and `errors` list the same without the order',
  {
    results: {
      type: 'array',
      items: {
        oneOf: [
          shape('Started: its id and how long it took (ms)', { id: S_, ms: I_ }),
          shape('Failed: its error body (code, message, field?) with the status that error has alone', {
            error: shape('The error', { code: S_, message: S_, field: S_, status: I_ }, ['code', 'message', 'status']),
          }),
        ],
      },
    },
    ids: { type: 'array', items: S_, description: 'The ids of those started' },
    errors: {
      type: 'array',
      items: shape('An error', { code: S_, message: S_ }),
      description: 'The errors (code, message) of those that failed',
    },
  },
);
export const arrayOf = (items: Schema, description: string): Schema => ({ type: 'array', items, description });
/** `{<key>: <value>, <flag>: true}`: what a removal answers. */
export const done = (key: string, flag: string): Schema =>
  shape(`{${key}, ${flag}: true}`, { [key]: S_, [flag]: { type: 'boolean', enum: [true] } });
export const storedBundle = shape('A bundle in the snapshot store', {
  name: S_,
  digest: S_,
  bytes: I_,
  chunks: I_,
  chunkBytes: I_,
  createdAt: dateTime(),
});
export const snapshotInfo = shape('A snapshot', {
  id: S_,
  name: nullable(S_),
  tenant: nullable(S_),
  metadata: stringMap('Free-form labels'),
  sizeBytes: I_,
  image: S_,
  lineageId: S_,
  sourceSandboxId: nullable(S_),
  sourceCheckpointId: nullable(S_),
  digest: nullable(S_),
  memoryMb: nullable(N_),
  createdAt: dateTime(),
});
export const pushReport = shape('What a push stored', {
  key: S_,
  snapshotId: S_,
  digest: t('string', '`sha256:<hex>` of the bundle'),
  bytes: I_,
  chunks: I_,
  uploadedChunks: I_,
  skippedChunks: I_,
  ms: N_,
});
export const storePullReport = shape('What a pull from the store made', {
  key: S_,
  snapshot: snapshotInfo,
  bytes: I_,
  ms: N_,
});
export const pullReport = shape('What a pull from another server did', {
  snapshot: snapshotInfo,
  bundleBytes: I_,
  receivedBytes: I_,
  resumed: t('integer', 'Attempts that resumed a partial download'),
  restarted: B_,
  downloadMs: N_,
  importMs: N_,
});
export const tenantInfo = shape('The tenant, its quotas (null: no limit) and usage', {
  id: S_,
  name: S_,
  createdAt: dateTime(),
  maxSandboxes: nullable(I_),
  maxMemoryMb: nullable(N_),
  cpuWeight: nullable(I_),
  maxCpuWeight: nullable(I_),
  maxCheckpointMb: nullable(N_),
  maxDiskMb: nullable(N_),
  network: nullable({ type: 'string', enum: ['none', 'egress'] }),
  maxNetwork: nullable({ type: 'string', enum: ['none', 'egress'] }),
  usage: shape('What it holds now (MiB, rounded up)', {
    sandboxes: I_,
    memoryMb: N_,
    standbyMemoryMb: N_,
    cpuWeight: I_,
    checkpointMb: N_,
    snapshotMb: N_,
    importingMb: N_,
    diskMb: N_,
  }),
});
export const imageInfo = shape('An image (ready: false: a shipped recipe not built yet)', {
  name: S_,
  ready: B_,
  source: S_,
  sizeBytes: nullable(I_),
  createdAt: nullable(dateTime()),
});
const exposureFields: Record<string, Schema> = {
  id: t('string', 'exp_…'),
  sandboxId: S_,
  port: I_,
  path: t('string', 'The proxy path: /ports/<id>/'),
  url: S_,
  createdAt: dateTime(),
};
export const exposure = shape('An exposed port', exposureFields);
export const exposed = shape('An exposed port and, this once, its token', {
  ...exposureFields,
  token: t('string', 'Send as X-Lockstep-Token'),
});
export const portClosed = shape('{port, closed}', { port: I_, closed: B_ });
const observationId = t('string', 'The observation it was recorded as');
export const fileRead = shape(
  'The file',
  {
    path: S_,
    content: S_,
    encoding: { type: 'string', enum: ['utf8', 'base64'] },
    sha256: S_,
    bytes: I_,
    observationId,
  },
  ['path', 'content', 'encoding', 'sha256', 'bytes'],
);
export const fileWritten = shape('What was written', { path: S_, sha256: S_, bytes: I_, observationId }, [
  'path',
  'sha256',
  'bytes',
]);
export const dirPage = shape(
  'One page of a directory, sorted by name',
  {
    path: S_,
    entries: {
      type: 'array',
      items: shape('An entry', {
        name: S_,
        path: S_,
        type: { type: 'string', enum: ['file', 'directory', 'symlink', 'other'] },
        size: I_,
        mode: I_,
        mtimeMs: N_,
      }),
    },
    nextCursor: nullable(t('string', 'Pass as cursor for the next page; null on the last')),
    observationId,
  },
  ['path', 'entries', 'nextCursor'],
);
export const fileExists = shape('{path, exists}', { path: S_, exists: B_ });
