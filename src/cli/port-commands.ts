/**
 * `lockstep ports …`: exposed ports from the command line, a thin layer over
 * `sandbox.ports`. The URL points at `lockstep serve` (LOCKSTEP_PUBLIC_URL,
 * default http://127.0.0.1:7878), which serves every exposure of its state
 * directory; the token is printed once.
 */
import { EXIT, UsageError, printJson, table } from './output.js';
import { need, parse } from './args.js';
import { withLockstep } from './session.js';
import { command, subcommandUsage } from './command-table.js';

type Handler = (argv: string[]) => Promise<number>;

export const portCommands: Record<string, Handler> = {
  async ports(argv) {
    const [sub, ...rest] = argv;
    if (sub !== 'expose' && sub !== 'ls' && sub !== 'close')
      throw new UsageError(`usage:\n${subcommandUsage('ports')}`);
    const { options, usage: u } = command(`ports ${sub}`);
    const { values, positionals } = parse(rest, options, u);
    switch (sub) {
      case 'expose': {
        const [id, port] = need(positionals, 2, u);
        return withLockstep(async (ls) => {
          const e = await ls.get(id!).ports.expose(port as unknown as number);
          if (values.json) printJson(e);
          else process.stdout.write(`${e.url}\ntoken ${e.token}\n`);
          return EXIT.ok;
        });
      }
      case 'ls': {
        const [id] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          const all = ls.get(id!).ports.list();
          if (values.json) printJson(all);
          else
            process.stdout.write(
              table(
                ['PORT', 'ID', 'URL', 'CREATED'],
                all.map((e) => [String(e.port), e.id, e.url, e.createdAt]),
              ) + '\n',
            );
          return EXIT.ok;
        });
      }
      case 'close': {
        const [id, port] = need(positionals, 2, u);
        return withLockstep(async (ls) => {
          const closed = ls.get(id!).ports.close(port as unknown as number);
          if (values.json) printJson({ port: Number(port), closed });
          return EXIT.ok;
        });
      }
    }
  },
};
