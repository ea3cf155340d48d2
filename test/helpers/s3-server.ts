/**
 * A real S3-compatible server for the store's tests: s3rver (a Koa server
 * that keeps objects in a folder) on 127.0.0.1, in a process of its own so
 * that the test process's memory is the client's alone.
 *
 * As a program: `node s3-server.js DIR BUCKET` prints `{"port":N}` once it
 * listens and exits when its stdin closes (so it dies with the test).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** Credentials s3rver accepts. */
export const S3RVER_CREDENTIALS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' };

export interface S3Server {
  endpoint: string;
  bucket: string;
  /** The folder s3rver keeps the bucket's objects in. */
  directory: string;
  stop(): Promise<void>;
}

/** Starts s3rver with one bucket in `directory`; `stop` ends it and removes the folder. */
export async function startS3Server(directory: string, bucket = 'lockstep-test'): Promise<S3Server> {
  fs.mkdirSync(directory, { recursive: true, mode: 0o700 });
  const child: ChildProcess = spawn(process.execPath, [fileURLToPath(import.meta.url), directory, bucket], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    child.stdin?.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
    fs.rmSync(directory, { recursive: true, force: true });
  };
  try {
    const line = await new Promise<string>((resolve, reject) => {
      const rl = createInterface({ input: child.stdout! });
      rl.once('line', (l) => {
        rl.close();
        resolve(l);
      });
      child.once('exit', (code) => reject(new Error(`s3rver exited with ${code} before listening`)));
    });
    const { port } = JSON.parse(line) as { port: number };
    return { endpoint: `http://127.0.0.1:${port}`, bucket, directory, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** The object files s3rver holds under `prefix` of the bucket (their keys). */
export function s3rverObjectPath(server: S3Server, key: string): string {
  return path.join(server.directory, server.bucket, `${key}._S3rver_object`);
}

if (process.argv[1] && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [directory, bucket] = process.argv.slice(2);
  const { default: S3rver } = await import('s3rver');
  const server = new S3rver({
    address: '127.0.0.1',
    port: 0,
    directory: directory!,
    silent: true,
    configureBuckets: [{ name: bucket!, configs: [] }],
  });
  const { port } = await server.run();
  process.stdout.write(JSON.stringify({ port }) + '\n');
  process.stdin.resume();
  process.stdin.on('end', () => {
    void server.close().then(() => process.exit(0));
  });
}
