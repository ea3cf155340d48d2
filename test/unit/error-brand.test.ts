/**
 * `instanceof` across copies of the package: a LockstepError made by a second
 * copy of src/errors.ts (loaded again under another URL, as two installs in
 * one process would be) is an instance of its own class and its parents here,
 * and of no unrelated class.
 */
import test from 'ava';
import {
  AlreadyExistsError,
  CommandAbortedError,
  InvalidArgumentError,
  InvalidStateError,
  ERROR_BRAND,
  LockstepError,
  NotFoundError,
} from '../../src/errors.js';
import { ConnectionError } from '../../src/errors-from-wire.js';

type ErrorsModule = typeof import('../../src/errors.js');
const copy = (await import(new URL('../../src/errors.js?copy', import.meta.url).href)) as ErrorsModule;

test('the second copy is a different module with its own classes', (t) => {
  t.not(copy.NotFoundError, NotFoundError);
  t.not(copy.LockstepError, LockstepError);
  t.is(copy.ERROR_BRAND, ERROR_BRAND);
});

test('an error from the other copy is an instance of its class and its parents, and of nothing else', (t) => {
  const nf = new copy.NotFoundError('sandbox', 'sbx_x');
  t.true(nf instanceof NotFoundError);
  t.true(nf instanceof LockstepError);
  t.true(nf instanceof Error);
  t.false(nf instanceof InvalidStateError);
  t.false(nf instanceof InvalidArgumentError);
  t.false(nf instanceof ConnectionError);

  const state = new copy.InvalidStateError('SANDBOX_BUSY', 'busy');
  t.true(state instanceof InvalidStateError);
  t.true(state instanceof LockstepError);
  t.false(state instanceof NotFoundError);
  t.false(state instanceof AlreadyExistsError);

  const base = new copy.LockstepError('INTERNAL', 'x');
  t.true(base instanceof LockstepError);
  t.false(base instanceof NotFoundError);
  t.false(base instanceof CommandAbortedError);
});

test("the other way round: this copy's errors are instances of the other copy's classes", (t) => {
  const e = new CommandAbortedError('COMMAND_TIMEOUT', 'too slow');
  t.true(e instanceof copy.CommandAbortedError);
  t.true(e instanceof copy.LockstepError);
  t.false(e instanceof copy.InvalidStateError);
  // A subclass defined outside errors.ts carries its name in the brand too.
  const c = new ConnectionError('down');
  t.deepEqual([...c[ERROR_BRAND]], ['ConnectionError', 'LockstepError']);
  t.true(c instanceof copy.LockstepError);
  t.false(c instanceof copy.NotFoundError);
});

test('a plain object carrying the brand is an instance of the classes it names; without it, of none', (t) => {
  const branded = {
    [Symbol.for('lockstep.error')]: ['InvalidArgumentError', 'LockstepError'],
    code: 'INVALID_ARGUMENT',
  };
  t.true(branded instanceof InvalidArgumentError);
  t.true(branded instanceof LockstepError);
  t.false(branded instanceof NotFoundError);
  t.false(branded instanceof Error);

  const look = { name: 'NotFoundError', code: 'SANDBOX_NOT_FOUND', message: 'No sandbox' };
  t.false(look instanceof NotFoundError);
  t.false(look instanceof LockstepError);
  t.false(new Error('plain') instanceof LockstepError);
  const others: unknown[] = [null, undefined, 0, 'NotFoundError', { [Symbol.for('lockstep.error')]: 'NotFoundError' }];
  for (const v of others) t.false(v instanceof NotFoundError, String(v));
});

test('the brand is not enumerable: JSON and the error body are unchanged', (t) => {
  const e = new NotFoundError('image', 'base');
  t.deepEqual(Object.getOwnPropertySymbols(e), [ERROR_BRAND]);
  t.false(Object.getOwnPropertyDescriptor(e, ERROR_BRAND)!.enumerable);
  t.deepEqual(JSON.parse(JSON.stringify(e)), {
    name: 'NotFoundError',
    code: 'IMAGE_NOT_FOUND',
    message: 'No image named "base"',
    kind: 'image',
    id: 'base',
  });
});
