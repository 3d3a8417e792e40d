/**
 * The Fetch API adapter: a {@link HandlerApp} as `(request: Request) => Promise<Response>`,
 * the shape Hono, Bun, Deno and edge runtimes serve.
 */
import type { HandlerApp } from "../app.js";
import { encodeError } from "../wire/contract.js";

/** A Fetch API handler. */
export type FetchHandler = (request: Request) => Promise<Response>;

/** Options of {@link fetchHandler}. */
export interface FetchOptions {
  /** A prefix the app is mounted under, taken off the path before routing (`/jobs`). */
  basePath?: string;
}

/** The app as a Fetch API handler. */
export function fetchHandler(handler: HandlerApp, options: FetchOptions = {}): FetchHandler {
  const base = (options.basePath ?? "").replace(/\/+$/, "");
  return async (request) => {
    let path = new URL(request.url).pathname;
    if (base && (path === base || path.startsWith(`${base}/`))) path = path.slice(base.length) || "/";
    let answer;
    try {
      answer = await handler.handle({
        method: request.method,
        path,
        header: (name) => request.headers.get(name) ?? undefined,
        body: (limit) => readBody(request, limit),
      });
    } catch (error) {
      answer = { status: 500, headers: { "content-type": "application/json" },
        body: encodeError(`the handler app failed: ${(error as Error)?.message ?? String(error)}`, false) };
    }
    return new Response(request.method === "HEAD" ? null : answer.body,
      { status: answer.status, headers: answer.headers });
  };
}

async function readBody(request: Request, limit: number): Promise<Uint8Array | null> {
  if (Number(request.headers.get("content-length")) > limit) return null;
  if (request.body === null) return new Uint8Array();
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = request.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel();
      return null;
    }
    chunks.push(value);
  }
  const body = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    body.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return body;
}
