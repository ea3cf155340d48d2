/**
 * Prometheus metrics (prom-client), on a registry of the server's own so
 * that several servers in one process (tests) do not collide.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Lockstep } from '../api/lockstep.js';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** The server's metrics. */
export class ServerMetrics {
  readonly registry = new Registry();
  readonly checkpointSeconds: Histogram<'outcome'>;
  readonly rollbackSeconds: Histogram<'outcome'>;
  readonly forkSeconds: Histogram<'outcome'>;
  readonly requests: Counter<'method' | 'route' | 'status_code'>;
  readonly requestSeconds: Histogram<'method' | 'route' | 'status_code'>;

  constructor(lockstep: Lockstep) {
    const registers = [this.registry];
    this.checkpointSeconds = new Histogram({
      name: 'lockstep_checkpoint_duration_seconds',
      help: 'Latency of checkpoints taken through the API',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.rollbackSeconds = new Histogram({
      name: 'lockstep_rollback_duration_seconds',
      help: 'Latency of rollbacks done through the API',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.forkSeconds = new Histogram({
      name: 'lockstep_fork_duration_seconds',
      help: 'Latency of fork requests (all forks of one request) done through the API',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.requests = new Counter({
      name: 'lockstep_http_requests_total',
      help: 'HTTP requests answered, by route and status',
      labelNames: ['method', 'route', 'status_code'],
      registers,
    });
    this.requestSeconds = new Histogram({
      name: 'lockstep_http_request_duration_seconds',
      help: 'HTTP request latency, by route and status',
      labelNames: ['method', 'route', 'status_code'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    new Gauge({
      name: 'lockstep_sandboxes',
      help: 'Sandboxes in the catalog, by state',
      labelNames: ['state'],
      registers,
      collect() {
        this.reset();
        try {
          for (const s of lockstep.list()) this.inc({ state: s.state });
        } catch {
          /* the manager is closing */
        }
      },
    });
    collectDefaultMetrics({ register: this.registry, prefix: 'lockstep_process_' });
  }

  /** Times fn into a histogram labelled with its outcome ("ok" or the error code). */
  async time<T>(h: Histogram<'outcome'>, fn: () => Promise<T>): Promise<T> {
    const end = h.startTimer();
    try {
      const v = await fn();
      end({ outcome: 'ok' });
      return v;
    } catch (e) {
      end({ outcome: (e as { code?: string }).code ?? 'error' });
      throw e;
    }
  }
}
