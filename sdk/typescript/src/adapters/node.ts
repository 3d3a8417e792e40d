/**
 * The `node:http` adapter: a {@link HandlerApp} as a request listener
 * (`http.createServer(listener)`), and {@link serve} to listen on a port.
 */
import { Buffer } from "node:buffer";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";

import { encodeError } from "../wire/contract.js";
import type { HandlerApp, WireResponse } from "../app.js";

/** A `node:http` request listener. */
export type RequestListener = (request: IncomingMessage, response: ServerResponse) => void;

/** The app as a `node:http` request listener. */
export function nodeListener(handler: HandlerApp): RequestListener {
  return (request, response) => {
    const path = (request.url ?? "/").split("?", 1)[0] ?? "/";
    handler.handle({
      method: request.method ?? "GET",
      path,
      header: (name) => {
        const value = request.headers[name];
        return Array.isArray(value) ? value.join(", ") : value;
      },
      body: (limit) => readBody(request, limit),
    }).catch((error: unknown) => ({
      status: 500, headers: { "content-type": "application/json" },
      body: encodeError(`the handler app failed: ${(error as Error)?.message ?? String(error)}`, false),
    }) satisfies WireResponse).then((answer) => {
      if (!request.complete) request.resume();  // an unread body (a 413): drain it
      const body = Buffer.from(answer.body, "utf8");
      response.writeHead(answer.status, { ...answer.headers, "content-length": String(body.length) });
      response.end(request.method === "HEAD" ? undefined : body);
    });
  };
}

/** The request's whole body, or `null` once it is over `limit` bytes. */
export function readBody(request: IncomingMessage, limit: number): Promise<Uint8Array | null> {
  const declared = Number(request.headers["content-length"]);
  if (declared > limit) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        request.off("data", onData);
        request.resume();
        resolve(null);
        return;
      }
      chunks.push(chunk);
    };
    request.on("data", onData);
    request.once("end", () => resolve(size > limit ? null : Buffer.concat(chunks)));
    request.once("error", reject);
  });
}

/** Options of {@link serve}. */
export interface ServeOptions {
  port?: number;
  host?: string;
}

/**
 * Serves the app with `node:http` until the server is closed; resolves once it
 * listens (port 0: any free port, read it from `server.address()`).
 */
export function serve(listener: RequestListener, options: ServeOptions = {}): Promise<Server> {
  const server = createServer(listener);
  // Processors keep connections open between items; Node's 5 s default would make
  // them reconnect often (and race the close).
  server.keepAliveTimeout = 75_000;
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 8000, options.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve(server);
    });
  });
}
