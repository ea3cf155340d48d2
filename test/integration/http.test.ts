/**
 * The HTTP API end to end: a real server on loopback, real sandboxes, the
 * flows an agent platform's SDK goes through.
 */
import test from 'ava';
import fs from 'node:fs';
import { createHash } from 'node:crypto';
import pino from 'pino';
import { integration, openTestLockstep, eventually } from '../helpers/harness.js';
import { ndjson, sse, startServer, tenantToken } from '../fixtures/http-client.js';

const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

integration(test, () => {
  test.serial(
    'create → run → write/read files → checkpoint with context → rollback report → fork → delete',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'acme'));

      const created = await api.post('/v1/sandboxes', {
        memoryMb: 128,
        envs: { GREETING: 'hello' },
        metadata: { run: 'flow' },
      });
      t.is(created.status, 201, created.text);
      const id: string = created.body.id;
      t.is(created.body.state, 'running');
      t.is(created.body.tenant, 'acme');
      t.is(created.body.memoryMb, 128);
      t.deepEqual(created.body.metadata, { run: 'flow' });
      t.regex(created.headers.get('x-request-id') ?? '', /^req_/);
      const got = await api.get(`/v1/sandboxes/${id}`);
      t.deepEqual(got.body.id, id);
      const listed = await api.get('/v1/sandboxes');
      t.deepEqual(
        listed.body.map((s: { id: string }) => s.id),
        [id],
      );
      // The init's host pid names a process of the host: the library (the
      // operator) has it, no tenant answer shows it.
      t.true(Number.isInteger(ls.get(id).info().pid));
      for (const [what, body] of [
        ['create', created.body],
        ['get', got.body],
        ['list', listed.body[0]],
      ])
        t.false('pid' in body, `${what} shows no host pid`);

      const run = await api.post(`/v1/sandboxes/${id}/commands`, {
        cmd: 'echo $GREETING; echo oops >&2; exit 3',
        toolCallId: 'call_1',
      });
      t.is(run.status, 200, run.text);
      t.like(run.body, { exitCode: 3, stdout: 'hello\n', stderr: 'oops\n', truncated: false });
      t.regex(run.body.observationId, /^obs_/);
      const argv = await api.post(`/v1/sandboxes/${id}/commands`, {
        cmd: ['sh', '-c', 'pwd; echo "$X"'],
        cwd: '/tmp',
        envs: { X: 'from envs' },
      });
      t.is(argv.body.stdout, '/tmp\nfrom envs\n');

      // Files: JSON utf8, JSON base64, raw bytes; reads as JSON and as raw bytes.
      const w1 = await api.put(`/v1/sandboxes/${id}/files?path=/workspace/notes.txt`, { content: 'version 1\n' });
      t.is(w1.status, 200, w1.text);
      t.like(w1.body, { path: '/workspace/notes.txt', bytes: 10, sha256: sha256('version 1\n') });
      const bin = Buffer.from([0, 1, 2, 253, 254, 255]);
      t.is(
        (
          await api.put(`/v1/sandboxes/${id}/files?path=data/blob.bin`, bin, {
            raw: true,
            headers: { 'content-type': 'application/octet-stream' },
          })
        ).status,
        200,
      );
      t.is(
        (
          await api.put(`/v1/sandboxes/${id}/files?path=/workspace/b64.txt`, {
            content: Buffer.from('via base64').toString('base64'),
            encoding: 'base64',
            mode: 0o600,
          })
        ).status,
        200,
      );
      const r1 = await api.get(`/v1/sandboxes/${id}/files?path=/workspace/notes.txt`);
      t.like(r1.body, { content: 'version 1\n', encoding: 'utf8', sha256: sha256('version 1\n'), bytes: 10 });
      t.regex(r1.body.observationId, /^obs_/);
      const rb = await api.get(`/v1/sandboxes/${id}/files?path=/workspace/data/blob.bin`);
      t.is(rb.body.encoding, 'base64');
      t.deepEqual(Buffer.from(rb.body.content, 'base64'), bin);
      const raw = await fetch(`${client.base}/v1/sandboxes/${id}/files?path=data/blob.bin`, {
        headers: { authorization: `Bearer ${api.token}`, accept: 'application/octet-stream' },
      });
      t.deepEqual(Buffer.from(await raw.arrayBuffer()), bin);
      t.is(raw.headers.get('x-lockstep-sha256'), sha256(bin));
      t.is(
        (
          await api.post(`/v1/sandboxes/${id}/commands`, {
            cmd: 'cat /workspace/b64.txt; echo; stat -c %a /workspace/b64.txt',
          })
        ).body.stdout,
        'via base64\n600\n',
      );
      const list = await api.get(`/v1/sandboxes/${id}/files/list?path=/workspace`);
      t.deepEqual(
        list.body.entries.map((e: { name: string; type: string }) => `${e.name}:${e.type}`),
        ['b64.txt:file', 'data:directory', 'notes.txt:file'],
      );
      t.deepEqual((await api.get(`/v1/sandboxes/${id}/files/exists?path=/workspace/notes.txt`)).body, {
        path: '/workspace/notes.txt',
        exists: true,
      });

      // Checkpoint with the agent's context.
      const context = {
        format: 'openai-chat',
        messages: [
          { role: 'system', content: 'You fix bugs.' },
          { role: 'user', content: 'Fix the notes.' },
        ],
      };
      const ck = await api.post(`/v1/sandboxes/${id}/checkpoints`, { label: 'before edit', context });
      t.is(ck.status, 201, ck.text);
      t.regex(ck.body.id, /^ckpt_/);
      t.is(ck.body.label, 'before edit');
      t.truthy(ck.body.contextId);
      t.deepEqual((await api.get(`/v1/sandboxes/${id}/checkpoints/${ck.body.id}/context`)).body, {
        checkpointId: ck.body.id,
        context,
      });
      t.deepEqual(
        (await api.get(`/v1/sandboxes/${id}/checkpoints`)).body.map((c: { id: string }) => c.id),
        [ck.body.id],
      );

      // The abandoned attempt: a file changes, a new file appears, an effect happens.
      await api.put(`/v1/sandboxes/${id}/files?path=/workspace/notes.txt`, { content: 'version 2 (broken)\n' });
      await api.put(`/v1/sandboxes/${id}/files?path=/workspace/new.txt`, { content: 'new' });
      const seen = await api.post(`/v1/sandboxes/${id}/commands`, {
        cmd: 'cat /workspace/notes.txt',
        toolCallId: 'call_2',
      });
      const eff = await api.post(`/v1/sandboxes/${id}/effects`, {
        kind: 'email.send',
        input: { to: 'ops@example.com' },
        reversibility: 'irreversible',
        key: 'mail-1',
      });
      t.is(eff.status, 201, eff.text);
      const committed = await api.post(`/v1/sandboxes/${id}/effects/${eff.body.effectId}/commit`, {
        output: { messageId: 'm-1' },
      });
      t.like(committed.body, { id: eff.body.effectId, status: 'committed', output: { messageId: 'm-1' } });

      const report = await api.post(`/v1/sandboxes/${id}/rollback`, {
        checkpointId: ck.body.id,
        failure: 'The edit broke the notes',
        lessons: ['notes.txt must end with a newline'],
      });
      t.is(report.status, 200, report.text);
      t.is(report.body.checkpointId, ck.body.id);
      t.deepEqual(report.body.context, context);
      t.true(report.body.staleObservations.some((o: { id: string }) => o.id === seen.body.observationId));
      t.deepEqual(
        report.body.effectsAfter.map((e: { id: string }) => e.id),
        [eff.body.effectId],
      );
      t.true(report.body.warnings.some((w: { effectId: string }) => w.effectId === eff.body.effectId));
      t.true(report.body.recoverySummary.text.includes('The edit broke the notes'));
      const lastNote = report.body.contextWithRecovery.messages.at(-1);
      t.true(JSON.stringify(lastNote).includes('notes.txt must end with a newline'));

      // Files are back as they were at the checkpoint.
      t.is((await api.get(`/v1/sandboxes/${id}/files?path=/workspace/notes.txt`)).body.content, 'version 1\n');
      const gone = await api.get(`/v1/sandboxes/${id}/files?path=/workspace/new.txt`);
      t.is(gone.status, 404);
      t.is(gone.body.error.code, 'FILE_NOT_FOUND');
      const stale = await api.get(`/v1/sandboxes/${id}/observations?includeStale=true`);
      t.true(
        stale.body.some(
          (o: { id: string; staleAt: number | null }) => o.id === seen.body.observationId && o.staleAt !== null,
        ),
      );
      t.false(
        (await api.get(`/v1/sandboxes/${id}/observations`)).body.some(
          (o: { id: string }) => o.id === seen.body.observationId,
        ),
      );

      // Without the recovery summary.
      const bare = await api.post(`/v1/sandboxes/${id}/rollback`, {
        checkpointId: ck.body.id,
        withRecoverySummary: false,
      });
      t.is(bare.status, 200, bare.text);
      t.false('recoverySummary' in bare.body);
      t.false('contextWithRecovery' in bare.body);
      t.deepEqual(bare.body.context, context);

      // Fork: two sandboxes with the checkpoint's files, owned by the same tenant.
      const fork = await api.post(`/v1/sandboxes/${id}/fork`, { checkpointId: ck.body.id, count: 2 });
      t.is(fork.status, 200, fork.text);
      t.is(fork.body.ids.length, 2);
      t.deepEqual(fork.body.errors, []);
      for (const f of fork.body.ids) {
        const info = await api.get(`/v1/sandboxes/${f}`);
        t.like(info.body, { tenant: 'acme', forkedFrom: ck.body.id, state: 'running' });
        t.is(
          (await api.post(`/v1/sandboxes/${f}/commands`, { cmd: 'cat /workspace/notes.txt' })).body.stdout,
          'version 1\n',
        );
      }
      t.is((await api.get('/v1/sandboxes')).body.length, 3);

      // Delete a checkpoint, the forks and the sandbox.
      t.deepEqual((await api.del(`/v1/sandboxes/${id}/checkpoints/${ck.body.id}`)).body, {
        id: ck.body.id,
        deleted: true,
      });
      t.deepEqual((await api.get(`/v1/sandboxes/${id}/checkpoints`)).body, []);
      for (const s of [...fork.body.ids, id])
        t.deepEqual((await api.del(`/v1/sandboxes/${s}`)).body, { id: s, removed: true });
      const after = await api.get(`/v1/sandboxes/${id}`);
      t.is(after.status, 404);
      t.is(after.body.error.code, 'SANDBOX_NOT_FOUND');
      t.deepEqual((await api.get('/v1/sandboxes')).body, []);
      t.deepEqual(ls.list(), []);
    },
  );

  test.serial(
    'a fork of 3 whose second child fails answers each result in order, the failure in its slot',
    async (t) => {
      // The second child's restore fails (the fault hook throws at its start, as a failed restore would).
      let forkBegins = 0;
      const ls = await openTestLockstep(t, {
        open: {
          fault: (point) => {
            if (point === 'fork:begin' && ++forkBegins === 2) throw new Error('injected: restore failed');
          },
        },
      });
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'acme'));
      const created = await api.post('/v1/sandboxes', { memoryMb: 64 });
      t.is(created.status, 201, created.text);
      const id: string = created.body.id;
      const ck = await api.post(`/v1/sandboxes/${id}/checkpoints`, {});
      t.is(ck.status, 201, ck.text);

      const fork = await api.post(`/v1/sandboxes/${id}/fork`, { checkpointId: ck.body.id, count: 3 });
      t.is(fork.status, 200, fork.text);
      const results: Array<{ id?: string; ms?: number; error?: Record<string, unknown> }> = fork.body.results;
      t.is(results.length, 3);
      for (const i of [0, 2]) {
        t.regex(results[i]!.id ?? '', /^sbx_/);
        t.true(Number.isInteger(results[i]!.ms));
        t.false('pid' in results[i]!, 'no host pid on the wire');
      }
      // An internal failure: its code and status, the details stay in the server log.
      t.deepEqual(results[1], {
        error: { code: 'FORK_FAILED', message: 'Internal error; the server log has the details', status: 500 },
      });
      // The older lists stay for existing callers.
      t.deepEqual(fork.body.ids, [results[0]!.id, results[2]!.id]);
      t.deepEqual(fork.body.errors, [
        { code: 'FORK_FAILED', message: 'Internal error; the server log has the details' },
      ]);
      t.deepEqual(
        (await api.get('/v1/sandboxes')).body.map((s: { id: string }) => s.id).sort(),
        [id, results[0]!.id, results[2]!.id].sort(),
      );
    },
  );

  test.serial('GET /v1/sandboxes?metadata.KEY=VALUE lists only the sandboxes with every label named', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const make = async (metadata: Record<string, string>) => {
      const r = await api.post('/v1/sandboxes', { memoryMb: 64, metadata });
      t.is(r.status, 201, r.text);
      return r.body.id as string;
    };
    const a = await make({ team: 'a', env: 'prod' });
    const b = await make({ team: 'b', env: 'prod' });
    const ids = async (query: string) => {
      const r = await api.get(`/v1/sandboxes${query}`);
      t.is(r.status, 200, r.text);
      return r.body.map((s: { id: string }) => s.id);
    };
    t.deepEqual(await ids('?metadata.team=b'), [b]);
    t.deepEqual(await ids('?metadata.env=prod'), [a, b]);
    t.deepEqual(await ids('?metadata.env=prod&metadata.team=a'), [a]);
    t.deepEqual(await ids('?metadata.team=c'), []);
    t.deepEqual(await ids(`?metadata.${encodeURIComponent('odd "key".x')}=b`), []);

    // A label asked for twice, or an unknown parameter: INVALID_ARGUMENT naming it.
    const twice = await api.get('/v1/sandboxes?metadata.team=a&metadata.team=b');
    t.is(twice.status, 400, twice.text);
    t.like(twice.body.error, { code: 'INVALID_ARGUMENT', field: 'metadata.team' });
    const unknown = await api.get('/v1/sandboxes?team=a');
    t.is(unknown.status, 400, unknown.text);
    t.like(unknown.body.error, { code: 'INVALID_ARGUMENT', field: 'team' });
  });

  test.serial('commands stream stdout/stderr chunks as they come, as NDJSON and as server-sent events', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;

    // The command prints "first", then waits until the test has seen that
    // chunk (and answered by creating a file) before printing "second":
    // this passes only if chunks are streamed as they come.
    const res = await fetch(`${client.base}/v1/sandboxes/${id}/commands`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${api.token}`,
        'content-type': 'application/json',
        accept: 'application/x-ndjson',
      },
      body: JSON.stringify({
        cmd: 'echo first; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo second; echo warn >&2; exit 4',
      }),
    });
    t.is(res.status, 200);
    t.regex(res.headers.get('content-type') ?? '', /application\/x-ndjson/);
    const reader = res.body!.getReader();
    let text = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      if (text.includes('first') && !text.includes('second'))
        await api.put(`/v1/sandboxes/${id}/files?path=/workspace/go`, { content: '' });
    }
    const events = ndjson(text);
    t.deepEqual(events[0], { type: 'stdout', data: 'first\n' });
    t.is(
      events
        .filter((e) => e.type === 'stdout')
        .map((e) => e.data)
        .join(''),
      'first\nsecond\n',
    );
    t.is(
      events
        .filter((e) => e.type === 'stderr')
        .map((e) => e.data)
        .join(''),
      'warn\n',
    );
    const result = events.at(-1)!;
    t.like(result, { type: 'result', exitCode: 4, truncated: false });
    t.regex(result.observationId, /^obs_/);
    t.false('stdout' in result);

    const s = await api.post(
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'echo one; echo two >&2' },
      { headers: { accept: 'text/event-stream' } },
    );
    t.regex(s.headers.get('content-type') ?? '', /text\/event-stream/);
    const ev = sse(s.text);
    t.deepEqual(
      ev.filter((e) => e.event !== 'result'),
      [
        { event: 'stdout', data: { data: 'one\n' } },
        { event: 'stderr', data: { data: 'two\n' } },
      ],
    );
    t.like(ev.at(-1), { event: 'result', data: { exitCode: 0 } });

    // An error after the stream started arrives as the last event.
    const slow = await api.post(
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'echo started; sleep 30', timeoutMs: 300 },
      { headers: { accept: 'application/x-ndjson' } },
    );
    const slowEvents = ndjson(slow.text);
    t.deepEqual(slowEvents[0], { type: 'stdout', data: 'started\n' });
    t.like(slowEvents.at(-1), { type: 'error', error: { code: 'COMMAND_TIMEOUT' } });
  });

  test.serial('background commands: start, wait for the exit code, kill', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;

    const bg = await api.post(`/v1/sandboxes/${id}/commands`, {
      cmd: 'sleep 0.3; echo done > /workspace/bg.txt; exit 7',
      background: true,
    });
    t.is(bg.status, 200, bg.text);
    t.true(Number.isInteger(bg.body.pid));
    const waited = await api.post(`/v1/sandboxes/${id}/commands/${bg.body.pid}/wait`, { timeoutMs: 10_000 });
    t.deepEqual(waited.body, { pid: bg.body.pid, exitCode: 7 });
    t.is((await api.get(`/v1/sandboxes/${id}/files?path=bg.txt`)).body.content, 'done\n');

    const long = await api.post(`/v1/sandboxes/${id}/commands`, { cmd: ['sleep', '600'], background: true });
    t.deepEqual((await api.post(`/v1/sandboxes/${id}/commands/${long.body.pid}/kill`, {})).body, {
      pid: long.body.pid,
      killed: true,
    });
    t.is(
      (await api.post(`/v1/sandboxes/${id}/commands/${long.body.pid}/wait`, { timeoutMs: 10_000 })).body.exitCode,
      null,
    );
    // (CommandHandle.kill signals the /bin/sh wrapper, not its child: the
    // sleep itself survives; reported to the library's owner.)
  });

  test.serial('effects, verdicts and observations', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;

    const spec = {
      kind: 'payment.charge',
      input: { amount: 5 },
      reversibility: 'compensable',
      key: 'order-1',
      compensation: { kind: 'payment.refund', input: { amount: 5 } },
    };
    const b1 = await api.post(`/v1/sandboxes/${id}/effects`, spec);
    t.is(b1.status, 201);
    t.false(b1.body.replayed);
    const unknown = await api.post(`/v1/sandboxes/${id}/effects`, spec);
    t.is(unknown.status, 409);
    t.is(unknown.body.error.code, 'EFFECT_OUTCOME_UNKNOWN');
    await api.post(`/v1/sandboxes/${id}/effects/${b1.body.effectId}/commit`, { output: { chargeId: 'ch_1' } });
    const replay = await api.post(`/v1/sandboxes/${id}/effects`, spec);
    t.is(replay.status, 200);
    t.deepEqual(replay.body, {
      replayed: true,
      effectId: b1.body.effectId,
      idempotencyKey: b1.body.idempotencyKey,
      output: { chargeId: 'ch_1' },
    });
    const again = await api.post(`/v1/sandboxes/${id}/effects/${b1.body.effectId}/commit`, {});
    t.is(again.status, 409);
    t.is(again.body.error.code, 'EFFECT_ALREADY_SETTLED');

    const b2 = await api.post(`/v1/sandboxes/${id}/effects`, {
      kind: 'api.call',
      input: 1,
      reversibility: 'irreversible',
    });
    const failed = await api.post(`/v1/sandboxes/${id}/effects/${b2.body.effectId}/fail`, {
      error: { message: 'timeout', code: 'ETIMEDOUT' },
      definite: false,
    });
    t.like(failed.body, { status: 'unknown', error: { message: 'timeout', code: 'ETIMEDOUT' } });
    const resolved = await api.post(`/v1/sandboxes/${id}/effects/${b2.body.effectId}/resolve`, { outcome: 'failed' });
    t.like(resolved.body, { status: 'failed', definite: true });
    t.deepEqual(
      (await api.get(`/v1/sandboxes/${id}/effects`)).body.map((e: { id: string; status: string }) => [e.id, e.status]),
      [
        [b1.body.effectId, 'committed'],
        [b2.body.effectId, 'failed'],
      ],
    );
    t.is((await api.get(`/v1/sandboxes/${id}/effects/${b2.body.effectId}`)).body.id, b2.body.effectId);

    await api.put(`/v1/sandboxes/${id}/files?path=src.py`, { content: 'print(1)\n' });
    const v = await api.post(`/v1/sandboxes/${id}/verdicts`, {
      path: 'src.py',
      verdict: 'lint passed',
      toolCallId: 'call_9',
    });
    t.is(v.status, 201, v.text);
    t.is(v.body.verdict, 'lint passed');
    t.deepEqual((await api.get(`/v1/sandboxes/${id}/verdicts?stale=true`)).body, []);
    await api.put(`/v1/sandboxes/${id}/files?path=src.py`, { content: 'print(2)\n' });
    t.deepEqual(
      (await api.get(`/v1/sandboxes/${id}/verdicts?stale=true`)).body.map((x: { id: string }) => x.id),
      [v.body.id],
    );
    const writes = (await api.get(`/v1/sandboxes/${id}/observations`)).body.filter(
      (o: { kind: string }) => o.kind === 'file-write',
    );
    t.deepEqual(
      writes.map((o: { subject: string }) => o.subject),
      ['src.py', 'src.py'],
    );
  });

  test.serial('metrics expose checkpoint, rollback and fork latency histograms and request counters', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const ck = await api.post(`/v1/sandboxes/${id}/checkpoints`, {});
    await api.post(`/v1/sandboxes/${id}/rollback`, { checkpointId: ck.body.id });
    const fork = await api.post(`/v1/sandboxes/${id}/fork`, { checkpointId: ck.body.id });
    await api.post(`/v1/sandboxes/${id}/rollback`, { checkpointId: 'ckpt_missing' });

    const m = await client.get('/metrics');
    t.is(m.status, 200);
    const sample = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(m.text)?.[1]);
    t.is(sample('lockstep_checkpoint_duration_seconds_count\\{outcome="ok"\\}'), 1);
    t.true(sample('lockstep_checkpoint_duration_seconds_sum\\{outcome="ok"\\}') > 0);
    t.is(sample('lockstep_rollback_duration_seconds_count\\{outcome="ok"\\}'), 1);
    t.is(sample('lockstep_rollback_duration_seconds_count\\{outcome="CHECKPOINT_NOT_FOUND"\\}'), 1);
    t.is(sample('lockstep_fork_duration_seconds_count\\{outcome="ok"\\}'), 1);
    t.regex(m.text, /lockstep_checkpoint_duration_seconds_bucket\{le="\+Inf",outcome="ok"\} 1/);
    t.is(
      sample('lockstep_http_requests_total\\{method="POST",route="/v1/sandboxes/:id/checkpoints",status_code="201"\\}'),
      1,
    );
    t.is(
      sample('lockstep_http_requests_total\\{method="POST",route="/v1/sandboxes/:id/rollback",status_code="404"\\}'),
      1,
    );
    t.is(sample('lockstep_sandboxes\\{state="running"\\}'), 1 + fork.body.ids.length);
  });

  test.serial('request logs are structured and bound to the request id, tenant and sandbox', async (t) => {
    const ls = await openTestLockstep(t);
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
    );
    const { client } = await startServer(t, ls, { logger });
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const ck = await api.post(`/v1/sandboxes/${id}/checkpoints`, {}, { headers: { 'x-request-id': 'trace-42' } });
    t.is(ck.headers.get('x-request-id'), 'trace-42');
    const forged = await api.get('/v1/sandboxes', { headers: { 'x-request-id': 'bad id {"level":60}' } });
    t.regex(
      forged.headers.get('x-request-id') ?? '',
      /^req_[0-9a-f]{16}$/,
      'a request id that is not a plain token is replaced',
    );
    // One line per request, with everything about it (no separate "incoming request" line).
    const mine = lines.filter(
      (l) =>
        l.reqId === 'trace-42' &&
        (l.msg === 'request' || l.msg === 'incoming request' || l.msg === 'request completed'),
    );
    t.is(mine.length, 1);
    t.like(mine[0], {
      msg: 'request',
      tenant: 'acme',
      sandboxId: id,
      method: 'POST',
      route: '/v1/sandboxes/:id/checkpoints',
      status: 201,
    });
    t.is(typeof mine[0]!.durationMs, 'number');
    t.like(
      lines.find((l) => l.msg === 'checkpoint taken'),
      { reqId: 'trace-42', tenant: 'acme', sandboxId: id, checkpointId: ck.body.id },
    );
    t.false(JSON.stringify(lines).includes(api.token!), 'tokens are never logged');
  });

  test.serial('/metrics can require a token of its own', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls, { metricsToken: 'scrape-secret' });
    t.is((await client.get('/metrics')).status, 401);
    t.is((await client.as(tenantToken(ls, 'acme')).get('/metrics')).status, 401);
    const ok = await client.as('scrape-secret').get('/metrics');
    t.is(ok.status, 200);
    t.regex(ok.text, /# TYPE lockstep_checkpoint_duration_seconds histogram/);
  });

  test.serial('/openapi.json describes every route; /docs serves Swagger UI from the package, no CDN', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const doc = (await client.get('/openapi.json')).body;
    t.is(doc.openapi, '3.0.3');
    t.deepEqual(doc.components.securitySchemes.bearerAuth, { type: 'http', scheme: 'bearer' });
    for (const [path, methods] of [
      ['/v1/sandboxes', ['get', 'post']],
      ['/v1/sandboxes/{id}', ['get', 'delete']],
      ['/v1/sandboxes/{id}/commands', ['post']],
      ['/v1/sandboxes/{id}/files', ['get', 'put', 'delete']],
      ['/v1/sandboxes/{id}/files/list', ['get']],
      ['/v1/sandboxes/{id}/checkpoints', ['get', 'post']],
      ['/v1/sandboxes/{id}/checkpoints/{ckpt}/context', ['get']],
      ['/v1/sandboxes/{id}/checkpoints/{ckpt}', ['delete']],
      ['/v1/sandboxes/{id}/rollback', ['post']],
      ['/v1/sandboxes/{id}/fork', ['post']],
      ['/v1/sandboxes/{id}/effects', ['get', 'post']],
      ['/v1/sandboxes/{id}/effects/{effectId}/commit', ['post']],
      ['/v1/sandboxes/{id}/effects/{effectId}/fail', ['post']],
      ['/v1/sandboxes/{id}/observations', ['get']],
      ['/v1/sandboxes/{id}/verdicts', ['get', 'post']],
      ['/v1/images', ['get']],
    ] as const) {
      for (const m of methods) t.truthy(doc.paths[path]?.[m], `${m.toUpperCase()} ${path} is documented`);
    }
    t.deepEqual(
      doc.paths['/v1/sandboxes'].post.requestBody.content['application/json'].schema.properties.memoryMb.minimum,
      16,
    );
    t.truthy(doc.paths['/v1/sandboxes/{id}/files'].put.requestBody.content['application/octet-stream']);

    const page = await fetch(`${client.base}/docs/`);
    t.is(page.status, 200);
    const html = await page.text();
    t.regex(html, /swagger-ui/);
    t.notRegex(html, /(src|href)="(https?:)?\/\//, 'no asset comes from another host');
    const assets = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
    t.true(assets.some((a) => a.endsWith('swagger-ui-bundle.js')));
    for (const a of assets) t.is((await fetch(new URL(a, `${client.base}/docs/`))).status, 200, a);
    const init = await (await fetch(`${client.base}/docs/static/swagger-initializer.js`)).text();
    t.regex(init, /url: resolveUrl\('\.\/json'\)/, 'the initializer loads the spec from this server');
    const code = init.replace(/\/\/ .*$/gm, ''); // comments may cite web pages
    t.notRegex(
      code,
      /https?:\/\/(?!www\.w3\.org\/)/,
      'and nothing from elsewhere (the only URLs left are SVG namespaces)',
    );
  });

  test.serial('a checkpoint context may pass the 1 MiB JSON limit (up to 16 MiB), and comes back whole', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls);
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64 })).body.id;
    const big = 'tool output line\n'.repeat(200_000); // ~3.4 MB
    const messages = [
      { role: 'user', content: 'Run the tests.' },
      { role: 'assistant', content: big },
    ];
    const ck = await api.post(`/v1/sandboxes/${id}/checkpoints`, { context: messages, contextFormat: 'ai-sdk' });
    t.is(ck.status, 201, ck.text.slice(0, 300));
    const back = await api.get(`/v1/sandboxes/${id}/checkpoints/${ck.body.id}/context`);
    t.deepEqual(back.body.context, { format: 'ai-sdk', messages });
    const tooBigRun = await api.post(`/v1/sandboxes/${id}/commands`, {
      cmd: 'true',
      envs: { BIG: 'x'.repeat(1024 * 1024) },
    });
    t.is(tooBigRun.status, 413, 'other routes keep the 1 MiB limit');
  });

  test.serial('expired sandboxes are swept while the server runs', async (t) => {
    const ls = await openTestLockstep(t);
    const { client } = await startServer(t, ls, { sweepIntervalMs: 200 });
    const api = client.as(tenantToken(ls, 'acme'));
    const id = (await api.post('/v1/sandboxes', { memoryMb: 64, timeoutMs: 1000 })).body.id;
    t.is((await api.get(`/v1/sandboxes/${id}`)).status, 200);
    await eventually(async () => (await api.get(`/v1/sandboxes/${id}`)).status === 404, 10_000, 100);
    // 404 already while it is being removed; then the row and its run folder go.
    await eventually(() => ls.engine.catalog.sandbox(id) === undefined, 10_000, 50);
    t.false(fs.existsSync(ls.engine.paths.sandboxRun(id)));
  });
});
