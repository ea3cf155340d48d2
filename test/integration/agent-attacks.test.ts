/**
 * The three attacks on a rolled-back agent, on real sandboxes, with the
 * outside world played by a real HTTP stub on 127.0.0.1 that counts calls:
 * (a) the malware verdict that outlives the bytes it was about,
 * (b) repeated mail forwarding, (c) double payment, also across forks.
 */
import { createHash } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import type { EffectScope } from '../../src/effects/idempotency.js';
import type { Lockstep, Sandbox } from '../../src/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startStub, type StubServer } from '../fixtures/stub-http.js';

const sha256 = (b: string | Buffer) => createHash('sha256').update(b).digest('hex');
// The EICAR test string: every scanner flags it, and it harms nothing.
const EICAR = 'X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*';

integration(test, () => {
  let ls: Lockstep;
  let stub: StubServer;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep({ teardown: (fn: () => Promise<void>) => teardowns.push(fn) }, { images: ['base'] });
    stub = await startStub();
  });
  test.after.always(async () => {
    await stub?.close();
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext): Promise<Sandbox> {
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  test.serial(
    '(a) malware verdict: a "clean" scan is reported stale when a rollback brings the infected bytes back',
    async (t) => {
      const sb = await sandbox(t);
      const file = '/workspace/dl/tool.bin';
      const infected = Buffer.from(`#!/bin/sh\necho installing\n# ${EICAR}\n`);
      const cleaned = Buffer.from('#!/bin/sh\necho installing\n');
      const c0 = await sb.checkpoint({ label: 'before download' });
      await sb.files.write(file, infected, { toolCallId: 'call-download' });
      const downloaded = await sb.checkpoint({ label: 'downloaded' });
      // The cleanup step strips the payload; then the scan passes, on the cleaned bytes.
      await sb.files.write(file, cleaned, { toolCallId: 'call-cleanup' });
      const scan = await sb.verdicts.record({ path: file, verdict: 'malware-scan:clean', toolCallId: 'call-scan' });
      t.is(scan.contentHash, sha256(cleaned));
      t.deepEqual(await sb.verdicts.stale(), []);

      // A later step fails and the agent rolls back to before the cleanup.
      const report = await sb.rollback(downloaded.id, { failure: 'the installer step failed' });
      t.deepEqual((await sb.files.read(file)).content, infected, 'the infected variant is back');
      t.deepEqual(
        report.staleVerdicts.map((v) => ({
          id: v.id,
          path: v.path,
          verdict: v.verdict,
          contentHash: v.contentHash,
          currentHash: v.currentHash,
        })),
        [
          {
            id: scan.id,
            path: file,
            verdict: 'malware-scan:clean',
            contentHash: sha256(cleaned),
            currentHash: sha256(infected),
          },
        ],
      );
      t.deepEqual(
        report.recoverySummary.structured.staleVerdicts.map((v) => [v.path, v.verdict]),
        [[file, 'malware-scan:clean']],
      );
      t.true(
        report.recoverySummary.text.includes(
          `verdict "malware-scan:clean" on ${file} no longer applies: the file has different content now`,
        ),
        report.recoverySummary.text,
      );
      // Asked directly later on, the sandbox gives the same answer.
      t.deepEqual(
        (await sb.verdicts.stale()).map((v) => [v.id, v.currentHash]),
        [[scan.id, sha256(infected)]],
      );

      // Rolled back to before the download, the verdict is about a file that is not there. The
      // report told the agent at the first rollback, and neither the timeline it leaves now nor
      // the one it gets back holds the scan, so this report does not repeat it; the sandbox does.
      const gone = await sb.rollback(c0.id);
      t.deepEqual(gone.staleVerdicts, []);
      t.deepEqual(
        (await sb.verdicts.stale()).map((v) => [v.id, v.currentHash]),
        [[scan.id, null]],
      );
    },
  );

  /** The agent issuing an irreversible effect that calls the stub; same kind and input each time, a fresh tool-call id. */
  function effectCaller(
    sb: Sandbox,
    kind: string,
    route: string,
    input: Record<string, string | number>,
    scope?: EffectScope,
  ) {
    let ran = 0;
    const call = (toolCallId: string) =>
      sb.effects.run({ kind, input, reversibility: 'irreversible', toolCallId, ...(scope ? { scope } : {}) }, () => {
        ran++;
        return stub.post(route, input);
      });
    return { call, ran: () => ran };
  }

  const repeatedAfterRollback = test.macro({
    async exec(t, kind: string, route: string, input: Record<string, string | number>) {
      const sb = await sandbox(t);
      const calls0 = stub.count(route);
      const c0 = await sb.checkpoint({ label: 'before' });
      const agent = effectCaller(sb, kind, route, input);
      const first = await agent.call('call-1');
      t.is(stub.count(route), calls0 + 1);

      // Roll back past it three times; each time the agent re-issues the same action.
      for (let i = 2; i <= 4; i++) {
        const report = await sb.rollback(c0.id);
        // The context restored at c0 knows nothing of the effect, so every
        // rollback's note must tell the agent again that it happened.
        t.deepEqual(
          report.warnings.map((w) => [w.kind, w.reason]),
          [[kind, 'irreversible']],
          'the rollback cannot take the effect back',
        );
        t.regex(report.recoverySummary.text, new RegExp(`MUST NOT be repeated[\\s\\S]*${kind.replace('.', '\\.')}`));
        t.deepEqual(await agent.call(`call-${i}`), first, 'the replay returns the recorded output');
      }
      t.is(agent.ran(), 1);
      t.is(stub.count(route), calls0 + 1, 'the outside world saw exactly one call');
      t.deepEqual(
        sb.effects.list().map((e) => [e.kind, e.status, e.attempt, e.toolCallId]),
        [[kind, 'committed', 1, 'call-1']],
      );
    },
    title: (provided = '') => provided,
  });
  test.serial(
    '(b) repeated mail forwarding: rolled back and re-issued, the mail is forwarded once',
    repeatedAfterRollback,
    'mail.forward',
    '/mail/forward',
    {
      messageId: 'm-42',
      to: 'attacker@evil.example',
    },
  );
  test.serial(
    '(c) double payment: rolled back and re-issued, the payment is charged once',
    repeatedAfterRollback,
    'payment.charge',
    '/payments/charge',
    {
      invoice: 'INV-1',
      amount: 4200,
      currency: 'EUR',
      payee: 'acct-7',
    },
  );

  test.serial(
    '(c) double payment across forks: a lineage-scoped payment replays in every fork; a branch-scoped effect runs once per fork',
    async (t) => {
      const parent = await sandbox(t);
      const payRoute = '/payments/charge-fork';
      const notifyRoute = '/notify/progress';
      const pay = (sb: Sandbox) =>
        effectCaller(sb, 'payment.charge', payRoute, { invoice: 'INV-2', amount: 990, currency: 'EUR' });
      const notify = (sb: Sandbox) => effectCaller(sb, 'notify.progress', notifyRoute, { step: 'paid' }, 'branch');

      const paid = await pay(parent).call('call-pay');
      await notify(parent).call('call-notify');
      const ckpt = await parent.checkpoint({ label: 'paid' });
      t.is(stub.count(payRoute), 1);
      t.is(stub.count(notifyRoute), 1);

      const results = await parent.fork(ckpt.id, { count: 2 });
      t.true(
        results.every((r) => r.ok),
        JSON.stringify(results),
      );
      const forks = results.map((r) => ls.get((r as { id: string }).id));
      for (const f of forks) t.teardown(() => ls.remove(f.id).catch(() => undefined));

      for (const f of forks) {
        const payer = pay(f);
        t.deepEqual(await payer.call('call-pay-again'), paid, 'the fork gets the recorded charge');
        t.is(payer.ran(), 0);
        const notifier = notify(f);
        await notifier.call('call-notify-fork');
        await notifier.call('call-notify-fork-again');
        t.is(notifier.ran(), 1, 'a branch-scoped effect runs once on the fork’s own branch');
      }
      t.is(stub.count(payRoute), 1, 'one charge for the whole lineage');
      t.is(stub.count(notifyRoute), 1 + forks.length, 'one notification per branch');
    },
  );
});
