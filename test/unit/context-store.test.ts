import { statSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import test, { type ExecutionContext } from 'ava';
import Database from 'better-sqlite3';
import { ensureTables } from '../../src/catalog/migrations.js';
import { ContextStore, MAX_DEPTH } from '../../src/context/context-store.js';
import {
  type AgentContext,
  INTERRUPTED_TOOL_RESULT,
  appendRecoveryNote,
  contextHeader,
  contextItems,
  rebuild,
  validateContext,
} from '../../src/context/formats.js';
import { openTestDb } from '../helpers/sqlite.js';

function openDb(t: ExecutionContext): Database.Database {
  return openTestDb(t, 'context');
}

// Deterministic text, so the measured numbers are reproducible.
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
const WORDS =
  'the build failed because module resolution could not find a package so we check the lockfile then rerun tests and inspect logs for regressions in parser handler config cache network timeout retry'.split(
    ' ',
  );
function text(rand: () => number, bytes: number): string {
  let s = '';
  while (s.length < bytes) s += `${WORDS[Math.floor(rand() * WORDS.length)]}${rand() < 0.08 ? '.\n' : ' '}`;
  return s;
}

/** A 200-turn openai-chat conversation: user, assistant tool call, tool output, assistant reply. */
function conversation(turns: number): { messages: AgentContext & { format: 'openai-chat' }; ends: number[] } {
  const rand = prng(42);
  const messages: (AgentContext & { format: 'openai-chat' })['messages'] = [
    { role: 'system', content: text(rand, 1200) },
  ];
  const ends: number[] = [];
  for (let i = 0; i < turns; i++) {
    messages.push({ role: 'user', content: text(rand, 1000 + Math.floor(rand() * 1000)) });
    messages.push({
      role: 'assistant',
      content: null,
      tool_calls: [
        {
          id: `call_${i}`,
          type: 'function',
          function: {
            name: 'run_command',
            arguments: JSON.stringify({ cmd: `npm test -- --grep case${i}`, why: text(rand, 900) }),
          },
        },
      ],
    });
    messages.push({ role: 'tool', tool_call_id: `call_${i}`, content: text(rand, 1000 + Math.floor(rand() * 1000)) });
    messages.push({ role: 'assistant', content: text(rand, 1000 + Math.floor(rand() * 800)) });
    ends.push(messages.length);
  }
  return { messages: { format: 'openai-chat', messages }, ends };
}

test('a 200-turn conversation checkpointed after every turn stores each message once', (t) => {
  const db = openDb(t);
  const store = new ContextStore(db);
  const { messages: full, ends } = conversation(200);
  const ids: string[] = [];
  let naive = 0;
  for (const end of ends) {
    const r = store.put({ format: 'openai-chat', messages: full.messages.slice(0, end) });
    naive += r.logicalBytes;
    ids.push(r.contextId);
  }
  const stats = store.stats();
  const messageBytes = full.messages.reduce((n, m) => n + JSON.stringify(m).length, 0);
  t.log(
    `turns=200 snapshots=${stats.snapshots} messages=${full.messages.length} (~${Math.round(messageBytes / full.messages.length)} B each as JSON)`,
  );
  t.log(`naive bytes (every snapshot stored whole) = ${naive}`);
  t.log(`stored bytes (items + hash lists)         = ${stats.storedBytes}`);
  t.log(`ratio = ${((100 * stats.storedBytes) / naive).toFixed(2)}%  items stored=${stats.items}`);
  db.pragma('wal_checkpoint(TRUNCATE)');
  t.log(`SQLite file incl. indexes and page slack = ${statSync(db.name).size} B`);

  t.is(stats.snapshots, 200);
  t.is(stats.logicalBytes, naive);
  t.true(stats.storedBytes < 0.05 * naive, `stored ${stats.storedBytes} is not < 5% of ${naive}`);
  // Each distinct message once, plus the one shared header.
  t.is(stats.items, full.messages.length + 1);

  let mismatches = 0;
  ids.forEach((id, i) => {
    if (!isDeepStrictEqual(store.get(id), { format: 'openai-chat', messages: full.messages.slice(0, ends[i]) }))
      mismatches++;
  });
  t.is(mismatches, 0);
  t.deepEqual(store.get(ids.at(-1)!), full);
});

test('base chains are bounded: past MAX_DEPTH a snapshot stores its whole hash list', (t) => {
  const db = openDb(t);
  const store = new ContextStore(db);
  const { messages: full } = conversation(MAX_DEPTH + 10);
  for (let n = 1; n <= full.messages.length; n += 4)
    store.put({ format: 'openai-chat', messages: full.messages.slice(0, n) });
  const depth = db
    .prepare('SELECT max(depth) AS max, sum(base_id IS NULL) AS keyframes FROM agent_context_snapshots')
    .get() as { max: number; keyframes: number };
  t.is(depth.max, MAX_DEPTH);
  t.is(depth.keyframes, 2);
});

test('diverging timelines share their common prefix', (t) => {
  const store = new ContextStore(openDb(t));
  const { messages: full } = conversation(20);
  const base = full.messages.slice(0, 41);
  const a = store.put({ format: 'openai-chat', messages: base });
  const left = store.put({ format: 'openai-chat', messages: [...base, { role: 'user', content: 'try plan A' }] });
  const right = store.put({ format: 'openai-chat', messages: [...base, { role: 'user', content: 'try plan B' }] });
  t.true(left.storedBytes < 100 && right.storedBytes < 100, `${left.storedBytes} ${right.storedBytes}`);
  t.is((store.get(right.contextId) as { messages: unknown[] }).messages.length, 42);
  t.deepEqual(store.get(a.contextId), { format: 'openai-chat', messages: base });
  // Putting the same context again adds nothing but its row.
  t.is(store.put({ format: 'openai-chat', messages: base }).storedBytes, 0);
});

const everyFormat: [string, AgentContext][] = [
  [
    'openai-chat',
    {
      format: 'openai-chat',
      messages: [
        { role: 'developer', content: 'be brief' },
        { role: 'user', content: [{ type: 'text', text: 'hi' }] },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'c1', type: 'function', function: { name: 'ls', arguments: '{}' } }],
        },
        { role: 'tool', tool_call_id: 'c1', content: 'a b' },
      ],
    },
  ],
  [
    'openai-responses',
    {
      format: 'openai-responses',
      items: [
        { role: 'user', content: 'hi' },
        { type: 'function_call', call_id: 'c1', name: 'ls', arguments: '{}' },
        { type: 'function_call_output', call_id: 'c1', output: 'a b' },
        { type: 'reasoning', id: 'rs_1', summary: [] },
      ],
    },
  ],
  [
    'anthropic',
    {
      format: 'anthropic',
      system: [{ type: 'text', text: 'be brief', cache_control: { type: 'ephemeral' } }],
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'tu1', name: 'ls', input: { dir: '.' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'a b' }] },
      ],
    },
  ],
  [
    'ai-sdk',
    {
      format: 'ai-sdk',
      messages: [
        { role: 'system', content: 'be brief' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'look' },
            { type: 'image', image: new Uint8Array([137, 80, 78, 71]), mediaType: 'image/png' },
          ],
        },
        { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'c1', toolName: 'ls', input: { dir: '.' } }] },
        {
          role: 'tool',
          content: [
            { type: 'tool-result', toolCallId: 'c1', toolName: 'ls', output: { type: 'json', value: ['a', 'b'] } },
          ],
        },
      ],
    },
  ],
  [
    'langgraph (messages)',
    {
      format: 'langgraph',
      checkpoint: {
        v: 4,
        id: 'cp1',
        ts: '2025-01-01T00:00:00Z',
        channel_values: { messages: [{ type: 'human', content: 'hi' }], step: 3 },
        channel_versions: { messages: 2 },
        versions_seen: {},
      },
      metadata: { source: 'loop', step: 3 },
      pendingWrites: [['task1', 'messages', { type: 'ai', content: 'hello' }]],
      config: { configurable: { thread_id: 't1' } },
    },
  ],
  [
    'langgraph (no messages)',
    { format: 'langgraph', checkpoint: { v: 4, id: 'cp2', channel_values: { plan: ['a', 'b'] } } },
  ],
  ['bytes', { format: 'bytes', mediaType: 'application/x-agent-state', data: new Uint8Array([0, 1, 2, 255, 254]) }],
];

for (const [name, ctx] of everyFormat) {
  test(`round-trips ${name} through items, header and the store`, (t) => {
    t.deepEqual(rebuild(contextHeader(ctx), contextItems(ctx)), ctx);
    const store = new ContextStore(openDb(t));
    const { contextId } = store.put(ctx);
    t.regex(contextId, /^ctx_[0-9a-f]{20}$/);
    const back = store.get(contextId);
    t.deepEqual(back, ctx);
    t.true(isDeepStrictEqual(back, ctx));
  });
}

test('Uint8Array comes back as a Uint8Array with the same bytes', (t) => {
  const store = new ContextStore(openDb(t));
  const data = new Uint8Array(4096).map((_, i) => (i * 7) & 0xff);
  const back = store.get(store.put({ format: 'bytes', mediaType: 'application/octet-stream', data }).contextId);
  t.true(back.format === 'bytes' && back.data instanceof Uint8Array && Buffer.compare(back.data, data) === 0);
});

test('delete collects items no longer referenced, but keeps what a later snapshot builds on', (t) => {
  const store = new ContextStore(openDb(t));
  const m = (i: number) => ({ role: 'user' as const, content: `message ${i} ${'x'.repeat(100)}` });
  const a = store.put({ format: 'openai-chat', messages: [m(1), m(2), m(3)] });
  const b = store.put({ format: 'openai-chat', messages: [m(1), m(2), m(3), m(4), m(5)] });
  t.is(store.stats().items, 6);

  t.true(store.delete(a.contextId));
  t.false(store.has(a.contextId));
  t.throws(() => store.get(a.contextId), { code: 'CONTEXT_NOT_FOUND' });
  t.like(store.stats(), { snapshots: 1, retainedDeleted: 1, items: 6 });
  t.deepEqual(store.get(b.contextId), { format: 'openai-chat', messages: [m(1), m(2), m(3), m(4), m(5)] });

  t.true(store.delete(b.contextId));
  t.false(store.delete(b.contextId), 'deleting twice is not an error');
  t.deepEqual(store.stats(), { snapshots: 0, retainedDeleted: 0, items: 0, logicalBytes: 0, storedBytes: 0 });
});

test('writes join the caller transaction: a checkpoint that fails leaves no trace', (t) => {
  const db = openDb(t);
  const store = new ContextStore(db);
  const before = store.stats();
  t.throws(
    () =>
      db.transaction(() => {
        store.put({ format: 'openai-chat', messages: [{ role: 'user', content: 'hi' }] });
        throw new Error('the core failed to write its checkpoint record');
      })(),
    { message: /core failed/ },
  );
  t.deepEqual(store.stats(), before);
});

test('ensureTables(agent-state) is idempotent and creates every table', (t) => {
  const db = openDb(t);
  ensureTables(db, 'agent-state');
  ensureTables(db, 'agent-state');
  db.transaction(() => ensureTables(db, 'agent-state'))();
  const tables = db
    .prepare(`SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'agent_%' ORDER BY name`)
    .pluck()
    .all();
  t.deepEqual(tables, [
    'agent_context_items',
    'agent_context_snapshots',
    'agent_effect_views',
    'agent_effects',
    'agent_observations',
    'agent_verdicts',
  ]);
});

test('get of an unknown id is CONTEXT_NOT_FOUND', (t) => {
  const store = new ContextStore(openDb(t));
  t.throws(() => store.get('ctx_nope'), { code: 'CONTEXT_NOT_FOUND' });
});

// --- validation ------------------------------------------------------------------------------

const badContext = test.macro({
  exec(t, input: unknown, field: string) {
    const err = t.throws(() => validateContext(input), { code: 'INVALID_ARGUMENT' });
    t.is((err as unknown as { field: string }).field, field);
  },
  title: (_title, input, field) =>
    `validateContext rejects ${(input as { format?: string })?.format ?? 'a non-object'} with bad ${field}`,
});

const ok = { role: 'user', content: 'hi' };
test(badContext, 'nope', 'context');
test(badContext, { format: 'gemini', messages: [] }, 'context.format');
test(
  badContext,
  { format: 'openai-chat', messages: [ok, ok, ok, { role: 'wizard', content: 'x' }] },
  'context.messages[3].role',
);
test(
  badContext,
  { format: 'openai-chat', messages: [{ role: 'tool', content: 'x' }] },
  'context.messages[0].tool_call_id',
);
test(badContext, { format: 'openai-chat', messages: [{ role: 'user', content: null }] }, 'context.messages[0].content');
test(
  badContext,
  {
    format: 'openai-chat',
    messages: [
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: {} } }],
      },
    ],
  },
  'context.messages[0].tool_calls[0].function.arguments',
);
test(
  badContext,
  { format: 'openai-chat', messages: [{ role: 'user', content: 'x', meta: new Map() }] },
  'context.messages[0].meta',
);
test(
  badContext,
  { format: 'openai-chat', messages: [{ role: 'user', content: 'x', callback: () => 1 }] },
  'context.messages[0].callback',
);
test(
  badContext,
  { format: 'openai-responses', items: [ok, { type: 'function_call', name: 'f', arguments: '{}' }] },
  'context.items[1].call_id',
);
test(badContext, { format: 'anthropic', messages: [{ role: 'system', content: 'x' }] }, 'context.messages[0].role');
test(
  badContext,
  { format: 'anthropic', messages: [{ role: 'assistant', content: [{ type: 'tool_use', name: 'f', input: {} }] }] },
  'context.messages[0].content[0].id',
);
test(badContext, { format: 'anthropic', system: 5, messages: [] }, 'context.system');
test(
  badContext,
  { format: 'ai-sdk', messages: [{ role: 'system', content: [{ type: 'text', text: 'x' }] }] },
  'context.messages[0].content',
);
test(
  badContext,
  {
    format: 'ai-sdk',
    messages: [
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'c', output: { type: 'text', value: 'x' } }] },
    ],
  },
  'context.messages[0].content[0].toolName',
);
test(
  badContext,
  { format: 'langgraph', checkpoint: { channel_values: { messages: 'x' } } },
  'context.checkpoint.channel_values.messages',
);
test(badContext, { format: 'langgraph', checkpoint: {}, pendingWrites: [['t', 'c']] }, 'context.pendingWrites[0]');
test(badContext, { format: 'bytes', mediaType: 'text/plain', data: 'abc' }, 'context.data');

// --- recovery notes --------------------------------------------------------------------------

const NOTE = 'Rolled back to ckpt_1.';

test('openai-chat: the note is a user message, after a result for every unanswered tool call', (t) => {
  const ctx: AgentContext = {
    format: 'openai-chat',
    messages: [
      { role: 'user', content: 'fix it' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'c1', type: 'function', function: { name: 'sh', arguments: '{}' } },
          { id: 'c2', type: 'function', function: { name: 'sh', arguments: '{}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'ok' },
    ],
  };
  const out = appendRecoveryNote(ctx, NOTE);
  t.deepEqual((out as typeof ctx).messages.slice(3), [
    { role: 'tool', tool_call_id: 'c2', content: INTERRUPTED_TOOL_RESULT },
    { role: 'user', content: NOTE },
  ]);
  t.is(ctx.messages.length, 3, 'input not modified');
  validateContext(out);
});

test('openai-chat: a trailing user message absorbs the note', (t) => {
  const out = appendRecoveryNote({ format: 'openai-chat', messages: [{ role: 'user', content: 'fix it' }] }, NOTE);
  t.deepEqual(out, { format: 'openai-chat', messages: [{ role: 'user', content: `fix it\n\n${NOTE}` }] });
});

test('anthropic: tool_use gets an error tool_result in the same user turn as the note', (t) => {
  const ctx: AgentContext = {
    format: 'anthropic',
    system: 'be careful',
    messages: [
      { role: 'user', content: 'fix it' },
      {
        role: 'assistant',
        content: [
          { type: 'text', text: 'running' },
          { type: 'tool_use', id: 'tu1', name: 'sh', input: {} },
        ],
      },
    ],
  };
  const out = appendRecoveryNote(ctx, NOTE) as typeof ctx;
  t.deepEqual(out.messages.at(-1), {
    role: 'user',
    content: [
      { type: 'tool_result', tool_use_id: 'tu1', is_error: true, content: INTERRUPTED_TOOL_RESULT },
      { type: 'text', text: NOTE },
    ],
  });
  t.is(out.system, 'be careful');
});

test('anthropic: a trailing user message is merged into, keeping roles alternating', (t) => {
  const out = appendRecoveryNote(
    {
      format: 'anthropic',
      messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'ok' }] }],
    },
    NOTE,
  );
  t.deepEqual(out, {
    format: 'anthropic',
    messages: [
      {
        role: 'user',
        content: [
          { type: 'tool_result', tool_use_id: 'tu1', content: 'ok' },
          { type: 'text', text: NOTE },
        ],
      },
    ],
  });
});

test('ai-sdk: an open tool-call gets an error-text tool-result, then a user note', (t) => {
  const ctx: AgentContext = {
    format: 'ai-sdk',
    messages: [
      { role: 'user', content: 'go' },
      { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'c1', toolName: 'sh', input: {} }] },
    ],
  };
  const out = appendRecoveryNote(ctx, NOTE) as typeof ctx;
  t.deepEqual(out.messages.slice(2), [
    {
      role: 'tool',
      content: [
        {
          type: 'tool-result',
          toolCallId: 'c1',
          toolName: 'sh',
          output: { type: 'error-text', value: INTERRUPTED_TOOL_RESULT },
        },
      ],
    },
    { role: 'user', content: [{ type: 'text', text: NOTE }] },
  ]);
  validateContext(out);
});

test('openai-responses: a developer message, after outputs for open function calls', (t) => {
  const out = appendRecoveryNote(
    {
      format: 'openai-responses',
      items: [
        { role: 'user', content: 'go' },
        { type: 'function_call', call_id: 'c1', name: 'sh', arguments: '{}' },
      ],
    },
    NOTE,
  ) as { items: unknown[] };
  t.deepEqual(out.items.slice(2), [
    { type: 'function_call_output', call_id: 'c1', output: INTERRUPTED_TOOL_RESULT },
    { type: 'message', role: 'developer', content: NOTE },
  ]);
});

test('langgraph: appended to channel_values.messages in the shape already used', (t) => {
  const lc = { lc: 1, type: 'constructor', id: ['langchain_core', 'messages', 'AIMessage'], kwargs: { content: 'hi' } };
  const out = appendRecoveryNote(
    { format: 'langgraph', checkpoint: { id: 'cp', channel_values: { messages: [lc], step: 1 } } },
    NOTE,
  );
  t.deepEqual(out, {
    format: 'langgraph',
    checkpoint: {
      id: 'cp',
      channel_values: {
        step: 1,
        messages: [
          lc,
          {
            lc: 1,
            type: 'constructor',
            id: ['langchain_core', 'messages', 'HumanMessage'],
            kwargs: { content: NOTE, additional_kwargs: {}, response_metadata: {} },
          },
        ],
      },
    },
  });
  const dicts = appendRecoveryNote(
    { format: 'langgraph', checkpoint: { channel_values: { messages: [{ role: 'assistant', content: 'x' }] } } },
    NOTE,
  );
  t.deepEqual(contextItems(dicts).at(-1), { role: 'user', content: NOTE });
});

test('a note cannot go into opaque bytes or a langgraph checkpoint without messages', (t) => {
  t.throws(() => appendRecoveryNote({ format: 'bytes', mediaType: 'x/y', data: new Uint8Array(1) }, NOTE), {
    code: 'CONTEXT_FORMAT_UNSUPPORTED',
  });
  t.throws(() => appendRecoveryNote({ format: 'langgraph', checkpoint: { channel_values: {} } }, NOTE), {
    code: 'CONTEXT_FORMAT_UNSUPPORTED',
  });
});
