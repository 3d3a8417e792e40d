/**
 * Calling user code: a handler function for one item, a reduce for one page, each
 * outcome (a value, {@link Retry}, another {@link HandlerError}, any other throw, a
 * value that is not a result) turned into the {@link Answer} the processor reads.
 * Nothing here throws: a bug in user code answers 500 and never crashes the app.
 */
import { HandlerError, Retry } from "./errors.js";
import type { Item, ReducePage, Reduced, Result } from "./model.js";
import type { ReduceFunction } from "./reduce.js";
import {
  ResultError, coerceResult, encodeError, encodeResult, exceptionMessage,
} from "./wire/contract.js";
import { coerceReduced, encodeReduced } from "./wire/reduce.js";

/** A handler function: sync or async, from an item to its result. */
export type HandlerFunction = (item: Item) => Result | Promise<Result>;

/** Where the SDK reports a handler's bugs (default: `console`). */
export interface Logger {
  error(message: string, ...details: unknown[]): void;
  warn(message: string, ...details: unknown[]): void;
}

/** One answer: status, JSON body, and the delay asked for (if any). */
export interface Answer {
  status: number;
  body: string;
  retryAfter?: number;
}

/** Runs `handler` for `item` and turns any outcome into an answer. Never throws. */
export async function callHandler(handler: HandlerFunction, item: Item, log: Logger): Promise<Answer> {
  let value: unknown;
  try {
    value = await handler(item);
  } catch (error) {
    return thrown(error, log, `partition=${item.partitionId} item=${item.id} gate=${item.gate} `
      + `attempt=${item.attempt}`);
  }
  try {
    return { status: 200, body: encodeResult(coerceResult(value)) };
  } catch (error) {
    log.error(`action=handler_bad_result partition=${item.partitionId} item=${item.id} `
      + `gate=${item.gate} error=${(error as Error).message}`);
    return { status: 500, body: encodeError((error as Error).message, false) };
  }
}

/** Runs `reduce` for `page` and turns any outcome into an answer. Never throws. */
export async function callReduce(reduce: ReduceFunction, page: ReducePage, log: Logger): Promise<Answer> {
  let value: Reduced;
  try {
    value = await reduce(page);
  } catch (error) {
    return thrown(error, log, `partition=${page.partitionId} gate=${page.gate} pass=${page.pass} `
      + `page=${page.page}`);
  }
  try {
    return { status: 200, body: encodeReduced(coerceReduced(value)) };
  } catch (error) {
    log.error(`action=reduce_bad_answer partition=${page.partitionId} gate=${page.gate} `
      + `error=${(error as Error).message}`);
    return { status: 500, body: encodeError((error as Error).message, false) };
  }
}

function thrown(error: unknown, log: Logger, fields: string): Answer {
  if (error instanceof Retry) {
    return { status: error.status, body: encodeError(error.message, false, error.retryAfter),
      ...(error.retryAfter === undefined ? {} : { retryAfter: error.retryAfter }) };
  }
  if (error instanceof HandlerError) {
    return { status: error.status, body: encodeError(error.message, error.noRetry) };
  }
  if (error instanceof ResultError) {
    log.error(`action=handler_bad_result ${fields} error=${error.message}`);
    return { status: 500, body: encodeError(error.message, false) };
  }
  // A handler bug: retryable, so a fixed handler can still process the item.
  log.error(`action=handler_exception ${fields}`, error);
  return { status: 500, body: encodeError(exceptionMessage(error), false) };
}
