/**
 * Routes: background commands after they started: list them, read their
 * output by byte offsets (poll with the offsets the last answer gave), and
 * reattach by pid (wait and kill are in commands.ts). The output lives in
 * the sandbox (background-output.ts): a rollback rewinds it, which the
 * answer reports as `rewound: true`, starting again from offset 0.
 */
import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';

const offset = {
  type: 'string',
  pattern: '^(0|[1-9][0-9]{0,15})$',
  description: 'Byte offset to read from (default 0)',
};
const outputQuery = {
  type: 'object',
  properties: { stdoutOffset: offset, stderrOffset: offset },
  additionalProperties: false,
};

export function backgroundRoutes(app: FastifyInstance, ctx: ApiContext): void {
  const tags = ['commands'];

  app.get(
    '/sandboxes/:id/commands',
    {
      schema: {
        tags,
        operationId: 'listCommands',
        'x-lockstep-doc': { success: '200 `[{pid, running, exitCode}]` (background commands)' },
        summary: 'Background commands of the sandbox: pid, running, exitCode',
        params: S.sandboxParams,
        response: {
          200: S.arrayOf(S.processState, 'Background commands, by pid'),
          ...S.errors(409),
        },
      },
    },
    async (req) => ctx.sandbox(req).commands.list(),
  );

  app.get<{ Params: { id: string; pid: string }; Querystring: { stdoutOffset?: string; stderrOffset?: string } }>(
    '/sandboxes/:id/commands/:pid/output',
    {
      schema: {
        tags,
        operationId: 'getCommandOutput',
        'x-lockstep-doc': {
          input: '`?stdoutOffset=&stderrOffset=`',
          success: '200 `{pid, stdout, stderr, offsets, rewound, running}`',
        },
        summary: 'Output of a background command since the given byte offsets',
        params: S.pidParams,
        querystring: outputQuery,
        response: {
          200: S.commandOutput,
          ...S.errors(409, 413),
        },
      },
    },
    async (req) => {
      const handle = await ctx.sandbox(req).commands.connect(Number(req.params.pid));
      const r = await handle.output({
        stdout: Number(req.query.stdoutOffset ?? 0),
        stderr: Number(req.query.stderrOffset ?? 0),
      });
      return { pid: handle.pid, ...r };
    },
  );
}
