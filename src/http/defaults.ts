/** Where `lockstep serve` listens unless told otherwise (kept free of fastify, so the CLI loads it cheaply). */
export const DEFAULT_HOST = '127.0.0.1';
export const DEFAULT_PORT = 7878;
