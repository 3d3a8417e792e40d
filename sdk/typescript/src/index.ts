/**
 * statefeed for TypeScript: handlers and a producer client.
 *
 * A handler is a function from {@link Item} to {@link Result}; {@link app} serves it
 * (per item, batch and reduce routes) as a `node:http` listener with a Fetch API face;
 * `@statefeed/sdk/hono` mounts it in Hono. {@link Client} drives the ingest API
 * (`processor api`): create, add, read, list, wait, watch, complete and heartbeat.
 *
 * ```ts
 * import { app, serve, Fail } from "@statefeed/sdk";
 *
 * const extract = (item) => {
 *   const resume = item.json();                 // bad JSON: a non-retryable 400
 *   if (!resume.text) throw new Fail("no 'text' field");
 *   return { gate: 1, data: { words: resume.text.split(" ").length } };
 * };
 * await serve(app({ 0: extract, 1: () => ({ done: true }) }), { port: 8000 });
 * ```
 */
export { Fail, HandlerError, ItemDataError, Retry, type RetryOptions } from "./errors.js";
export {
  Item, MAX_GATE, MAX_WAIT_SECONDS, describePage,
  type Data, type ItemFields, type Reduced, type ReducePage, type ReducePass, type Result,
  type Spawn, type Wait,
} from "./model.js";
export { Reduce, reduced, type ApplyAnswer, type ReduceFunction, type ReduceOptions } from "./reduce.js";
export type { HandlerFunction, Logger } from "./calls.js";
export {
  DEFAULT_BATCH_PATH, DEFAULT_HEALTH_PATH, DEFAULT_MAX_BODY_BYTES, DEFAULT_PATH,
  DEFAULT_REDUCE_PATH, HandlerApp,
  type AppOptions, type Handlers, type WireRequest, type WireResponse,
} from "./app.js";
export { app, serve, type StatefeedApp } from "./serving.js";
export { nodeListener, type RequestListener, type ServeOptions } from "./adapters/node.js";
export { fetchHandler, type FetchHandler, type FetchOptions } from "./adapters/fetch.js";
export * from "./client/index.js";
export type { components as ApiComponents, operations as ApiOperations, paths as ApiPaths } from "./api-types.js";
