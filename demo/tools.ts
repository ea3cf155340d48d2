/**
 * The platform side of the demo: how an agent platform plugs its tools into
 * Lockstep. Each tool call becomes one sandbox call carrying the model's
 * tool-call id, so every observation (and the e-mail effect) can be traced
 * back to the exact tool_use block it came from.
 */
import type { Sandbox } from '../src/index.js';
import type { EmailStub, Delivery } from './email-stub.js';
import type { ToolCall, ToolResult } from './scripted-agent.js';

/** What one tool call did, for the transcript and for the report. */
export interface ToolOutcome extends ToolResult {
  /** The observation Lockstep recorded for it (none for start_process and send_email). */
  observationId?: string;
  /** For send_email: the ledger entry and whether it was replayed rather than sent. */
  effect?: { effectId: string; replayed: boolean; delivery: Delivery };
}

const MAX_RESULT = 2000;

/** Runs one tool call in the sandbox. */
export async function runTool(
  sandbox: Sandbox,
  call: ToolCall,
  deps: { email: EmailStub; signal: AbortSignal },
): Promise<ToolOutcome> {
  const p = { toolCallId: call.id };
  const input = call.input;
  switch (call.name) {
    case 'list_files': {
      const entries = await sandbox.files.list(need(input, 'path'), p);
      return {
        text: entries.map((e) => (e.type === 'directory' ? `${e.name}/` : e.name)).join('\n'),
        isError: false,
        ...obs(entries.observationId),
      };
    }
    case 'read_file': {
      const r = await sandbox.files.read(need(input, 'path'), p);
      return { text: clip(r.content.toString('utf8')), isError: false, observationId: r.observationId };
    }
    case 'write_file': {
      const content = need(input, 'content');
      const r = await sandbox.files.write(need(input, 'path'), content, p);
      return { text: `wrote ${r.bytes} bytes to ${input.path}`, isError: false, observationId: r.observationId };
    }
    case 'run': {
      const r = await sandbox.commands.run(need(input, 'command'), { ...p, signal: deps.signal, timeoutMs: 10_000 });
      const out = (r.stdout + r.stderr).trim();
      return {
        text: clip(r.exitCode === 0 ? out : `exit ${r.exitCode}\n${out}`),
        isError: r.exitCode !== 0,
        observationId: r.observationId,
      };
    }
    case 'start_process': {
      const pid = await sandbox.commands.spawn(need(input, 'command'));
      return { text: `started in the background (pid ${pid})`, isError: false };
    }
    case 'send_email': {
      // The intent is recorded before the e-mail goes out; after a rollback the
      // same call (same kind and input) gets the recorded delivery back instead.
      let sent = false;
      const mail = { to: need(input, 'to'), subject: need(input, 'subject'), body: need(input, 'body') };
      const delivery = (await sandbox.effects.run(
        { kind: 'email.send', input: mail, reversibility: 'irreversible', toolCallId: call.id },
        async () => {
          sent = true;
          return { ...(await deps.email.send(mail)) };
        },
      )) as unknown as Delivery;
      // run() returns only the output; the ledger row (the same one on a replay) is the committed email.send.
      const effect = sandbox.effects
        .list()
        .filter((e) => e.kind === 'email.send' && e.status === 'committed')
        .at(-1)!;
      const text = sent
        ? `sent to ${mail.to}: delivery #${delivery.delivery}, message id ${delivery.messageId}`
        : `already sent (effect ${effect.id} in the ledger): delivery #${delivery.delivery}, message id ${delivery.messageId}; not sent again`;
      return { text, isError: false, effect: { effectId: effect.id, replayed: !sent, delivery } };
    }
  }
}

function need(input: Record<string, string>, key: string): string {
  const v = input[key];
  if (typeof v !== 'string' || v === '') throw new Error(`tool input is missing ${key}`);
  return v;
}

function obs(id: string | undefined): { observationId?: string } {
  return id === undefined ? {} : { observationId: id };
}

function clip(s: string): string {
  return s.length > MAX_RESULT ? `${s.slice(0, MAX_RESULT)}…` : s;
}
