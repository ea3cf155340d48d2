/**
 * The demo's agent: deterministic, no model. It keeps its transcript in the
 * Anthropic Messages format (what a Claude-based agent would send on every
 * turn) and decides each next step from that transcript alone, so that after
 * a rollback it acts on exactly the context Lockstep hands back: the step-6
 * snapshot plus the recovery note. The one thing it learns from the note is
 * the lesson it was given (the release API's rate limit); everything else it
 * re-derives by looking again.
 */
import type { AgentContext } from '../src/index.js';

/** The tools the agent can call; the platform maps each to one sandbox call. */
export type ToolName = 'list_files' | 'read_file' | 'write_file' | 'run' | 'start_process' | 'send_email';

/** A tool call as the model would emit it (an Anthropic `tool_use` block). */
export interface ToolCall {
  id: string;
  name: ToolName;
  input: Record<string, string>;
}

/** One step: what the agent says, the tool it calls, and how the checkpoint after it is labelled. */
export interface Turn {
  step: number;
  attempt: number;
  thought: string;
  call: ToolCall;
  label: string;
}

/** What the platform hands back for a tool call. */
export interface ToolResult {
  text: string;
  isError: boolean;
}

export type Decision =
  | { kind: 'call'; turn: Turn }
  | { kind: 'rollback'; toStep: number; thought: string; failure: string; lessons: string[] }
  | { kind: 'done'; thought: string };

type Block = { type: string; [key: string]: unknown };
type Message = { role: 'user' | 'assistant'; content: string | Block[] };
type AnthropicContext = { format: 'anthropic'; system?: string; messages: Message[] };

export const TASK =
  'Release billing v2.0 from /workspace: start the release worker, configure it, tell QA (qa@example.com) ' +
  'that the rollout is starting, publish every record, and check the result.';

const SYSTEM =
  'You are release-bot, working inside a Lockstep sandbox. Tools: list_files, read_file, write_file, run, start_process, send_email.';

/** The e-mail to QA. The same input on every attempt: the ledger recognises a repeat by kind + input. */
export const QA_EMAIL = {
  to: 'qa@example.com',
  subject: 'billing v2.0 rollout starts today',
  body: 'Heads-up: the v2.0 rollout of the billing service starts today. I will report when every batch is published. (release-bot)',
};

/** Where the abandoned attempt's lesson about the API is matched, and how it is worded. */
const RATE_LESSON = /allows at most (\d+) requests\/s/;
export const RECOVERY_TAG = '<lockstep-recovery>';

/** A deterministic agent over an Anthropic-format transcript. */
export class ScriptedAgent {
  private ctx: AnthropicContext;

  constructor() {
    this.ctx = { format: 'anthropic', system: SYSTEM, messages: [{ role: 'user', content: TASK }] };
  }

  /** The transcript as it is now (a copy; checkpoint() stores it). */
  get context(): AgentContext {
    return structuredClone(this.ctx);
  }

  /** Continues from a context Lockstep handed back (after a rollback: the snapshot with the recovery note). */
  resume(ctx: AgentContext): void {
    if (ctx.format !== 'anthropic')
      throw new Error(`the scripted agent speaks the anthropic format, got ${ctx.format}`);
    this.ctx = structuredClone(ctx) as AnthropicContext;
  }

  /** Appends the step's assistant turn and the tool's result, as the agent loop would. */
  record(turn: Turn, result: ToolResult): void {
    const call = turn.call;
    this.ctx.messages.push({
      role: 'assistant',
      content: [
        { type: 'text', text: turn.thought },
        { type: 'tool_use', id: call.id, name: call.name, input: call.input },
      ],
    });
    this.ctx.messages.push({
      role: 'user',
      content: [
        {
          type: 'tool_result',
          tool_use_id: call.id,
          content: result.text,
          ...(result.isError ? { is_error: true } : {}),
        },
      ],
    });
  }

  /** Closes the transcript with a final assistant message. */
  finish(text: string): void {
    this.ctx.messages.push({ role: 'assistant', content: [{ type: 'text', text }] });
  }

  /** The next step, decided from the transcript only. */
  next(): Decision {
    const calls = this.toolCalls();
    const step = calls.length + 1;
    const attempt = 1 + this.texts().filter((t) => t.includes(RECOVERY_TAG)).length;
    const id = `toolu_${String(step).padStart(2, '0')}${attempt > 1 ? String.fromCharCode(96 + attempt) : ''}`;
    const turn = (thought: string, name: ToolName, input: Record<string, string>, label: string): Decision => ({
      kind: 'call',
      turn: {
        step,
        attempt,
        thought,
        call: { id, name, input },
        label: `step ${step}${attempt > 1 ? "'" : ''}: ${label}`,
      },
    });
    const lessonRps = this.lessonRps();

    switch (step) {
      case 1:
        return turn('Looking at the repository first.', 'list_files', { path: '/workspace' }, 'explored /workspace');
      case 2:
        return turn(
          'There is a README; reading the release procedure.',
          'read_file',
          { path: '/workspace/README.md' },
          'read README.md',
        );
      case 3:
        return turn(
          'Counting the records to publish.',
          'run',
          { command: 'wc -l data/records.csv' },
          'counted records',
        );
      case 4:
        return turn(
          'Starting the release worker in the background, as the README says.',
          'start_process',
          { command: 'sh bin/worker.sh' },
          'worker started',
        );
      case 5:
        return turn('Checking what the worker holds.', 'run', { command: 'cat /tmp/worker.state' }, 'worker idle');
      case 6:
        return turn(
          'Dry run of the publisher before configuring anything.',
          'run',
          { command: 'sh bin/publish.sh --dry-run' },
          'dry run passed',
        );
      case 7: {
        const rps = lessonRps ?? this.readmeRps();
        const why =
          lessonRps !== undefined
            ? `Recovery note read: config.json and the worker's copy of it are gone, and the release API allows at most ${lessonRps} requests/s. Writing config.json again, this time with rate_limit_rps ${rps}.`
            : `Writing config.json with the values the README gives (rate_limit_rps ${rps}); the worker will load it.`;
        const config = JSON.stringify({ release: 'v2.0', batch_size: 500, rate_limit_rps: rps });
        return turn(
          why,
          'write_file',
          { path: '/workspace/config.json', content: `${config}\n` },
          `wrote config.json (${rps} req/s)`,
        );
      }
      case 8:
        return turn(
          lessonRps !== undefined
            ? 'The note lists the QA e-mail as already sent. send_email goes through the effect ledger, so re-issuing it returns the recorded delivery instead of e-mailing QA twice.'
            : 'Telling QA the rollout is starting.',
          'send_email',
          QA_EMAIL,
          'QA e-mailed',
        );
      case 9:
        return turn(
          'Reading config.json back to plan the publish.',
          'read_file',
          { path: '/workspace/config.json' },
          'read config.json',
        );
      case 10: {
        const cfg = this.lastConfigRead();
        const plan = cfg
          ? `Plan from config.json: 5000 records in ${Math.ceil(5000 / cfg.batch_size)} batches of ${cfg.batch_size} at ${cfg.rate_limit_rps} req/s.`
          : 'config.json could not be parsed; checking the worker instead.';
        return turn(
          `${plan} Checking that the worker loaded the same config.`,
          'run',
          { command: 'cat /tmp/worker.state' },
          'worker configured',
        );
      }
      case 11:
        return turn('Publishing.', 'run', { command: 'sh bin/publish.sh' }, 'publish ran');
      case 12: {
        const failed = this.lastResult()?.isError === true;
        return turn(
          failed
            ? 'The publish failed part-way. Checking what it left in out/.'
            : 'Checking that every batch is in out/.',
          'list_files',
          { path: '/workspace/out' },
          failed ? 'inspected half-published out/' : 'verified out/',
        );
      }
      default: {
        const publish = calls.find((c) => c.name === 'run' && c.input.command === 'sh bin/publish.sh');
        const publishResult = publish ? this.resultOf(publish.id) : undefined;
        if (publishResult?.isError) {
          const limit = RATE_LESSON.exec(publishResult.text)?.[1];
          // Back to just before the config was written: the half-published out/ and the worker's wrong config both go.
          const configStep =
            calls.findIndex((c) => c.name === 'write_file' && c.input.path === '/workspace/config.json') + 1;
          return {
            kind: 'rollback',
            toStep: configStep - 1,
            thought: `out/ holds ${this.lastResult()?.text.split(/\s+/).filter(Boolean).length ?? 0} of 10 batches and publish.sh cannot resume. Rolling back to step ${configStep - 1}, before config.json existed, and retrying with the rate limit.`,
            failure: `publish.sh failed with HTTP 429 Too Many Requests part-way through: config.json asked for ${this.lastConfigRead()?.rate_limit_rps ?? '?'} requests/s.`,
            lessons: [
              `The release API allows at most ${limit ?? 10} requests/s: set rate_limit_rps to ${limit ?? 10} or less in config.json.`,
              'publish.sh cannot resume a partial run: it must start from an empty out/ directory.',
            ],
          };
        }
        return { kind: 'done', thought: 'Released billing v2.0: every batch is published and QA was told once.' };
      }
    }
  }

  private toolCalls(): ToolCall[] {
    return this.blocks('assistant')
      .filter((b) => b.type === 'tool_use')
      .map((b) => ({ id: b.id as string, name: b.name as ToolName, input: b.input as Record<string, string> }));
  }

  private blocks(role: 'user' | 'assistant'): Block[] {
    return this.ctx.messages
      .filter((m) => m.role === role)
      .flatMap((m) => (typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content));
  }

  private texts(): string[] {
    return this.blocks('user')
      .filter((b) => b.type === 'text')
      .map((b) => b.text as string);
  }

  private resultOf(id: string): ToolResult | undefined {
    const b = this.blocks('user').find((x) => x.type === 'tool_result' && x.tool_use_id === id);
    return b ? { text: String(b.content ?? ''), isError: b.is_error === true } : undefined;
  }

  private lastResult(): ToolResult | undefined {
    const last = this.toolCalls().at(-1);
    return last ? this.resultOf(last.id) : undefined;
  }

  /** The limit a recovery note's lesson gives, if the transcript has one. */
  private lessonRps(): number | undefined {
    const note = this.texts().find((t) => t.includes(RECOVERY_TAG));
    const m = note ? RATE_LESSON.exec(note) : null;
    return m ? Number(m[1]) : undefined;
  }

  /** The rate the README suggests (read at step 2). */
  private readmeRps(): number {
    const readme = this.toolCalls().find((c) => c.name === 'read_file' && c.input.path === '/workspace/README.md');
    const m = readme ? /rate_limit_rps (\d+)/.exec(this.resultOf(readme.id)?.text ?? '') : null;
    return m ? Number(m[1]) : 50;
  }

  private lastConfigRead(): { batch_size: number; rate_limit_rps: number } | undefined {
    const read = this.toolCalls()
      .filter((c) => c.name === 'read_file' && c.input.path === '/workspace/config.json')
      .at(-1);
    try {
      return read
        ? (JSON.parse(this.resultOf(read.id)?.text ?? '') as { batch_size: number; rate_limit_rps: number })
        : undefined;
    } catch {
      return undefined;
    }
  }
}
