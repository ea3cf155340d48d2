/**
 * `lockstep mcp`: the MCP server over stdio. It attaches to a sandbox, or
 * creates one and removes it (with the forks it made) when the client goes
 * away: stdin closes, or SIGTERM/SIGINT arrives.
 */
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { Lockstep } from '../api/lockstep.js';
import type { Logger } from '../log.js';
import { createMcpServer } from './server.js';

/** Options of runMcpStdio. */
export interface McpStdioOptions {
  /** Attach to this sandbox; otherwise one is created and removed at exit. */
  sandboxId?: string | undefined;
  /** Image of the sandbox created when none is given (default "base"). */
  image?: string | undefined;
  memoryMb?: number | undefined;
  home?: string | undefined;
  logger?: Logger | undefined;
  stdin?: NodeJS.ReadableStream | undefined;
  stdout?: NodeJS.WritableStream | undefined;
}

/** Serves MCP on stdio until the client leaves; resolves after cleaning up. */
export async function runMcpStdio(opts: McpStdioOptions = {}): Promise<void> {
  const ls = await Lockstep.open({ home: opts.home, logger: opts.logger });
  const log = ls.logger.child({ component: 'mcp' });
  const owned: string[] = [];
  let sandboxId: string;
  try {
    if (opts.sandboxId !== undefined) {
      sandboxId = ls.get(opts.sandboxId).id;
    } else {
      const sb = await ls.create({
        image: opts.image,
        memoryMb: opts.memoryMb,
        metadata: { createdBy: 'lockstep mcp' },
      });
      sandboxId = sb.id;
      owned.push(sb.id);
    }
  } catch (e) {
    await ls.close();
    throw e;
  }
  const ownsSandbox = owned.length > 0;
  const server = createMcpServer({
    lockstep: ls,
    sandboxId,
    onFork: (ids) => (ownsSandbox ? owned.push(...ids) : undefined),
  });
  const stdin = (opts.stdin ?? process.stdin) as NodeJS.ReadStream;
  const transport = new StdioServerTransport(stdin, (opts.stdout ?? process.stdout) as NodeJS.WriteStream);

  let finish!: () => void;
  const finished = new Promise<void>((r) => (finish = r));
  const onSignal = () => finish();
  process.once('SIGTERM', onSignal);
  process.once('SIGINT', onSignal);
  stdin.once('end', onSignal);
  stdin.once('close', onSignal);
  transport.onclose = onSignal;
  await server.connect(transport);
  log.info({ sandboxId, owned: ownsSandbox }, 'MCP server ready on stdio');

  await finished;
  process.off('SIGTERM', onSignal);
  process.off('SIGINT', onSignal);
  await server.close().catch(() => undefined);
  // Forks first, then the sandbox they came from.
  for (const id of owned.reverse()) {
    await ls.remove(id).catch((err: unknown) => {
      if ((err as { code?: string }).code !== 'SANDBOX_NOT_FOUND')
        log.warn({ err, sandboxId: id }, 'could not remove a sandbox this session created');
    });
  }
  await ls.close();
}
