/**
 * The demo's terminal output: sections with headings, one line per step as
 * it happens, colour only on a terminal (never with NO_COLOR or CI set).
 */
import { useColor } from '../src/cli/output.js';
import { describeCall, describeResult, fileRows, ms, parseWorker, type Facts, type TranscriptLine } from './facts.js';
import type { DemoRun, StepRun, World } from './scenario.js';

type Paint = (s: string) => string;
type RollbackPart = Pick<DemoRun, 'rollback' | 'firstAttempt' | 'retry'>;

/** Writes the demo to stdout as it runs. */
export class TerminalReport {
  readonly bold: Paint;
  readonly dim: Paint;
  readonly red: Paint;
  readonly green: Paint;
  readonly yellow: Paint;
  readonly cyan: Paint;
  private readonly width: number;
  private readonly callW: number;
  private readonly resultW: number;

  constructor(private readonly out: NodeJS.WriteStream = process.stdout) {
    const color = useColor();
    const sgr =
      (open: number, close: number): Paint =>
      (s) =>
        color && s ? `\x1b[${open}m${s}\x1b[${close}m` : s;
    this.bold = sgr(1, 22);
    this.dim = sgr(2, 22);
    this.red = sgr(31, 39);
    this.green = sgr(32, 39);
    this.yellow = sgr(33, 39);
    this.cyan = sgr(36, 39);
    this.width = Math.min(out.isTTY ? out.columns || 110 : 110, 110);
    // A step line is "✗ NNNN  call result ckpt_xxxxxxxxxxxx  NNN ms": 36 columns besides call and result.
    const room = Math.max(40, this.width - 36);
    this.callW = Math.min(32, Math.floor(room * 0.45));
    this.resultW = room - this.callW - 1;
  }

  line(s = ''): void {
    this.out.write(`${s}\n`);
  }

  heading(title: string): void {
    this.line();
    this.line(this.bold(title));
    this.line(this.dim('─'.repeat(Math.min(this.width, 100))));
  }

  intro(o: { sandboxId: string; home: string; image: string; format: string; task: string }): void {
    this.line(this.bold('Lockstep demo: roll back the world, and what the agent believes about it'));
    this.line(
      this.dim(`sandbox ${o.sandboxId} (image ${o.image}) · state directory ${o.home} · context format ${o.format}`),
    );
    this.line();
    this.paragraph(
      'A scripted agent (no model) works in a real sandbox, with a checkpoint after every step: files, processes, ' +
        'its context and a position in the effect ledger, bound together. Step 11 fails; Lockstep rolls back to step 6 ' +
        'and the agent retries from what Lockstep hands back.',
      '  ',
    );
    this.line();
    this.paragraph(`The agent’s task: “${o.task}”`, '  ');
  }

  stepHeader(title: string): void {
    this.heading(title);
    this.line(
      this.dim(
        `  ${'step'.padStart(4)}  ${'tool call'.padEnd(this.callW)} ${'result'.padEnd(this.resultW)} checkpoint after it`,
      ),
    );
  }

  step(s: StepRun): void {
    const n = `${s.turn.step}${s.turn.attempt > 1 ? "'" : ''}`.padStart(4);
    const call = clip(describeCall(s.turn.call), this.callW).padEnd(this.callW);
    const text = clip(describeResult(s), this.resultW).padEnd(this.resultW);
    const result = s.outcome.isError
      ? this.red(text)
      : s.outcome.effect?.replayed
        ? this.cyan(text)
        : s.outcome.effect
          ? this.yellow(text)
          : text;
    const mark = s.outcome.isError ? this.red('✗') : ' ';
    this.line(
      `${mark} ${this.bold(n)}  ${call} ${result} ${s.checkpoint.id} ${this.dim(ms(s.checkpoint.timings.totalMs).padStart(8))}`,
    );
    const e = s.outcome.effect;
    if (e) {
      this.line(
        e.replayed
          ? this.cyan(`        ↺ replayed from the effect ledger (${e.effectId}): the e-mail service was not called`)
          : this.yellow(
              `        ✉ irreversible effect, recorded in the ledger as ${e.effectId} before the e-mail went out`,
            ),
      );
    }
  }

  rollback(run: RollbackPart, f: Facts): void {
    const { decision, from, to, report } = run.rollback;
    const failed = run.firstAttempt.find((s) => s.outcome.isError);
    this.line();
    this.paragraph(`${this.red(`✗ Step ${failed?.turn.step ?? '?'} failed.`)} The agent: “${decision.thought}”`, '  ');
    this.hanging('failure  ', decision.failure);
    for (const l of decision.lessons) this.hanging('lesson   ', l);

    const path = (report as { path?: string }).path;
    this.heading(
      `Rolled back to step ${decision.toStep} (${to.checkpoint.id}) from step ${from.turn.step} (${from.checkpoint.id})`,
    );
    this.paragraph(
      `${this.bold(ms(report.timings.totalMs))} for files, processes, context and ledger position, as one step${path === 'standby' ? ' (a warm standby of the checkpoint was swapped in)' : ''}: ` +
        f.rollbackPhases.map((p) => `${p.name} ${ms(p.ms)}`).join(' · '),
      '  ',
    );

    this.heading('The world, before and after the rollback');
    this.world(run.rollback.before, run.rollback.after, f, from.turn.step, decision.toStep);

    this.heading('The agent’s context, before and after');
    this.context(run, f);

    this.heading('What the rollback cannot take back');
    this.effects(run, f);
  }

  private world(before: World, after: World, f: Facts, fromStep: number, toStep: number): void {
    const col = 46;
    const gone = new Set(f.filesGone);
    const rows = fileRows(
      [...new Set([...before.files.map((x) => x.path), ...after.files.map((x) => x.path)])].sort(),
      gone,
    );
    this.line(`  ${this.dim('files in /workspace')}`);
    this.line(
      `    ${this.bold(`before (step ${fromStep})`.padEnd(col))}${this.bold(`after (back at step ${toStep})`)}`,
    );
    for (const r of rows) {
      if (!r.removed) this.line(`    ${r.text.padEnd(col)}${r.text}`);
      else this.line(`    ${this.yellow(r.text.padEnd(col))}${this.red('gone')}`);
    }
    this.line();
    this.line(
      `  ${this.dim('the background worker’s memory (it writes what it holds to /tmp/worker.state every 100 ms)')}`,
    );
    this.line(`    before  ${this.yellow(before.worker)}`);
    this.line(`    after   ${this.green(after.worker)}`);
    const wb = parseWorker(before.worker);
    const wa = parseWorker(after.worker);
    if (wb && wa && wb.pid === wa.pid) {
      this.paragraph(
        `Same process (pid ${wa.pid}), not a restart: CRIU restored its memory as it was at step ${toStep}, so its tick counter went back from ${wb.tick} to ${wa.tick} and the config it had loaded is gone from it.`,
        '    ',
        this.dim,
      );
    }
  }

  private context(run: RollbackPart, f: Facts): void {
    const { report, decision, contextBefore } = run.rollback;
    const msgs = (c: unknown) => ((c as { messages?: unknown[] } | null)?.messages ?? []).length;
    this.line(
      `  ${this.bold(`Before: the agent’s context at step ${run.rollback.from.turn.step}`)} ${this.dim(`(${msgs(contextBefore)} messages)`)}`,
    );
    for (const l of f.before) this.line(`    ${this.transcriptLine(l)}`);
    this.line();
    this.line(
      `  ${this.bold(`After: the step-${decision.toStep} snapshot with a recovery note`)} ${this.dim(`(${msgs(report.contextWithRecovery)} messages, report.contextWithRecovery)`)}`,
    );
    for (const l of f.after) this.line(`    ${this.transcriptLine(l)}`);
    this.line(`    ${'user'.padEnd(10)} ${this.cyan('+ recovery note, appended to the last user turn:')}`);
    const bar = this.dim('│');
    for (const raw of report.recoverySummary.text.split('\n')) {
      const wrapped = wrapLines(raw, this.width - 10);
      wrapped.forEach((l, i) => this.line(`      ${bar} ${i > 0 ? '  ' : ''}${l}`));
    }

    this.line();
    this.line(`  ${this.bold('Stale observations')} ${this.dim(`(report.staleObservations: ${f.stale.length})`)}`);
    for (const o of f.stale) {
      const exit = o.exitCode !== null && o.exitCode !== 0 ? ` (exit ${o.exitCode})` : '';
      this.line(
        `    ${this.red('✗ stale')}  ${(o.toolCallId ?? '-').padEnd(9)} ${o.kind.padEnd(11)} ${clip(o.subject + exit, 60)}`,
      );
    }
  }

  private transcriptLine(l: TranscriptLine): string {
    const id = l.toolCallId.padEnd(10);
    const call = clip(l.call, 40).padEnd(40);
    switch (l.fate) {
      case 'kept':
        return `${id} ${call} ${this.green('✓ still true')}`;
      case 'stale':
        return `${this.red(id)} ${this.red(call)} ${this.red('✗ stale')}`;
      case 'irreversible':
        return `${this.yellow(id)} ${this.yellow(call)} ${this.yellow('⚠ happened outside the sandbox; not undone')}`;
      case 'undone':
        return this.dim(`${id} ${call} undone`);
    }
  }

  private effects(run: RollbackPart, f: Facts): void {
    const e = f.email.effect;
    if (!e) {
      this.line('  (none)');
      return;
    }
    const input = e.input as { to?: string; subject?: string };
    const out = e.output as { delivery?: number; messageId?: string } | undefined;
    this.line(`  ${this.yellow('⚠')} ${this.bold('email.send')} to ${input.to}: “${input.subject}”`);
    this.line(
      `    ${e.id} · ${e.reversibility} · ${e.status} at step ${f.email.sentAt?.turn.step ?? '?'} (${e.toolCallId}) · delivery #${out?.delivery ?? '?'} ${out?.messageId ?? ''}`,
    );
    for (const w of run.rollback.report.warnings) this.line(`    ${this.yellow(`warning: ${w.message}`)}`);
    this.paragraph(
      'The recovery note tells the agent not to repeat it. If the agent repeats it anyway, the ledger answers with the recorded delivery instead of sending again.',
      '    ',
      this.dim,
    );
  }

  /** The end of the run: the outcome, the e-mail count, the tree and the timings. */
  finish(run: DemoRun, f: Facts, tree: string): void {
    this.line();
    this.line(`  ${this.green('✓')} The agent: “${run.finalThought}”`);
    this.line(`    worker now: ${run.final.worker}`);
    const replay = f.email.replayedAt;
    this.line(
      `    ${this.bold(`email delivered ${run.deliveries} time(s)`)}${replay ? ` ${this.dim(`(sent at step ${f.email.sentAt?.turn.step}, replayed from the ledger at step ${replay.turn.step}')`)}` : ''}`,
    );

    this.heading('Checkpoint tree');
    for (const l of tree.split('\n')) this.line(`  ${l}`);
    this.line(
      this.dim(
        `  * marks the head. Step ${run.rollback.decision.toStep} has two children: the abandoned attempt and the retry.`,
      ),
    );

    this.heading('Measured');
    const c = f.checkpointTotal;
    const z = f.checkpointFrozen;
    const a = f.allCheckpointTotal;
    const label = (s: string) => `  ${s.padEnd(34)}`;
    this.line(`${label(`checkpoint, the ${c.n} of attempt 1`)}p50 ${this.bold(ms(c.p50))} · max ${ms(c.max)}`);
    this.line(`${label('  of which processes frozen')}p50 ${ms(z.p50)} · max ${ms(z.max)}`);
    this.line(`${label(`checkpoint, all ${a.n}`)}p50 ${ms(a.p50)} · max ${ms(a.max)}`);
    const known = f.rollbackPhases.reduce((s, p) => s + p.ms, 0);
    const phases = [
      ...f.rollbackPhases.map((p) => `${p.name} ${ms(p.ms)}`),
      `other ${ms(Math.max(0, f.rollbackTotal - known))}`,
    ];
    this.line(
      `${label(`rollback to step ${run.rollback.decision.toStep}`)}${this.bold(ms(f.rollbackTotal))} = ${phases.join(' + ')}`,
    );
  }

  /** "label  text", the text wrapped under itself. */
  private hanging(label: string, text: string): void {
    const pad = ' '.repeat(4 + label.length);
    wrapLines(text, this.width - pad.length).forEach((l, i) =>
      this.line(this.dim(`${i === 0 ? `    ${label}` : pad}${l}`)),
    );
  }

  private paragraph(text: string, indent: string, paint: Paint = (s) => s): void {
    for (const l of wrapLines(text, this.width - indent.length)) this.line(indent + paint(l));
  }
}

function clip(s: string, n: number): string {
  const one = s.replace(/\s+/g, ' ');
  return one.length > n ? `${one.slice(0, n - 1)}…` : one;
}

/** Greedy word wrap on visible width (colour codes do not count). */
function wrapLines(text: string, width: number): string[] {
  const lines: string[] = [];
  let cur = '';
  for (const w of text.split(' ')) {
    if (cur && visible(cur).length + 1 + visible(w).length > width) {
      lines.push(cur);
      cur = w;
    } else cur = cur ? `${cur} ${w}` : w;
  }
  lines.push(cur);
  return lines;
}

function visible(s: string): string {
  // eslint-disable-next-line no-control-regex
  return s.replace(/\x1b\[[0-9;]*m/g, '');
}
