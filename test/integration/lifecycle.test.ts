import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';

integration(test, () => {
  test.serial('create, exec and remove a sandbox', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create({ image: 'base' });
    const r = await sb.commands.run(['sh', '-c', 'echo out; echo err >&2; exit 3']);
    t.is(r.exitCode, 3);
    t.is(r.stdout, 'out\n');
    t.is(r.stderr, 'err\n');
    const env = await sb.commands.run('echo $FOO; pwd', { env: { FOO: 'bar' }, cwd: '/tmp' });
    t.is(env.stdout, 'bar\n/tmp\n');
    await ls.remove(sb.id);
    t.deepEqual(ls.list(), []);
  });
});
