/** Where `lockstep serve` listens unless told otherwise (kept free of fastify, so the CLI loads it cheaply). */
export const DEFAULT_HOST = '127.0.0.1';
export const DEFAULT_PORT = 7878;
/** Where `lockstep serve` reads its configuration unless --config or LOCKSTEP_CONFIG names another file. */
export const DEFAULT_CONFIG_FILE = '/etc/lockstep/config.json';
