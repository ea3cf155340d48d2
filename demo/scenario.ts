/**
 * The seed-000 scenario on a real sandbox: a repository to release, twelve
 * steps with a checkpoint after each, a failure at step 11, a rollback to
 * step 6, and a retry from the context Lockstep hands back.
 *
 * The narrator (this file) looks at the sandbox through the unrecorded file
 * view: what it inspects to show the reader is not something the agent
 * observed, and must not turn up among the agent's stale observations.
 */
import type { AgentContext, CheckpointInfo, RollbackReport, Sandbox } from '../src/index.js';
import type { SandboxFiles } from '../src/instances/files.js';
import type { EmailStub } from './email-stub.js';
import { ScriptedAgent, TASK, type Decision, type Turn } from './scripted-agent.js';
import { runTool, type ToolOutcome } from './tools.js';

/** One step as it ran: the agent's turn, what the tool did, and the checkpoint taken after it. */
export interface StepRun {
  turn: Turn;
  outcome: ToolOutcome;
  checkpoint: CheckpointInfo;
}

/** The sandbox's world as the narrator sees it. */
export interface World {
  /** Files under /workspace, relative, directories with a trailing "/". */
  files: { path: string; bytes: number }[];
  /** What the background worker holds in memory (it writes it to /tmp/worker.state every 100 ms). */
  worker: string;
}

/** Everything the renderers show. */
export interface DemoRun {
  sandboxId: string;
  task: string;
  firstAttempt: StepRun[];
  retry: StepRun[];
  rollback: {
    decision: Extract<Decision, { kind: 'rollback' }>;
    from: StepRun;
    to: StepRun;
    report: RollbackReport;
    before: World;
    after: World;
    contextBefore: AgentContext;
  };
  final: World;
  finalThought: string;
  /** How many e-mails the stub received, in total. */
  deliveries: number;
}

export interface ScenarioHooks {
  onStep?(s: StepRun): void;
  onRollback?(r: Pick<DemoRun, 'rollback' | 'firstAttempt' | 'retry'>): void;
}

const README = `# billing v2.0 release

1. Start the release worker: \`sh bin/worker.sh\`. It loads /workspace/config.json
   into memory as soon as the file exists and serves that copy from then on.
2. Write /workspace/config.json with release, batch_size and rate_limit_rps.
   The last rollout used batch_size 500 and rate_limit_rps 50.
3. Tell QA (qa@example.com) that the rollout is starting.
4. Publish: \`sh bin/publish.sh\` writes one file per batch to out/.
`;

const WORKER = `#!/bin/sh
# The release worker: loads /workspace/config.json into memory once it exists,
# then serves what it holds by writing it to /tmp/worker.state every 100 ms.
# It never reads the file again: its copy lives in this shell's memory.
config=""
tick=0
while :; do
  tick=$((tick + 1))
  if [ -z "$config" ] && [ -f /workspace/config.json ]; then
    config=$(tr -d '\\n' < /workspace/config.json)
  fi
  if [ -n "$config" ]; then state="config loaded: $config"; else state="no config loaded"; fi
  echo "worker pid $$, tick $tick: $state" > /tmp/worker.state.new
  mv /tmp/worker.state.new /tmp/worker.state
  sleep 0.1
done
`;

// Stands in for a release API that allows 10 requests/s and answers 429 above
// that (after a few requests, as real limiters do): the scripted failure.
const PUBLISH = `#!/bin/sh
cd /workspace
total=$(wc -l < data/records.csv)
if [ ! -f config.json ]; then
  if [ "$1" = "--dry-run" ]; then echo "dry run: $total records ready; config.json not written yet"; exit 0; fi
  echo "publish: config.json is missing" >&2; exit 78
fi
batch=$(grep -o '"batch_size": *[0-9]*' config.json | grep -o '[0-9]*$')
rps=$(grep -o '"rate_limit_rps": *[0-9]*' config.json | grep -o '[0-9]*$')
batches=$(( (total + batch - 1) / batch ))
mkdir -p out
i=1
while [ $i -le $batches ]; do
  if [ "$rps" -gt 10 ] && [ $i -gt 3 ]; then
    echo "HTTP 429 Too Many Requests on batch $i/$batches: the release API allows at most 10 requests/s, config.json asks for $rps" >&2
    exit 75
  fi
  f=$(printf 'out/batch-%02d.csv' $i)
  sed -n "$(( (i - 1) * batch + 1 )),$(( i * batch ))p" data/records.csv > "$f"
  echo "batch $i/$batches published"
  i=$((i + 1))
done
echo "published $total records in $batches batches"
`;

const RECORDS =
  Array.from(
    { length: 5000 },
    (_, i) => `${i + 1},customer-${String((i * 7919) % 100_000).padStart(5, '0')},${((i * 37) % 9000) / 100 + 10}`,
  ).join('\n') + '\n';

/** Runs the scenario; the sandbox must be fresh. */
export class Scenario {
  private readonly raw: SandboxFiles;
  private readonly agent = new ScriptedAgent();

  constructor(
    private readonly sandbox: Sandbox,
    private readonly email: EmailStub,
    private readonly signal: AbortSignal,
    private readonly hooks: ScenarioHooks = {},
  ) {
    this.raw = sandbox.core.files();
  }

  async run(): Promise<DemoRun> {
    await this.seed();
    const first = await this.attempt();
    if (first.decision.kind !== 'rollback')
      throw new Error('the scripted agent was expected to fail at step 11 and ask for a rollback');
    const decision = first.decision;
    const from = first.steps.at(-1)!;
    const to = first.steps.find((s) => s.turn.step === decision.toStep);
    if (!to) throw new Error(`the agent asked to roll back to step ${decision.toStep}, which has no checkpoint`);
    const contextBefore = this.agent.context;
    const before = await this.world();

    this.signal.throwIfAborted();
    const report = await this.sandbox.rollback(to.checkpoint.id, {
      failure: decision.failure,
      lessons: decision.lessons,
    });
    // /tmp/worker.state came back with the layer; wait for the restored worker to write its memory out afresh.
    const restored = await this.workerState();
    await this.until((w) => w !== restored);
    const after = await this.world();
    const rollback = { decision, from, to, report, before, after, contextBefore };
    this.hooks.onRollback?.({ rollback, firstAttempt: first.steps, retry: [] });
    if (!report.contextWithRecovery) throw new Error('the rollback report has no context to continue from');

    this.agent.resume(report.contextWithRecovery);
    const second = await this.attempt();
    if (second.decision.kind !== 'done')
      throw new Error(`the retry did not finish: the agent asked for ${second.decision.kind}`);
    this.agent.finish(second.decision.thought);
    return {
      sandboxId: this.sandbox.id,
      task: TASK,
      firstAttempt: first.steps,
      retry: second.steps,
      rollback,
      final: await this.world(),
      finalThought: second.decision.thought,
      deliveries: this.email.deliveries.length,
    };
  }

  /** Steps until the agent stops calling tools. */
  private async attempt(): Promise<{ steps: StepRun[]; decision: Exclude<Decision, { kind: 'call' }> }> {
    const steps: StepRun[] = [];
    for (;;) {
      this.signal.throwIfAborted();
      const d = this.agent.next();
      if (d.kind !== 'call') return { steps, decision: d };
      const outcome = await runTool(this.sandbox, d.turn.call, { email: this.email, signal: this.signal });
      this.agent.record(d.turn, outcome);
      // Let the world settle before the checkpoint freezes it: the worker up, or holding the new config.
      if (d.turn.call.name === 'start_process') await this.until((w) => w !== undefined);
      if (d.turn.call.name === 'write_file' && d.turn.call.input.path === '/workspace/config.json')
        await this.until((w) => w?.includes('config loaded') === true);
      const checkpoint = await this.sandbox.checkpoint({
        label: d.turn.label,
        context: this.agent.context,
        signal: this.signal,
      });
      const s = { turn: d.turn, outcome, checkpoint };
      steps.push(s);
      this.hooks.onStep?.(s);
    }
  }

  /** The repository the agent is asked to release. */
  private async seed(): Promise<void> {
    await this.raw.write('/workspace/README.md', README);
    await this.raw.write('/workspace/bin/worker.sh', WORKER, { mode: 0o755 });
    await this.raw.write('/workspace/bin/publish.sh', PUBLISH, { mode: 0o755 });
    await this.raw.write('/workspace/data/records.csv', RECORDS);
  }

  private async world(): Promise<World> {
    const files: World['files'] = [];
    const walk = async (dir: string, rel: string) => {
      for (const e of await this.raw.list(dir)) {
        if (e.type === 'directory') {
          files.push({ path: `${rel}${e.name}/`, bytes: 0 });
          await walk(`${dir}/${e.name}`, `${rel}${e.name}/`);
        } else files.push({ path: `${rel}${e.name}`, bytes: e.size });
      }
    };
    await walk('/workspace', '');
    return { files, worker: (await this.workerState()) ?? '(no worker state)' };
  }

  private async workerState(): Promise<string | undefined> {
    return this.raw.read('/tmp/worker.state').then(
      (r) => r.content.toString('utf8').trim(),
      () => undefined,
    );
  }

  /** Polls the worker's state until pred holds; the worker writes it every 100 ms. */
  private async until(pred: (state: string | undefined) => boolean, timeoutMs = 5000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (pred(await this.workerState())) return;
      if (Date.now() > deadline)
        throw new Error(`the worker in the sandbox did not reach the expected state within ${timeoutMs} ms`);
      this.signal.throwIfAborted();
      await sleep(20);
    }
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
