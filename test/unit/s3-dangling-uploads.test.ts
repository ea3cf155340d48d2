/**
 * Before each put, the S3 store aborts the multipart uploads that a killed
 * put left behind (a killed process never reaches lib-storage's own abort).
 * s3rver, the server of the integration test, does not implement
 * ListMultipartUploads, so this decision is checked here against a
 * recording fake of the client: which uploads are aborted, paging, and a
 * server that answers 501.
 */
import test from 'ava';
import type { S3Client } from '@aws-sdk/client-s3';
import { S3Backend } from '../../src/snapshots/s3-store.js';

interface Sent {
  command: string;
  input: Record<string, unknown>;
}

const HOUR = 3600_000;

/** A client whose ListMultipartUploads answers `pages` in turn (or throws `error`), recording every command. */
function fakeClient(pages: Record<string, unknown>[], error?: Error): { client: S3Client; sent: Sent[] } {
  const sent: Sent[] = [];
  let page = 0;
  const client = {
    send: async (cmd: { constructor: { name: string }; input: Record<string, unknown> }) => {
      sent.push({ command: cmd.constructor.name, input: cmd.input });
      if (cmd.constructor.name === 'ListMultipartUploadsCommand') {
        if (error) throw error;
        return pages[page++] ?? {};
      }
      return {};
    },
    destroy: () => undefined,
  };
  return { client: client as unknown as S3Client, sent };
}

test('uploads under chunks/ older than the cut-off are aborted, younger ones are left to their put; pages are followed', async (t) => {
  const now = Date.now();
  const { client, sent } = fakeClient([
    {
      IsTruncated: true,
      NextKeyMarker: 'p/chunks/b',
      NextUploadIdMarker: 'u2',
      Uploads: [
        { Key: 'p/chunks/a', UploadId: 'u1', Initiated: new Date(now - 30 * HOUR) },
        { Key: 'p/chunks/b', UploadId: 'u2', Initiated: new Date(now - 1 * HOUR) },
      ],
    },
    { IsTruncated: false, Uploads: [{ Key: 'p/chunks/c', UploadId: 'u3', Initiated: new Date(now - 48 * HOUR) }] },
  ]);
  const backend = new S3Backend({ bucket: 'snaps', prefix: 'p/', client });
  await backend.beforePut();
  t.deepEqual(sent, [
    {
      command: 'ListMultipartUploadsCommand',
      input: { Bucket: 'snaps', Prefix: 'p/chunks/', KeyMarker: undefined, UploadIdMarker: undefined },
    },
    { command: 'AbortMultipartUploadCommand', input: { Bucket: 'snaps', Key: 'p/chunks/a', UploadId: 'u1' } },
    {
      command: 'ListMultipartUploadsCommand',
      input: { Bucket: 'snaps', Prefix: 'p/chunks/', KeyMarker: 'p/chunks/b', UploadIdMarker: 'u2' },
    },
    { command: 'AbortMultipartUploadCommand', input: { Bucket: 'snaps', Key: 'p/chunks/c', UploadId: 'u3' } },
  ]);
});

test('the cut-off is configurable', async (t) => {
  const { client, sent } = fakeClient([
    { Uploads: [{ Key: 'chunks/a', UploadId: 'u1', Initiated: new Date(Date.now() - 2 * HOUR) }] },
  ]);
  await new S3Backend({ bucket: 'snaps', client, staleUploadMs: HOUR }).beforePut();
  t.deepEqual(
    sent.map((s) => s.command),
    ['ListMultipartUploadsCommand', 'AbortMultipartUploadCommand'],
  );
});

test('a server without ListMultipartUploads (501) is asked once, then never again; other errors propagate', async (t) => {
  const notImplemented = Object.assign(new Error('not implemented'), {
    name: 'NotImplemented',
    $metadata: { httpStatusCode: 501 },
  });
  const { client, sent } = fakeClient([], notImplemented);
  const backend = new S3Backend({ bucket: 'snaps', client });
  await backend.beforePut();
  await backend.beforePut();
  t.is(sent.length, 1);
  const denied = Object.assign(new Error('denied'), { name: 'AccessDenied', $metadata: { httpStatusCode: 403 } });
  const other = fakeClient([], denied);
  await t.throwsAsync(new S3Backend({ bucket: 'snaps', client: other.client }).beforePut(), { message: 'denied' });
});
