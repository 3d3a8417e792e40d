/**
 * The SDK's entry points: {@link app} makes a handler app from functions, as a
 * `node:http` request listener that also carries its Fetch API face; {@link serve}
 * listens on a port.
 */
import type { Server } from "node:http";

import { HandlerApp, type AppOptions, type Handlers } from "./app.js";
import { fetchHandler, type FetchHandler } from "./adapters/fetch.js";
import { nodeListener, serve as listen, type RequestListener, type ServeOptions } from "./adapters/node.js";

/** A handler app: a `node:http` request listener, with `fetch` (the Fetch API face) and
 * `app` (the routes, for the adapters). */
export interface StatefeedApp extends RequestListener {
  readonly app: HandlerApp;
  readonly fetch: FetchHandler;
}

/**
 * Turns handler functions into a handler app.
 *
 * `handlers` is `(item) => result` (sync or async), or `{gate: func}` routing each
 * item by its gate (an item at a gate not in it fails with a non-retryable 422).
 * What the function does decides the answer:
 *
 * - returns a {@link Result} object: 200 with it;
 * - returns `undefined`: a retryable 500 naming the fix (a forgotten `return` must
 *   neither complete the item nor loop it);
 * - throws {@link Retry}: 503 (with `Retry-After` when given);
 * - throws {@link Fail}: 422, {@link ItemDataError}: 400, both `no_retry`;
 * - throws anything else: 500, retryable, `"<Name>: <message>"`; logged once.
 *
 * `options.reduce` serves `POST /reduce`: `(page) => reduced` for a whole gate at
 * once, or `new Reduce({fold, apply})` for gates of any size.
 *
 * ```ts
 * import { createServer } from "node:http";
 * const handler = app({ 0: extract, 1: rank }, { reduce: total });
 * createServer(handler).listen(8000);
 * ```
 *
 * @throws TypeError, RangeError as {@link HandlerApp}'s constructor.
 */
export function app(handlers: Handlers, options: AppOptions = {}): StatefeedApp {
  const handler = new HandlerApp(handlers, options);
  const listener = nodeListener(handler);
  return Object.assign(listener, { app: handler, fetch: fetchHandler(handler) });
}

/**
 * Serves a handler app (or what {@link app} takes) with `node:http`; resolves with the
 * listening server once it listens (port 8000 on 127.0.0.1 by default).
 */
export function serve(handler: StatefeedApp | Handlers, options: ServeOptions = {}): Promise<Server> {
  const served = typeof handler === "function" && "app" in handler ? handler as StatefeedApp
    : app(handler as Handlers);
  return listen(served, options);
}
