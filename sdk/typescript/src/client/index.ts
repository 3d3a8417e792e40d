/**
 * The producer's side: a client of the ingest API (`client.ts`), its errors
 * (`errors.ts`) and the live feed's parser (`feed.ts`). Imports only the generated API
 * types, never the handler app.
 */
export * from "./client.js";
export * from "./errors.js";
export { EventStreamParser, type FeedEvent } from "./feed.js";
