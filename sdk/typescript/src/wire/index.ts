/**
 * The handler's side of the HTTP contract, as pure functions: requests to items and
 * results to JSON (`contract.ts`), and reduce calls (`reduce.ts`). No I/O; imports
 * only the model, never the app, the adapters or the client.
 */
export * from "./contract.js";
export * from "./reduce.js";
