/**
 * The agent-context formats Lockstep can snapshot, as minimal structural types (no vendor SDK
 * dependency). Each format exposes an appendable item list so snapshots can share items, and a
 * way to add a recovery note in the format's own vocabulary.
 */
import { InvalidArgumentError, LockstepError } from '../errors.js';

/** Any object; vendor fields we do not model are kept as they are. */
export type Obj = { [key: string]: unknown };

/** A content block or part (text, image, tool_use, tool-call, ...), discriminated by `type`. */
export interface ContentPart extends Obj {
  type: string;
}

/** OpenAI Chat Completions `ChatCompletionMessageParam`, structurally. */
export interface OpenAIChatMessage extends Obj {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool' | 'function';
  content?: string | ContentPart[] | null;
  tool_calls?: { id: string; type: string; function?: { name: string; arguments: string } }[];
  tool_call_id?: string;
  name?: string;
}

/** OpenAI Responses API `ResponseInputItem`: a message (typed or "easy") or a typed item. */
export interface OpenAIResponsesItem extends Obj {
  type?: string;
  role?: 'user' | 'assistant' | 'system' | 'developer';
  content?: string | ContentPart[];
  call_id?: string;
}

/** Anthropic Messages API content block (text, image, tool_use, tool_result, thinking, ...). */
export type AnthropicBlock = ContentPart;

/** Anthropic Messages API message. */
export interface AnthropicMessage extends Obj {
  role: 'user' | 'assistant';
  content: string | AnthropicBlock[];
}

/** Vercel AI SDK v5 `ModelMessage`, structurally. */
export interface AiSdkMessage extends Obj {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | ContentPart[];
}

/** A LangGraph pending write: [task id, channel, value]. */
export type LangGraphPendingWrite = [string, string, unknown];

/** The agent's context at a checkpoint, in the shape its framework uses. */
export type AgentContext =
  | { format: 'openai-chat'; messages: OpenAIChatMessage[] }
  | { format: 'openai-responses'; items: OpenAIResponsesItem[] }
  | { format: 'anthropic'; system?: string | AnthropicBlock[]; messages: AnthropicMessage[] }
  | { format: 'ai-sdk'; messages: AiSdkMessage[] }
  | { format: 'langgraph'; checkpoint: Obj; metadata?: Obj; pendingWrites?: LangGraphPendingWrite[]; config?: Obj }
  | { format: 'bytes'; mediaType: string; data: Uint8Array };

/** The format tag of an AgentContext. */
export type ContextFormat = AgentContext['format'];

/** Every supported format tag. */
export const CONTEXT_FORMATS: readonly ContextFormat[] = [
  'openai-chat',
  'openai-responses',
  'anthropic',
  'ai-sdk',
  'langgraph',
  'bytes',
];

/** The context's format cannot do what was asked (e.g. a recovery note in opaque bytes). */
export class ContextFormatUnsupportedError extends LockstepError {
  constructor(format: string, operation: string, reason: string) {
    super(
      'CONTEXT_FORMAT_UNSUPPORTED',
      `Cannot ${operation} a context in format ${JSON.stringify(format)}: ${reason}`,
      {
        details: { format, operation },
      },
    );
  }
}

// ---------------------------------------------------------------------------------------------
// Validation

const CHAT_ROLES = ['system', 'developer', 'user', 'assistant', 'tool', 'function'];
const RESPONSES_ROLES = ['user', 'assistant', 'system', 'developer'];
const AI_SDK_ROLES = ['system', 'user', 'assistant', 'tool'];

/** Checks that `x` is an AgentContext the store can round-trip; throws InvalidArgumentError naming the field. */
export function validateContext(x: unknown, field = 'context'): AgentContext {
  const ctx = obj(x, field);
  switch (ctx.format) {
    case 'openai-chat':
      arr(ctx.messages, `${field}.messages`).forEach((m, i) => chatMessage(m, `${field}.messages[${i}]`));
      break;
    case 'openai-responses':
      arr(ctx.items, `${field}.items`).forEach((m, i) => responsesItem(m, `${field}.items[${i}]`));
      break;
    case 'anthropic':
      if (ctx.system !== undefined) stringOrParts(ctx.system, `${field}.system`);
      arr(ctx.messages, `${field}.messages`).forEach((m, i) => anthropicMessage(m, `${field}.messages[${i}]`));
      break;
    case 'ai-sdk':
      arr(ctx.messages, `${field}.messages`).forEach((m, i) => aiSdkMessage(m, `${field}.messages[${i}]`));
      break;
    case 'langgraph': {
      const cp = obj(ctx.checkpoint, `${field}.checkpoint`);
      if (cp.channel_values !== undefined) {
        const cv = obj(cp.channel_values, `${field}.checkpoint.channel_values`);
        if (cv.messages !== undefined) arr(cv.messages, `${field}.checkpoint.channel_values.messages`);
      }
      if (ctx.metadata !== undefined) obj(ctx.metadata, `${field}.metadata`);
      if (ctx.config !== undefined) obj(ctx.config, `${field}.config`);
      if (ctx.pendingWrites !== undefined) {
        arr(ctx.pendingWrites, `${field}.pendingWrites`).forEach((w, i) => {
          const f = `${field}.pendingWrites[${i}]`;
          const t = arr(w, f);
          if (t.length !== 3) throw new InvalidArgumentError(f, 'a [taskId, channel, value] triple', w);
          str(t[0], `${f}[0]`);
          str(t[1], `${f}[1]`);
        });
      }
      break;
    }
    case 'bytes':
      if (typeof ctx.mediaType !== 'string' || ctx.mediaType === '') {
        throw new InvalidArgumentError(`${field}.mediaType`, 'a non-empty media type string', ctx.mediaType);
      }
      if (!(ctx.data instanceof Uint8Array)) throw new InvalidArgumentError(`${field}.data`, 'a Uint8Array', ctx.data);
      break;
    default:
      throw new InvalidArgumentError(
        `${field}.format`,
        `one of ${CONTEXT_FORMATS.map((f) => `'${f}'`).join(', ')}`,
        ctx.format,
      );
  }
  storable(ctx, field, new Set());
  return ctx as AgentContext;
}

function chatMessage(x: unknown, f: string): void {
  const m = obj(x, f);
  oneOf(m.role, CHAT_ROLES, `${f}.role`);
  const contentOptional = m.role === 'assistant' || m.role === 'function';
  if (!(contentOptional && (m.content === null || m.content === undefined))) stringOrParts(m.content, `${f}.content`);
  if (m.role === 'tool') str(m.tool_call_id, `${f}.tool_call_id`);
  if (m.role === 'assistant' && m.tool_calls !== undefined) {
    arr(m.tool_calls, `${f}.tool_calls`).forEach((c, i) => {
      const cf = `${f}.tool_calls[${i}]`;
      const call = obj(c, cf);
      str(call.id, `${cf}.id`);
      str(call.type, `${cf}.type`);
      if (call.type === 'function') {
        const fn = obj(call.function, `${cf}.function`);
        str(fn.name, `${cf}.function.name`);
        if (typeof fn.arguments !== 'string')
          throw new InvalidArgumentError(`${cf}.function.arguments`, 'a JSON string', fn.arguments);
      }
    });
  }
}

function responsesItem(x: unknown, f: string): void {
  const it = obj(x, f);
  if (it.type === undefined || it.type === 'message') {
    oneOf(it.role, RESPONSES_ROLES, `${f}.role`);
    stringOrParts(it.content, `${f}.content`);
    return;
  }
  str(it.type, `${f}.type`);
  if (it.type === 'function_call') {
    str(it.call_id, `${f}.call_id`);
    str(it.name, `${f}.name`);
    if (typeof it.arguments !== 'string')
      throw new InvalidArgumentError(`${f}.arguments`, 'a JSON string', it.arguments);
  } else if (it.type === 'function_call_output') {
    str(it.call_id, `${f}.call_id`);
    stringOrParts(it.output, `${f}.output`);
  }
}

function anthropicMessage(x: unknown, f: string): void {
  const m = obj(x, f);
  oneOf(m.role, ['user', 'assistant'], `${f}.role`);
  if (typeof m.content === 'string') return;
  arr(m.content, `${f}.content`).forEach((b, i) => {
    const bf = `${f}.content[${i}]`;
    const block = part(b, bf);
    if (block.type === 'text') {
      if (typeof block.text !== 'string') throw new InvalidArgumentError(`${bf}.text`, 'a string', block.text);
    } else if (block.type === 'tool_use') {
      str(block.id, `${bf}.id`);
      str(block.name, `${bf}.name`);
      obj(block.input, `${bf}.input`);
    } else if (block.type === 'tool_result') {
      str(block.tool_use_id, `${bf}.tool_use_id`);
      if (block.content !== undefined) stringOrParts(block.content, `${bf}.content`);
    }
  });
}

function aiSdkMessage(x: unknown, f: string): void {
  const m = obj(x, f);
  oneOf(m.role, AI_SDK_ROLES, `${f}.role`);
  if (m.role === 'system') {
    if (typeof m.content !== 'string')
      throw new InvalidArgumentError(`${f}.content`, 'a string (system messages are text only)', m.content);
    return;
  }
  if (m.role !== 'tool' && typeof m.content === 'string') return;
  arr(m.content, `${f}.content`).forEach((p, i) => {
    const pf = `${f}.content[${i}]`;
    const pt = part(p, pf);
    if (pt.type === 'tool-call' || pt.type === 'tool-result') {
      str(pt.toolCallId, `${pf}.toolCallId`);
      str(pt.toolName, `${pf}.toolName`);
    }
    if (pt.type === 'tool-result') obj(pt.output, `${pf}.output`);
  });
}

function stringOrParts(x: unknown, f: string): void {
  if (typeof x === 'string') return;
  if (!Array.isArray(x)) throw new InvalidArgumentError(f, 'a string or an array of content parts', x);
  x.forEach((p, i) => part(p, `${f}[${i}]`));
}

function part(x: unknown, f: string): ContentPart {
  const p = obj(x, f);
  str(p.type, `${f}.type`);
  return p as ContentPart;
}

function obj(x: unknown, f: string): Obj {
  if (typeof x !== 'object' || x === null || Array.isArray(x)) throw new InvalidArgumentError(f, 'an object', x);
  return x as Obj;
}

function arr(x: unknown, f: string): unknown[] {
  if (!Array.isArray(x)) throw new InvalidArgumentError(f, 'an array', x);
  return x;
}

function str(x: unknown, f: string): string {
  if (typeof x !== 'string' || x === '') throw new InvalidArgumentError(f, 'a non-empty string', x);
  return x;
}

function oneOf(x: unknown, allowed: readonly string[], f: string): void {
  if (typeof x !== 'string' || !allowed.includes(x)) {
    throw new InvalidArgumentError(f, `one of ${allowed.map((a) => `'${a}'`).join(', ')}`, x);
  }
}

/**
 * Only values the msgpack store gives back deep-equal: primitives (no symbols), plain objects,
 * arrays, typed arrays, ArrayBuffer and Date. Map, URL and class instances would come back as
 * something else, so they are refused here rather than silently changed.
 */
function storable(x: unknown, f: string, path: Set<object>): void {
  switch (typeof x) {
    case 'string':
    case 'number':
    case 'boolean':
    case 'bigint':
    case 'undefined':
      return;
    case 'object':
      break;
    default:
      throw new InvalidArgumentError(f, 'serializable data (no functions or symbols)', x);
  }
  if (x === null || ArrayBuffer.isView(x) || x instanceof ArrayBuffer || x instanceof Date) {
    if (ArrayBuffer.isView(x) && x instanceof DataView)
      throw new InvalidArgumentError(f, 'a typed array, not a DataView', x);
    return;
  }
  if (path.has(x)) throw new InvalidArgumentError(f, 'acyclic data', x);
  path.add(x);
  if (Array.isArray(x)) {
    x.forEach((v, i) => storable(v, `${f}[${i}]`, path));
  } else {
    if (Object.getPrototypeOf(x) !== Object.prototype) {
      throw new InvalidArgumentError(f, 'a plain object, array, typed array or Date', x);
    }
    for (const [k, v] of Object.entries(x)) storable(v, `${f}.${k}`, path);
  }
  path.delete(x);
}

// ---------------------------------------------------------------------------------------------
// Items

function lgMessages(cp: Obj): unknown[] | undefined {
  const cv = cp.channel_values;
  if (typeof cv !== 'object' || cv === null) return undefined;
  const m = (cv as Obj).messages;
  return Array.isArray(m) ? m : undefined;
}

/**
 * The list contexts grow by appending: messages or items; for LangGraph the
 * `checkpoint.channel_values.messages` array if present, else the whole checkpoint as one item;
 * for bytes the data as one item.
 */
export function contextItems(ctx: AgentContext): unknown[] {
  switch (ctx.format) {
    case 'openai-chat':
    case 'anthropic':
    case 'ai-sdk':
      return ctx.messages;
    case 'openai-responses':
      return ctx.items;
    case 'langgraph':
      return lgMessages(ctx.checkpoint) ?? [ctx.checkpoint];
    case 'bytes':
      return [ctx.data];
  }
}

/** Inverse of contextItems: `ctx` with its item list replaced by `items` (ctx is not modified). */
export function rebuild(ctx: AgentContext, items: unknown[]): AgentContext {
  switch (ctx.format) {
    case 'openai-chat':
      return { ...ctx, messages: items as OpenAIChatMessage[] };
    case 'anthropic':
      return { ...ctx, messages: items as AnthropicMessage[] };
    case 'ai-sdk':
      return { ...ctx, messages: items as AiSdkMessage[] };
    case 'openai-responses':
      return { ...ctx, items: items as OpenAIResponsesItem[] };
    case 'langgraph': {
      if (lgMessages(ctx.checkpoint) !== undefined) {
        const cv = ctx.checkpoint.channel_values as Obj;
        return { ...ctx, checkpoint: { ...ctx.checkpoint, channel_values: { ...cv, messages: items } } };
      }
      return { ...ctx, checkpoint: single(ctx.format, items) as Obj };
    }
    case 'bytes':
      return { ...ctx, data: single(ctx.format, items) as Uint8Array };
  }
}

function single(format: string, items: unknown[]): unknown {
  if (items.length !== 1) throw new InvalidArgumentError('items', `exactly one item for format '${format}'`, items);
  return items[0];
}

/**
 * The context with its items taken out; `rebuild(contextHeader(ctx), contextItems(ctx))` gives
 * back ctx. Single-item formats leave an empty placeholder (`{}` checkpoint, empty bytes).
 */
export function contextHeader(ctx: AgentContext): AgentContext {
  if (ctx.format === 'bytes') return { ...ctx, data: new Uint8Array(0) };
  if (ctx.format === 'langgraph' && lgMessages(ctx.checkpoint) === undefined) return { ...ctx, checkpoint: {} };
  return rebuild(ctx, []);
}

// ---------------------------------------------------------------------------------------------
// Recovery note

/** Text given to a tool call that was in flight at the checkpoint, so the transcript stays valid. */
export const INTERRUPTED_TOOL_RESULT =
  'Not completed: the environment was rolled back before this tool call returned. See the recovery note.';

/**
 * Adds the recovery summary to the context in its own format and returns a new context.
 *
 * Where the note goes, per format:
 * - openai-chat, ai-sdk: a `user` message (merged into a trailing user message). Mid-conversation
 *   system/developer messages are rejected by many chat templates and by some AI SDK providers,
 *   a user turn is accepted everywhere; the text marks itself as coming from the harness.
 * - anthropic: a user message with a text block, merged into a trailing user message so roles
 *   keep alternating.
 * - openai-responses: a `message` item with role `developer`, which the Responses API accepts
 *   at any position.
 * - langgraph: appended to `checkpoint.channel_values.messages` in the shape the existing
 *   messages use (LangChain-serialized, `{type}` or `{role}` dicts). Channel versions are not
 *   bumped: the note is state the next node reads, not an update that should trigger nodes.
 * - bytes: refused with CONTEXT_FORMAT_UNSUPPORTED; opaque bytes cannot be edited.
 *
 * A checkpoint can fall between a model's tool call and its result. Every vendor API rejects a
 * transcript with an unanswered tool call, so for chat, anthropic, ai-sdk and responses such
 * calls first get an error result saying the call was interrupted by the rollback.
 */
export function appendRecoveryNote(ctx: AgentContext, text: string): AgentContext {
  if (typeof text !== 'string' || text === '') throw new InvalidArgumentError('text', 'a non-empty string', text);
  switch (ctx.format) {
    case 'openai-chat':
      return { ...ctx, messages: noteOpenAIChat(ctx.messages, text) };
    case 'anthropic':
      return { ...ctx, messages: noteAnthropic(ctx.messages, text) };
    case 'ai-sdk':
      return { ...ctx, messages: noteAiSdk(ctx.messages, text) };
    case 'openai-responses':
      return { ...ctx, items: noteResponses(ctx.items, text) };
    case 'langgraph': {
      const messages = lgMessages(ctx.checkpoint);
      if (messages === undefined) {
        throw new ContextFormatUnsupportedError(
          ctx.format,
          'add a recovery note to',
          'the checkpoint has no channel_values.messages array',
        );
      }
      return rebuild(ctx, [...messages, langGraphNote(messages, text)]);
    }
    case 'bytes':
      throw new ContextFormatUnsupportedError(ctx.format, 'add a recovery note to', 'opaque bytes cannot be edited');
  }
}

function noteOpenAIChat(messages: OpenAIChatMessage[], text: string): OpenAIChatMessage[] {
  const out = [...messages];
  const answered = new Set(out.filter((m) => m.role === 'tool').map((m) => m.tool_call_id));
  const lastAssistant = trailingCaller(out, 'tool');
  for (const call of lastAssistant?.tool_calls ?? []) {
    if (!answered.has(call.id)) out.push({ role: 'tool', tool_call_id: call.id, content: INTERRUPTED_TOOL_RESULT });
  }
  const last = out.at(-1);
  if (last?.role === 'user') {
    out[out.length - 1] = { ...last, content: appendText(last.content, text) };
  } else {
    out.push({ role: 'user', content: text });
  }
  return out;
}

function noteAnthropic(messages: AnthropicMessage[], text: string): AnthropicMessage[] {
  const out = [...messages];
  const last = out.at(-1);
  // A tool_use must be answered by a tool_result in the very next (user) message.
  const pendingIds =
    last?.role === 'assistant' && Array.isArray(last.content)
      ? last.content.filter((b) => b.type === 'tool_use').map((b) => b.id as string)
      : [];
  const results: AnthropicBlock[] = pendingIds.map((id) => ({
    type: 'tool_result',
    tool_use_id: id,
    is_error: true,
    content: INTERRUPTED_TOOL_RESULT,
  }));
  const note: AnthropicBlock = { type: 'text', text };
  if (last?.role === 'user') {
    const blocks: AnthropicBlock[] =
      typeof last.content === 'string' ? [{ type: 'text', text: last.content }] : [...last.content];
    out[out.length - 1] = { ...last, content: [...blocks, note] };
  } else {
    out.push({ role: 'user', content: [...results, note] });
  }
  return out;
}

function noteAiSdk(messages: AiSdkMessage[], text: string): AiSdkMessage[] {
  const out = [...messages];
  const answered = new Set<unknown>();
  for (const m of out)
    if (Array.isArray(m.content)) for (const p of m.content) if (p.type === 'tool-result') answered.add(p.toolCallId);
  const lastAssistant = trailingCaller(out, 'tool');
  const pending = Array.isArray(lastAssistant?.content)
    ? lastAssistant.content.filter((p) => p.type === 'tool-call' && !answered.has(p.toolCallId))
    : [];
  if (pending.length > 0) {
    out.push({
      role: 'tool',
      content: pending.map((p) => ({
        type: 'tool-result',
        toolCallId: p.toolCallId,
        toolName: p.toolName,
        output: { type: 'error-text', value: INTERRUPTED_TOOL_RESULT },
      })),
    });
  }
  const last = out.at(-1);
  if (last?.role === 'user') {
    out[out.length - 1] = { ...last, content: appendText(last.content, text) as string | ContentPart[] };
  } else {
    out.push({ role: 'user', content: [{ type: 'text', text }] });
  }
  return out;
}

function noteResponses(items: OpenAIResponsesItem[], text: string): OpenAIResponsesItem[] {
  const out = [...items];
  const answered = new Set(out.filter((i) => i.type === 'function_call_output').map((i) => i.call_id));
  for (const it of items) {
    if (it.type === 'function_call' && !answered.has(it.call_id)) {
      out.push({ type: 'function_call_output', call_id: it.call_id, output: INTERRUPTED_TOOL_RESULT });
      answered.add(it.call_id);
    }
  }
  out.push({ type: 'message', role: 'developer', content: text });
  return out;
}

function langGraphNote(messages: unknown[], text: string): unknown {
  const sample = messages.find((m) => typeof m === 'object' && m !== null) as Obj | undefined;
  if (sample?.lc === 1 && sample.type === 'constructor') {
    return {
      lc: 1,
      type: 'constructor',
      id: ['langchain_core', 'messages', 'HumanMessage'],
      kwargs: { content: text, additional_kwargs: {}, response_metadata: {} },
    };
  }
  if (sample !== undefined && typeof sample.type === 'string' && sample.role === undefined)
    return { type: 'human', content: text };
  return { role: 'user', content: text };
}

function appendText(content: unknown, text: string): string | ContentPart[] {
  if (typeof content === 'string') return content === '' ? text : `${content}\n\n${text}`;
  if (Array.isArray(content)) return [...(content as ContentPart[]), { type: 'text', text }];
  return text;
}

/** The last assistant message if only `resultRole` messages follow it (its calls may still be open). */
function trailingCaller<T extends { role: string }>(xs: T[], resultRole: string): T | undefined {
  for (let i = xs.length - 1; i >= 0; i--) {
    if (xs[i]!.role === 'assistant') return xs[i];
    if (xs[i]!.role !== resultRole) return undefined;
  }
  return undefined;
}
