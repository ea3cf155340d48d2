/**
 * Seed 000, "rollback fixes the world the agent acts on, but not the world
 * the agent believes in": step 3 creates a file, step 6 fails and rolls back
 * past step 3. The context that comes back must not hold the step-3
 * observation as fact, and the agent must be told it is no longer true.
 *
 * The agent is scripted (no model): it builds an OpenAI Chat Completions
 * context deterministically, one tool call per step, through the observed
 * sandbox APIs with each call's tool-call id.
 */
import test from 'ava';
import { appendRecoveryNote, type AgentContext, type Lockstep, type Sandbox } from '../../src/index.js';
import type { OpenAIChatMessage } from '../../src/context/formats.js';
import { integration, openTestLockstep } from '../helpers/harness.js';

type Chat = Extract<AgentContext, { format: 'openai-chat' }>;

/** A scripted agent: each step is one tool call and its result, appended to the context. */
class ScriptedAgent {
  readonly messages: OpenAIChatMessage[] = [
    { role: 'system', content: 'You are a build agent working in a sandbox. Use the tools.' },
    { role: 'user', content: 'Count the lines of src/main.c and leave a report in /workspace/out.' },
  ];
  readonly observationIds = new Map<string, string>();

  constructor(private readonly sb: Sandbox) {}

  /** Runs one tool through the observed sandbox APIs, as the agent's runtime would. */
  async step(
    n: number,
    name: 'list_dir' | 'run' | 'write_file' | 'read_file',
    args: Record<string, string>,
  ): Promise<string> {
    const toolCallId = `call_step${n}`;
    this.messages.push({
      role: 'assistant',
      content: null,
      tool_calls: [{ id: toolCallId, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
    });
    let result: string;
    let observationId: string | undefined;
    if (name === 'list_dir') {
      const entries = await this.sb.files.list(args.path!, { toolCallId });
      result = entries.map((e) => e.name).join('\n');
      observationId = entries.observationId;
    } else if (name === 'run') {
      const r = await this.sb.commands.run(args.cmd!, { toolCallId });
      result = `exit ${r.exitCode}\n${r.stdout}`;
      observationId = r.observationId;
    } else if (name === 'write_file') {
      const w = await this.sb.files.write(args.path!, args.content!, { toolCallId });
      result = `wrote ${w.bytes} bytes to ${args.path}`;
      observationId = w.observationId;
    } else {
      const r = await this.sb.files.read(args.path!, { toolCallId });
      result = r.content.toString();
      observationId = r.observationId;
    }
    if (observationId) this.observationIds.set(toolCallId, observationId);
    this.messages.push({ role: 'tool', tool_call_id: toolCallId, content: result });
    return result;
  }

  context(): Chat {
    return { format: 'openai-chat', messages: structuredClone(this.messages) };
  }
}

/**
 * "Describe the current state of the system", scripted: the files the agent
 * believes exist are those its context shows it wrote, minus those a
 * recovery note lists as no longer true.
 */
function believedFiles(messages: OpenAIChatMessage[]): string[] {
  const files = new Set<string>();
  for (const m of messages) {
    for (const call of m.tool_calls ?? []) {
      if (call.function?.name !== 'write_file') continue;
      const answered = messages.some(
        (r) => r.role === 'tool' && r.tool_call_id === call.id && String(r.content).startsWith('wrote '),
      );
      if (answered) files.add((JSON.parse(call.function.arguments) as { path: string }).path);
    }
    const text = typeof m.content === 'string' ? m.content : '';
    const note = /<lockstep-recovery>[\s\S]*?No longer true[^\n]*\n([\s\S]*?)(\n\n|<\/lockstep-recovery>)/.exec(text);
    for (const line of note?.[1]?.split('\n') ?? []) {
      const touched = /^- (?:read|write|list)(?:\/(?:read|write|list))* (\/\S+)$/.exec(line);
      if (touched) files.delete(touched[1]!);
    }
  }
  return [...files].sort();
}

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];
  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  test.serial('seed 000: after a rollback past step 3, the agent does not hold the step-3 file as fact', async (t) => {
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    await sb.files.write('/workspace/src/main.c', 'int main(void) {\n  return 0;\n}\n');
    const agent = new ScriptedAgent(sb);
    const checkpoints: string[] = [];
    const contexts: Chat[] = [];
    const after = async (n: number) => {
      const context = agent.context();
      contexts[n] = context;
      checkpoints[n] = (await sb.checkpoint({ label: `after step ${n}`, context })).id;
    };

    await agent.step(1, 'list_dir', { path: '/workspace/src' });
    await after(1);
    await agent.step(2, 'run', { cmd: 'mkdir -p /workspace/out && wc -l < /workspace/src/main.c' });
    await after(2);
    await agent.step(3, 'write_file', { path: '/workspace/out/report.txt', content: 'src/main.c: 3 lines\n' });
    await after(3);
    t.is(await agent.step(4, 'read_file', { path: '/workspace/out/report.txt' }), 'src/main.c: 3 lines\n');
    await after(4);
    await agent.step(5, 'run', { cmd: 'wc -c < /workspace/out/report.txt' });
    await after(5);
    // Step 6 fails (the publishing API rate-limits the agent): roll back past step 3.
    t.deepEqual(
      believedFiles(agent.messages),
      ['/workspace/out/report.txt'],
      'before the rollback the agent knows of the file',
    );
    const report = await sb.rollback(checkpoints[2]!, {
      failure: 'step 6: the publishing API answered 429 Too Many Requests',
      lessons: ['The publishing API allows one request per minute: batch uploads.'],
    });

    // The world: the file is gone.
    t.false(await sb.files.exists('/workspace/out/report.txt'));
    t.deepEqual(
      (await sb.files.list('/workspace/out')).map((e) => e.name),
      [],
    );

    // The context that comes back is exactly the one stored at step 2: no step-3 fact in it.
    t.deepEqual(report.context, contexts[2]);
    t.deepEqual(report.context, sb.context(checkpoints[2]!));
    const returned = JSON.stringify(report.context);
    t.false(returned.includes('report.txt'));
    t.false(returned.includes('call_step3'));

    // The context with recovery is that one plus a note marking step 3-5's observations as no longer true.
    t.deepEqual(report.contextWithRecovery, appendRecoveryNote(contexts[2]!, report.recoverySummary.text));
    const messages = (report.contextWithRecovery as Chat).messages;
    t.deepEqual(messages.slice(0, contexts[2]!.messages.length), contexts[2]!.messages);
    const note = messages.at(-1)!;
    t.is(note.role, 'user');
    const text = String(note.content);
    t.regex(text, /^<lockstep-recovery>/);
    t.regex(text, /No longer true[\s\S]*- write\/read \/workspace\/out\/report\.txt/);
    t.true(text.includes('Reason: step 6: the publishing API answered 429 Too Many Requests'));
    t.true(text.includes('- The publishing API allows one request per minute: batch uploads.'));
    t.deepEqual(report.recoverySummary.structured.filesTouched, [
      { path: '/workspace/out/report.txt', how: ['write', 'read'] },
    ]);

    // The report marks the step-3 write (and what built on it) stale, by tool-call id; steps 1-2 stay true.
    const stale = report.staleObservations;
    t.deepEqual(
      stale.map((o) => o.toolCallId),
      ['call_step3', 'call_step4', 'call_step5'],
    );
    t.like(
      stale.find((o) => o.toolCallId === 'call_step3'),
      { id: agent.observationIds.get('call_step3'), kind: 'file-write', subject: '/workspace/out/report.txt' },
    );
    t.like(
      stale.find((o) => o.toolCallId === 'call_step4'),
      { kind: 'file-read', subject: '/workspace/out/report.txt' },
    );
    for (const o of stale) t.truthy(o.staleRollbackId);
    const live = sb.observations({ includeStale: false }).map((o) => o.toolCallId);
    t.true(live.includes('call_step1') && live.includes('call_step2'));
    t.false(live.includes('call_step3'));

    // Asked to describe the state, the agent resuming from what Lockstep hands back agrees with the world...
    t.deepEqual(believedFiles(messages), []);
    // ...and so would one that kept its whole history, if it read the note; without it, it would not.
    t.deepEqual(believedFiles([...agent.messages, note]), []);
    t.deepEqual(believedFiles(agent.messages), ['/workspace/out/report.txt']);
  });
});
