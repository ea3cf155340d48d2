/**
 * What the HTTP fuzzer (http-fuzz.test.ts) found, each pinned by the request
 * that showed it, against a real server on loopback.
 */
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

integration(test, () => {
  test.serial(
    'fuzz finding: errors raised before routing (bad percent-encoding, an over-long path parameter) have the typed error body',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'acme'));

      // Was fastify's own body: {"error":"Bad Request","code":"FST_ERR_BAD_URL","message":...,"statusCode":400}.
      for (const path of [
        '/v1/sandboxes/%ZZ/commands',
        '/v1/sandboxes/sbx_%E0%A4%A',
        '/healthz%',
        '/docs/static/%ZZ',
      ]) {
        const res = await api.req(
          path.startsWith('/v1/sandboxes/%ZZ') ? 'POST' : 'GET',
          path,
          path.includes('commands') ? { body: { cmd: 'true' } } : {},
        );
        t.is(res.status, 400, path);
        t.deepEqual(
          res.body,
          {
            error: {
              code: 'INVALID_ARGUMENT',
              message: 'The request path is not valid percent-encoding (a % must be followed by two hex digits)',
              field: 'url',
            },
          },
          path,
        );
        t.regex(res.headers.get('content-type') ?? '', /^application\/json/);
      }

      // Was fastify's own 414 body (FST_ERR_MAX_PARAM_LENGTH) for a parameter over 100 characters.
      const long = await api.get(`/v1/sandboxes/sbx_${'a'.repeat(120)}`);
      t.is(long.status, 400);
      t.deepEqual(long.body, {
        error: {
          code: 'INVALID_ARGUMENT',
          message: 'A path parameter is longer than any id (at most 100 characters)',
          field: 'url',
        },
      });

      // A parameter within fastify's limit but over the id's own is the schema's refusal, as before.
      const over = await api.get(`/v1/sandboxes/sbx_${'a'.repeat(70)}`);
      t.is(over.status, 400);
      t.is(over.body.error.field, 'id');

      // The server still answers.
      t.is((await client.get('/healthz')).status, 200);
    },
  );
});
