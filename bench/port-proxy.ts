/**
 * Exposed ports: what the manager's proxy adds to a small request.
 * One egress `base` sandbox runs busybox httpd on 0.0.0.0:8080 serving a
 * 13-byte file; `lockstep serve` (createServer) listens on loopback. Timed,
 * N requests each, one at a time, a new connection per request on both
 * sides (what the proxy does into the sandbox):
 *   direct   GET http://<sandbox address>:8080/  (host → veth → sandbox)
 *   proxied  GET http://127.0.0.1:<serve>/ports/<id>/  with X-Lockstep-Token
 *            (token check, connectInNetns on a thread, HTTP relayed)
 * and the same proxied request to a `none` sandbox (no direct path exists).
 * Writes bench/results/port-proxy.json; prints p50/p95.
 *   node dist/bench/port-proxy.js [N]
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Lockstep } from '../src/index.js';
import { createServer } from '../src/http/server.js';
import { destroyHome, freshHome } from '../test/helpers/harness.js';
import { summarize, type Summary } from './stats.js';

const N = Number(process.argv[2] ?? 200);
const WARMUP = 20;

function get(url: string, headers: Record<string, string> = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () =>
        res.statusCode === 200 ? resolve(body) : reject(new Error(`${url}: ${res.statusCode} ${body}`)),
      );
    });
    req.on('error', reject);
  });
}

async function measure(url: string, headers: Record<string, string>): Promise<Summary> {
  for (let i = 0; i < WARMUP; i++) await get(url, headers);
  const ms: number[] = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    const body = await get(url, headers);
    ms.push(performance.now() - t0);
    if (body !== 'hello, port\n') throw new Error(`unexpected body ${JSON.stringify(body)}`);
  }
  return summarize(ms);
}

const home = freshHome('bench-ports');
const ls = await Lockstep.open({ home, config: { networkRange: '10.234.0.0/24' } });
const app = createServer({ lockstep: ls, sweepIntervalMs: 0, logger: undefined });
const load = [os.loadavg()[0]!];
try {
  await ls.images.ensure('base');
  await app.listen({ port: 0, host: '127.0.0.1' });
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const start = async (network: 'none' | 'egress') => {
    const sb = await ls.create({ network, memoryMb: 64 });
    await sb.files.write('/workspace/www/index.html', 'hello, port\n');
    await sb.commands.run('httpd -f -p 8080 -h /workspace/www', { background: true });
    for (let i = 0; ; i++) {
      try {
        return { sb, exposed: await sb.ports.expose(8080) };
      } catch (e) {
        if (i > 50) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  };
  const egress = await start('egress');
  const none = await start('none');
  const token = (e: { token: string }) => ({ 'x-lockstep-token': e.token });
  const direct = await measure(`http://${egress.sb.info().network.address}:8080/`, {});
  const proxied = await measure(`${base}${egress.exposed.path}`, token(egress.exposed));
  const proxiedNone = await measure(`${base}${none.exposed.path}`, token(none.exposed));
  load.push(os.loadavg()[0]!);
  const result = {
    date: new Date().toISOString(),
    requests: N,
    warmup: WARMUP,
    loadAverage: { start: load[0], end: load[1] },
    directMs: direct,
    proxiedMs: proxied,
    proxiedNoneMs: proxiedNone,
    addedP50Ms: proxied.p50 - direct.p50,
  };
  const out = path.join(path.dirname(new URL(import.meta.url).pathname), '../../bench/results/port-proxy.json');
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, JSON.stringify(result, null, 2) + '\n');
  const f = (s: Summary) => `${s.p50.toFixed(2)} / ${s.p95.toFixed(2)}`;
  console.log(`small GET, ${N} requests, p50 / p95 ms (load ${load.map((l) => l.toFixed(1)).join(' → ')})`);
  console.log(`  direct to the egress sandbox's address   ${f(direct)}`);
  console.log(`  through lockstep serve (egress sandbox)  ${f(proxied)}`);
  console.log(`  through lockstep serve (none sandbox)    ${f(proxiedNone)}`);
  console.log(`  added by the proxy (p50)                  ${result.addedP50Ms.toFixed(2)}`);
} finally {
  await app.close();
  await ls.close();
  await destroyHome(home);
}
