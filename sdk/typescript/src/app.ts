/**
 * The handler app: routes, body limits and answers, independent of any server. The
 * adapters (`adapters/node.ts` for `node:http`, `adapters/fetch.ts` for the Fetch API
 * that Hono, Bun, Deno and workers speak) only move bytes in and out of
 * {@link HandlerApp.handle}.
 *
 * Routes: `POST /` (one item), `POST /batch` (an array of items, answered with an
 * array; entries run concurrently), `GET`/`POST /reduce` when a reduce is given, and
 * `GET /healthz`. Anything else is a 404 or 405 with a JSON error object; a body over
 * `maxBodyBytes` is a 413.
 */
import { Fail } from "./errors.js";
import { callHandler, callReduce, type Answer, type HandlerFunction, type Logger } from "./calls.js";
import { Reduce, wholeGateOnly, type ReduceFunction } from "./reduce.js";
import {
  BadRequest, encodeError, parseBatch, parseBatchEntry, parseItem, retryAfterHeader,
  type HeaderReader,
} from "./wire/contract.js";
import { parseReduce } from "./wire/reduce.js";
import type { Item } from "./model.js";

export const DEFAULT_PATH = "/";
export const DEFAULT_HEALTH_PATH = "/healthz";
export const DEFAULT_BATCH_PATH = "/batch";
export const DEFAULT_REDUCE_PATH = "/reduce";
/** The processor's own reduce request limit: every page it builds fits. */
export const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;

/** One function for every gate, or one per gate (`{0: extract, 1: rank}`). */
export type Handlers = HandlerFunction | Readonly<Record<number, HandlerFunction>>;

/** Options of {@link app}. */
export interface AppOptions {
  /** Serves `POST /reduce`: a function taking a whole gate, or a {@link Reduce}. */
  reduce?: ReduceFunction | Reduce<any>;
  path?: string;
  /** `null` turns the route off. */
  healthPath?: string | null;
  /** `null` turns the route off. */
  batchPath?: string | null;
  reducePath?: string;
  /** Larger bodies are refused with a non-retryable 413. */
  maxBodyBytes?: number;
  /** Where handler bugs are reported (default `console`). */
  logger?: Logger;
}

/** A request as the app sees it: `body(limit)` reads the body, or answers `null` once
 * it is over `limit` bytes. */
export interface WireRequest {
  method: string;
  path: string;
  header: HeaderReader;
  body: (limit: number) => Promise<Uint8Array | null>;
}

/** An answer as the app gives it. */
export interface WireResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

const JSON_TYPE = "application/json";

/** The handler app: build it with {@link app}. */
export class HandlerApp {
  readonly path: string;
  readonly healthPath: string | null;
  readonly batchPath: string | null;
  readonly reducePath: string;
  readonly maxBodyBytes: number;
  private readonly single: HandlerFunction | undefined;
  private readonly byGate = new Map<number, HandlerFunction>();
  private readonly gatesText: string;
  private readonly reduce: ReduceFunction | undefined;
  private readonly reduceShape: string;
  private readonly routesText: string;
  private readonly log: Logger;

  /**
   * @throws TypeError a handler is not a function, or a gate key is not an integer >= 0.
   * @throws RangeError the mapping is empty, a path does not start with `/`, two paths
   *   are equal, or `maxBodyBytes` is below 1.
   */
  constructor(handlers: Handlers, options: AppOptions = {}) {
    if (typeof handlers === "function") {
      this.single = handlers;
    } else {
      const entries = Object.entries(handlers ?? {});
      if (entries.length === 0) throw new RangeError("app({...}) needs at least one gate: {0: func, ...}");
      for (const [key, func] of entries) {
        const gate = Number(key);
        if (!/^[0-9]+$/.test(key) || !Number.isSafeInteger(gate)) {
          throw new TypeError(`gate keys must be integers >= 0, got ${JSON.stringify(key)}`);
        }
        if (typeof func !== "function") {
          throw new TypeError(`the handler of gate ${gate} must be a function taking an Item, got ${typeof func}`);
        }
        this.byGate.set(gate, func);
      }
    }
    this.gatesText = [...this.byGate.keys()].sort((a, b) => a - b).join(", ");
    const { reduce } = options;
    if (reduce !== undefined && typeof reduce !== "function" && !(reduce instanceof Reduce)) {
      throw new TypeError("reduce must be a function or new Reduce({fold, apply})");
    }
    this.reduce = reduce === undefined ? undefined
      : reduce instanceof Reduce ? (page) => reduce.call(page) : wholeGateOnly(reduce);
    this.path = options.path ?? DEFAULT_PATH;
    this.healthPath = options.healthPath === undefined ? DEFAULT_HEALTH_PATH : options.healthPath;
    this.batchPath = options.batchPath === undefined ? DEFAULT_BATCH_PATH : options.batchPath;
    this.reducePath = options.reducePath ?? DEFAULT_REDUCE_PATH;
    this.maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    if (!Number.isSafeInteger(this.maxBodyBytes) || this.maxBodyBytes < 1) {
      throw new RangeError(`maxBodyBytes must be an integer >= 1, got ${this.maxBodyBytes}`);
    }
    const routes = [this.path, this.healthPath, this.batchPath, this.reducePath]
      .filter((route): route is string => route !== null);
    for (const route of routes) {
      if (typeof route !== "string" || !route.startsWith("/")) {
        throw new RangeError(`a path must start with '/', got ${JSON.stringify(route)}`);
      }
    }
    if (new Set(routes).size !== routes.length) {
      throw new RangeError(`path, healthPath, batchPath and reducePath must differ, got ${routes.join(", ")}`);
    }
    // What GET on the reduce path answers, so that a processor finds a gate too big
    // for a whole-gate function before any item work.
    this.reduceShape = JSON.stringify({
      pages: reduce instanceof Reduce, max_body_bytes: this.maxBodyBytes,
    });
    this.routesText = [
      `POST ${this.path} for one item`,
      this.batchPath && `POST ${this.batchPath} for a batch`,
      reduce !== undefined && `POST ${this.reducePath} for a reduce`,
      this.healthPath && `GET ${this.healthPath} for health`,
    ].filter(Boolean).join("; ");
    this.log = options.logger ?? console;
  }

  /** Answers one request. Never throws: every failure is an answer. */
  async handle(request: WireRequest): Promise<WireResponse> {
    const { method, path } = request;
    const get = method === "GET" || method === "HEAD";
    if (path === this.path) {
      return method === "POST" ? this.one(request) : notAllowed(method, path, "POST");
    }
    if (path === this.healthPath) {
      return get ? respond(200, '{"status":"ok"}') : notAllowed(method, path, "GET, HEAD");
    }
    if (path === this.batchPath) {
      return method === "POST" ? this.batch(request) : notAllowed(method, path, "POST");
    }
    if (path === this.reducePath) {
      if (get && this.reduce !== undefined) return respond(200, this.reduceShape);
      return method === "POST" ? this.reduceRequest(request) : notAllowed(method, path, "POST");
    }
    return respond(404, encodeError(`no route for ${method} ${path}; this handler serves ${this.routesText}`, true));
  }

  private async one(request: WireRequest): Promise<WireResponse> {
    const body = await request.body(this.maxBodyBytes);
    if (body === null) return this.tooLarge();
    let item: Item;
    try {
      item = parseItem(request.header, body);
    } catch (error) {
      return badRequest(error);
    }
    return answered(await this.settle(item));
  }

  private async batch(request: WireRequest): Promise<WireResponse> {
    const body = await request.body(this.maxBodyBytes);
    if (body === null) return this.tooLarge();
    let entries: unknown[];
    try {
      entries = parseBatch(body);
    } catch (error) {
      return badRequest(error);
    }
    // Entries run concurrently, as the same items sent one by one would; one bad entry
    // spoils nothing (each becomes its own error answer).
    const parts = await Promise.all(entries.map(async (entry, position) => {
      try {
        return (await this.settle(parseBatchEntry(position, entry))).body;
      } catch (error) {
        return encodeError((error as Error).message, true);
      }
    }));
    return respond(200, `[${parts.join(",")}]`);
  }

  private async reduceRequest(request: WireRequest): Promise<WireResponse> {
    const body = await request.body(this.maxBodyBytes);
    if (body === null) return this.tooLarge();
    if (this.reduce === undefined) {
      return respond(404, encodeError("this handler serves no reduce: pass {reduce} to app(), or "
        + "remove the gate from the partition's reduce_gates", true));
    }
    try {
      return answered(await callReduce(this.reduce, parseReduce(body), this.log));
    } catch (error) {
      return badRequest(error);
    }
  }

  private async settle(item: Item): Promise<Answer> {
    const handler = this.single ?? this.byGate.get(item.gate);
    if (handler === undefined) {
      return { status: new Fail().status,
        body: encodeError(`no handler for this gate; this app handles gates ${this.gatesText}`, true) };
    }
    return callHandler(handler, item, this.log);
  }

  private tooLarge(): WireResponse {
    return respond(413, encodeError(
      `the request body is larger than maxBodyBytes (${this.maxBodyBytes} bytes)`, true));
  }
}

function respond(status: number, body: string, extra?: Record<string, string>): WireResponse {
  return { status, headers: { "content-type": JSON_TYPE, ...extra }, body };
}

function answered(answer: Answer): WireResponse {
  return answer.retryAfter === undefined ? respond(answer.status, answer.body)
    : respond(answer.status, answer.body, { "retry-after": retryAfterHeader(answer.retryAfter) });
}

function badRequest(error: unknown): WireResponse {
  if (error instanceof BadRequest) return respond(error.status, encodeError(error.message, true));
  throw error;
}

function notAllowed(method: string, path: string, allow: string): WireResponse {
  return respond(405, encodeError(`method ${method} is not allowed on ${path}; use ${allow}`, true),
    { allow });
}
