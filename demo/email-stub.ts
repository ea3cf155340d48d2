/**
 * A stand-in for an outside e-mail service: a real HTTP server on 127.0.0.1
 * that counts deliveries. It lives outside the sandbox on purpose: a rollback
 * cannot reach it, so whatever it received stays received, which is exactly
 * what the effect ledger has to account for.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

/** One e-mail as the stub received it. */
export interface Delivery {
  delivery: number;
  messageId: string;
  to: string;
  subject: string;
}

/** A running stub: its URL, what it received, and a way to stop it. */
export interface EmailStub {
  readonly url: string;
  readonly deliveries: readonly Delivery[];
  /** Sends one e-mail through the stub over HTTP, as an agent's tool would. */
  send(mail: { to: string; subject: string; body: string }): Promise<Delivery>;
  close(): Promise<void>;
}

/** Starts the stub on an ephemeral port. */
export async function startEmailStub(): Promise<EmailStub> {
  const deliveries: Delivery[] = [];
  const server = http.createServer((req, res) => {
    if (req.method !== 'POST' || req.url !== '/v1/send') {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not found"}');
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let mail: { to?: unknown; subject?: unknown };
      try {
        mail = JSON.parse(Buffer.concat(chunks).toString('utf8')) as typeof mail;
      } catch {
        res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":"body is not JSON"}');
        return;
      }
      const n = deliveries.length + 1;
      const d: Delivery = {
        delivery: n,
        messageId: `msg-${String(n).padStart(4, '0')}`,
        to: String(mail.to),
        subject: String(mail.subject),
      };
      deliveries.push(d);
      res.writeHead(202, { 'content-type': 'application/json' }).end(JSON.stringify(d));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const url = `http://127.0.0.1:${port}`;

  return {
    url,
    deliveries,
    async send(mail) {
      let res: Response;
      try {
        res = await fetch(`${url}/v1/send`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(mail),
        });
      } catch (err) {
        // The connection was refused: the mail certainly did not go out, so the
        // ledger may record a definite failure rather than an unknown outcome.
        throw Object.assign(new Error(`e-mail service unreachable: ${(err as Error).message}`, { cause: err }), {
          definite: true,
        });
      }
      if (!res.ok) throw new Error(`e-mail service answered ${res.status}: ${await res.text()}`);
      return (await res.json()) as Delivery;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
