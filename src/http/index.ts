/** The HTTP API server. */
export {
  createServer,
  type LockstepServer,
  type ServerOptions,
  type ShutdownOptions,
  type ShutdownReport,
} from './server.js';
export { DEFAULT_HOST, DEFAULT_PORT } from '../server-defaults.js';
export { HttpError, statusForCode, type ErrorBody } from './errors.js';
export { migrateIdempotency, IDEMPOTENCY_TTL_MS } from './idempotency.js';
export { ServerMetrics } from './metrics.js';
