/**
 * `npm run demo`: the seed-000 scenario on a real sandbox. A scripted agent
 * works through twelve steps with a checkpoint after each, fails at step 11,
 * and Lockstep rolls files, processes, the agent's context and the effect
 * ledger back to step 6 as one step; the agent then retries from the context
 * Lockstep hands back and succeeds without e-mailing anyone twice.
 *
 *   node dist/demo/demo.js [--home DIR] [--html FILE]
 *
 * The demo uses its own state directory and removes the sandbox it created
 * when it ends, also on an error or Ctrl-C.
 */
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Lockstep, LockstepError, type Sandbox } from '../src/index.js';
import { drawTree } from '../src/checkpoints/tree.js';
import { Progress, exitCodeFor, useColor } from '../src/cli/output.js';
import { startEmailStub, type EmailStub } from './email-stub.js';
import { Scenario } from './scenario.js';
import { TASK } from './scripted-agent.js';
import { TerminalReport } from './render-terminal.js';
import { facts } from './facts.js';
import { renderHtml } from './render-html.js';

const DEFAULT_HOME = '/var/lib/lockstep-demo';
const IMAGE = 'base';
/** Marks the demo's sandboxes, so a later run can remove one a killed run left behind. */
const DEMO_TAG = 'lockstep-demo';

/** Aborted on SIGINT/SIGTERM with the DemoError to report. */
const abort = new AbortController();

const USAGE = `usage: npm run demo -- [--home DIR] [--html FILE]

  --home DIR    state directory (default: LOCKSTEP_HOME, else ${DEFAULT_HOME})
  --html FILE   also write a self-contained HTML report to FILE
`;

interface Args {
  home: string;
  html: string | undefined;
}

function parse(argv: string[]): Args | 'help' {
  const { values, positionals } = parseArgs({
    args: argv,
    options: { home: { type: 'string' }, html: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
    allowPositionals: true,
    strict: true,
  });
  if (values.help) return 'help';
  if (positionals.length) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  if (values.home === '') throw new UsageError('--home needs a directory');
  if (values.html === '') throw new UsageError('--html needs a file name');
  return {
    home: path.resolve(values.home ?? process.env.LOCKSTEP_HOME ?? DEFAULT_HOME),
    html: values.html === undefined ? undefined : path.resolve(values.html),
  };
}

class UsageError extends Error {}

async function main(): Promise<number> {
  let args: Args | 'help';
  try {
    args = parse(process.argv.slice(2));
  } catch (e) {
    // parseArgs explains at length how to pass a positional that starts with "-"; the first sentence is the point.
    process.stderr.write(`lockstep demo: ${(e as Error).message.split('. ')[0]}\n\n${USAGE}`);
    return 2;
  }
  if (args === 'help') {
    process.stdout.write(USAGE);
    return 0;
  }
  if (args.html) {
    // Fail before the sandbox work, not after it.
    const dir = path.dirname(args.html);
    if (!fs.existsSync(dir)) throw new DemoError(`cannot write the HTML report: directory ${dir} does not exist`);
  }

  const started = performance.now();
  let interrupts = 0;
  const onSignal = (sig: NodeJS.Signals) => {
    interrupts++;
    if (interrupts > 1) {
      process.stderr.write(
        `\nlockstep demo: ${sig} again; exiting without cleaning up (the next run removes what is left)\n`,
      );
      process.exit(130);
    }
    process.stderr.write(`\nlockstep demo: ${sig}: stopping and removing the sandbox…\n`);
    abort.abort(new DemoError(`interrupted by ${sig}`, 130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const progress = new Progress();
  const term = new TerminalReport();
  let ls: Lockstep | undefined;
  let sandbox: Sandbox | undefined;
  let email: EmailStub | undefined;
  /** Idempotent: called on success before the last line, and again (as a no-op) in finally. */
  const removeSandbox = async () => {
    const id = sandbox?.id;
    if (!ls || !id) return;
    sandbox = undefined;
    try {
      await ls.remove(id);
    } catch (e) {
      process.stderr.write(
        `lockstep demo: could not remove sandbox ${id}: ${(e as Error).message}\n  remove it with: LOCKSTEP_HOME=${args.home} lockstep rm ${id}\n`,
      );
    }
  };
  try {
    progress.update(`opening the state directory ${args.home}`);
    ls = await Lockstep.open({ home: args.home });
    await removeLeftovers(ls, progress);
    progress.update(`making sure the "${IMAGE}" image is there`);
    await ls.images.ensure(IMAGE, (msg: string) => progress.update(`image ${IMAGE}: ${msg}`));
    abort.signal.throwIfAborted();
    progress.update('creating the sandbox');
    sandbox = await ls.create({ image: IMAGE, metadata: { createdBy: DEMO_TAG } });
    email = await startEmailStub();
    progress.done();

    term.intro({ sandboxId: sandbox.id, home: args.home, image: IMAGE, format: 'anthropic', task: TASK });
    term.stepHeader('Attempt 1: twelve steps, a checkpoint after each');
    const sb = sandbox;
    const scenario = new Scenario(sb, email, abort.signal, {
      onStep: (s) => {
        if (s.turn.attempt > 1 && s.turn.step === 7)
          term.stepHeader('Attempt 2: the agent retries from the context Lockstep handed back');
        term.step(s);
      },
      onRollback: (partial) => term.rollback(partial, facts(partial)),
    });
    const run = await scenario.run();
    const f = facts(run);
    const tree = drawTree(sb.core.engine, sb.core.row(), { color: useColor() });
    let html: string | undefined;
    if (args.html) {
      fs.writeFileSync(
        args.html,
        renderHtml(run, f, { tree: drawTree(sb.core.engine, sb.core.row()), home: args.home, format: 'anthropic' }),
      );
      html = args.html;
    }
    term.finish(run, f, tree);
    await removeSandbox();
    term.line();
    term.line(
      `${term.green('✓')} Demo finished in ${((performance.now() - started) / 1000).toFixed(1)} s; sandbox ${sb.id} removed.${html ? ` HTML report: ${html}` : ''}`,
    );
    return 0;
  } finally {
    progress.done();
    await email?.close();
    await removeSandbox();
    await ls?.close();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** Removes sandboxes an earlier demo run left behind when it was killed outright. */
async function removeLeftovers(ls: Lockstep, progress: Progress): Promise<void> {
  for (const s of ls.list()) {
    if (s.metadata.createdBy !== DEMO_TAG) continue;
    progress.update(`removing sandbox ${s.id}, left behind by an interrupted demo`);
    await ls.remove(s.id).catch(() => undefined);
  }
}

/** A failure the demo explains itself. */
class DemoError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
  }
}

function hint(e: unknown): string {
  if (!(e instanceof LockstepError)) return '';
  if (e.code === 'NATIVE_NOT_BUILT' || e.code.startsWith('CRIU_') || e.code.startsWith('HOST'))
    return '\n  Run `npm run setup` (or `lockstep doctor`) to check the host.';
  if (e.code === 'HOME_LOCKED')
    return '\n  Another Lockstep manager holds that state directory; pass --home DIR to use another.';
  return '';
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    // Once interrupted, whatever the interrupted call threw is reported as the interruption.
    const err = abort.signal.aborted ? (abort.signal.reason as DemoError) : e;
    const msg = err instanceof Error ? err.message : String(err);
    process.stderr.write(`lockstep demo failed: ${msg}${hint(err)}\n`);
    if (process.env.LOCKSTEP_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
    process.exitCode = err instanceof DemoError ? err.exitCode : exitCodeFor(err) || 1;
  },
);
