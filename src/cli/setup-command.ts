/**
 * `lockstep setup`: the one command that makes a host ready (see
 * src/cli/host-setup.ts for the steps), and `lockstep setup --check`, which only
 * reports: exit 0 when everything is in place, 5 otherwise.
 */
import { checkSetup, runSetup } from './host-setup.js';
import { EXIT, printJson, useColor } from './output.js';
import { need, parse } from './args.js';
import { command } from './command-table.js';

type Handler = (argv: string[]) => Promise<number>;

export const setupCommands: Record<string, Handler> = {
  async setup(argv) {
    const { options, usage } = command('setup');
    const { values, positionals } = parse(argv, options, usage);
    need(positionals, 0, usage);
    const opts = {
      home: values.home,
      images: values.images === undefined ? undefined : values.images.split(','),
      cacheOnly: values['cache-only'] === true,
    };
    if (values.check) {
      const steps = await checkSetup(opts);
      const ok = steps.every((s) => s.ok);
      if (values.json) printJson({ ok, steps });
      else {
        const color = useColor();
        for (const s of steps) {
          const mark = s.ok ? (color ? '\x1b[32m✔\x1b[0m' : 'PASS') : color ? '\x1b[31m✘\x1b[0m' : 'FAIL';
          process.stdout.write(
            `${mark} ${s.name.padEnd(16)} ${s.detail}${s.fix ? `\n  ${' '.repeat(16)} → ${s.fix}` : ''}\n`,
          );
        }
      }
      return ok ? EXIT.ok : EXIT.host;
    }
    const started = Date.now();
    const steps = await runSetup({
      ...opts,
      progress: values.json ? undefined : (line) => process.stderr.write(`lockstep setup: ${line}\n`),
    });
    if (values.json) printJson({ ok: true, steps, seconds: (Date.now() - started) / 1000 });
    else process.stderr.write(`lockstep setup: done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
    return EXIT.ok;
  },
};
