/**
 * Errors a handler function throws to say what happens to its item, rooted in
 * {@link HandlerError}. Each carries the HTTP status the SDK answers with, so the
 * processor classifies the attempt:
 *
 * - {@link Retry}: 503, retried; `retryAfter` becomes a `Retry-After` header.
 * - {@link Fail}: 422 with `no_retry`: the item fails at once.
 * - {@link ItemDataError} (a `Fail`): 400 with `no_retry`: the item's bytes are not
 *   what the handler can read.
 *
 * Anything else a handler throws is a bug in the handler: a retryable 500, so a fixed
 * and redeployed handler can still process the item.
 */

/** Base of the errors that tell the SDK how an attempt ended. */
export class HandlerError extends Error {
  /** The HTTP status of the answer. */
  readonly status: number = 500;
  /** Whether the processor must fail the item instead of retrying it. */
  readonly noRetry: boolean = false;

  constructor(message?: string) {
    super(message ?? "the handler reported an error");
    this.name = new.target.name;
  }
}

/** Options of {@link Retry}. */
export interface RetryOptions {
  /** Seconds before the next attempt, at least (sent rounded up as `Retry-After`). */
  retryAfter?: number;
}

/**
 * The item cannot be processed now but may be later: answered as 503. With
 * `retryAfter`, every processor holds its calls to this handler that long and spends
 * no attempt.
 *
 * @throws RangeError `retryAfter` is negative, infinite or not a number.
 */
export class Retry extends HandlerError {
  override readonly status = 503;
  override readonly noRetry = false;
  readonly retryAfter: number | undefined;

  constructor(message?: string, options: RetryOptions = {}) {
    super(message ?? "the handler asked to retry the item later");
    const { retryAfter } = options;
    if (retryAfter !== undefined
        && (typeof retryAfter !== "number" || !Number.isFinite(retryAfter) || retryAfter < 0)) {
      throw new RangeError(
        `Retry(..., {retryAfter}) must be a number of seconds >= 0, got ${String(retryAfter)}`);
    }
    this.retryAfter = retryAfter;
  }
}

/** The item can never succeed at this step: answered as 422 with `no_retry`. */
export class Fail extends HandlerError {
  override readonly status: number = 422;
  override readonly noRetry = true;

  constructor(message?: string) {
    super(message ?? "the handler refused the item");
  }
}

/**
 * The item's bytes cannot be decoded as asked (`item.json()`, `item.text()`): answered
 * as 400 with `no_retry`, as the same bytes fail the same way on every attempt.
 */
export class ItemDataError extends Fail {
  override readonly status = 400;

  constructor(message?: string) {
    super(message ?? "the item's data cannot be decoded");
  }
}
