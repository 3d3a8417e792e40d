/**
 * The Hono adapter (`@statefeed/sdk/hono`): a handler app as a Hono route handler.
 * Hono is an optional peer dependency; this module imports only its types.
 *
 * ```ts
 * import { Hono } from "hono";
 * import { app } from "@statefeed/sdk";
 * import { statefeed } from "@statefeed/sdk/hono";
 *
 * const server = new Hono();
 * server.all("/jobs/*", statefeed(app({ 0: extract }), { basePath: "/jobs" }));
 * ```
 */
import type { Context } from "hono";

import type { StatefeedApp } from "../serving.js";
import { fetchHandler, type FetchOptions } from "./fetch.js";

export type { FetchOptions };

/** The app as a Hono handler (`hono.all("/*", statefeed(handler))`). `basePath` is
 * the prefix it is mounted under. */
export function statefeed(handler: StatefeedApp, options: FetchOptions = {}): (context: Context) => Promise<Response> {
  const fetch = fetchHandler(handler.app, options);
  return (context) => fetch(context.req.raw);
}
