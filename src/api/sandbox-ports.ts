/**
 * `sandbox.ports`: expose a port the sandbox listens on, so that it can be
 * reached from outside through `lockstep serve` (`/ports/<id>/`), list and
 * close them. See src/network/exposed-ports.ts for what guards them and how
 * long they live.
 */
import type { ExposedPort, ExposureInfo } from '../network/exposed-ports.js';
import type { SandboxCore } from './sandbox-core.js';

/** The exposed ports of one sandbox. */
export class SandboxPorts {
  constructor(private readonly core: SandboxCore) {}

  /**
   * Exposes `port` (something in the sandbox must listen on it, on
   * 127.0.0.1 or any address: PORT_NOT_LISTENING otherwise). Returns the URL
   * and, this once, the token; exposing the same port again gives a new token.
   */
  async expose(port: number): Promise<ExposedPort> {
    const engine = this.core.engine;
    return engine.withSandboxLock(this.core.id, () => engine.exposures.expose(this.core.runningRow(), port));
  }

  /** The sandbox's exposed ports, by port (without their tokens). */
  list(): ExposureInfo[] {
    this.core.row();
    return this.core.engine.exposures.list(this.core.id);
  }

  /** Closes an exposed port and the connections open through it; false when it was not exposed. */
  close(port: number): boolean {
    this.core.row();
    return this.core.engine.exposures.close(this.core.id, port);
  }
}
