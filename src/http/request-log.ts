/**
 * One JSON log line per request. Fastify's own request logging writes two
 * ("incoming request", then "request completed" with only the status), and
 * the error handler used to add a third for rejected requests; a line that
 * holds everything (method, route, status, duration, error code, tenant and
 * sandbox from the request's bindings) is what one `journalctl -o cat | jq`
 * query, or a log shipper, needs.
 */
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';

/** What the error handler learnt about a failed request, for its log line. */
const outcomes = new WeakMap<FastifyRequest, { code: string; err?: unknown }>();

/** Called by the error handler: the request's line carries the error code (and, for internal errors, the error). */
export function noteRequestError(request: FastifyRequest, code: string, internalError?: unknown): void {
  outcomes.set(request, internalError === undefined ? { code } : { code, err: internalError });
}

/** Fastify's log controller with the two request lines replaced by one. */
export class RequestLogController extends Fastify.LogController {
  override incomingRequest(): void {}

  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    const outcome = outcomes.get(request);
    const err = error ?? outcome?.err;
    const line = {
      method: request.method,
      // An exposed port's token may come in the query (a link a browser opens): never logged.
      url: request.url.replace(/([?&]lockstep_token=)[^&#]*/gi, '$1<redacted>'),
      route: request.routeOptions.url ?? null,
      status: reply.statusCode,
      durationMs: Math.round(reply.elapsedTime * 10) / 10,
      remoteAddress: request.ip,
      ...(outcome ? { code: outcome.code } : {}),
      ...(err ? { err } : {}),
    };
    if (err || reply.statusCode >= 500) reply.log.error(line, 'request');
    else reply.log.info(line, 'request');
  }
}
