/**
 * The ingest API's errors, as the client throws them: {@link ApiError} with the
 * answer's stable `code`, and a subclass for the codes a producer handles.
 */
import type { components } from "../api-types.js";

/** The `error` object of every error answer. */
export type ErrorDetail = components["schemas"]["ErrorDetail"];

/** An error answer of the ingest API: `code` is stable for programs, `message` says
 * what is wrong and what to do, `field` and `line` where. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string | null;
  readonly line: number | null;
  /** Seconds to wait before trying again, when the answer said (`Retry-After`). */
  readonly retryAfter: number | undefined;

  constructor(detail: ErrorDetail, retryAfter?: number) {
    super(detail.message);
    this.name = new.target.name;
    this.status = detail.status;
    this.code = detail.code;
    this.field = detail.field;
    this.line = detail.line;
    this.retryAfter = retryAfter;
  }
}

/** No partition has this id (404 `partition_not_found`). */
export class PartitionNotFoundError extends ApiError {}
/** A create of an existing partition that is not a retry of its own create (409). */
export class PartitionExistsError extends ApiError {}
/** No wait has this completion token, or it is malformed (404 on a completion route).
 * With `retryAfter`, the parking answer may not be written yet: trying again is safe. */
export class WaitNotFoundError extends ApiError {}
/** The wait is over: completed, timed out, cancelled, retried or replaced (409);
 * nothing was written. */
export class AlreadyCompletedError extends ApiError {}
/** The rules refuse the input (422 `invalid_input`, `duplicate_items`). */
export class InvalidInputError extends ApiError {}

/** {@link Client.wait} gave up: the partition is still open. */
export class WaitTimeoutError extends Error {
  /** The partition as last read. */
  readonly partition: components["schemas"]["Partition"];

  constructor(message: string, partition: components["schemas"]["Partition"]) {
    super(message);
    this.name = "WaitTimeoutError";
    this.partition = partition;
  }
}

const BY_CODE: Record<string, typeof ApiError> = {
  partition_not_found: PartitionNotFoundError,
  partition_exists: PartitionExistsError,
  already_completed: AlreadyCompletedError,
  invalid_input: InvalidInputError,
  duplicate_items: InvalidInputError,
};

/** The error an answer stands for (`completion`: it answered a completion route, where
 * `not_found` names the token). */
export function apiError(status: number, body: string, retryAfter: string | null,
                         completion: boolean): ApiError {
  let detail: ErrorDetail | undefined;
  try {
    const parsed = JSON.parse(body) as { error?: ErrorDetail };
    if (parsed && typeof parsed.error === "object" && parsed.error !== null) detail = parsed.error;
  } catch {
    // Not the API's JSON: a proxy's page, say.
  }
  detail ??= { status, code: status >= 500 ? "unavailable" : "http_error",
    message: `HTTP ${status}: ${body.slice(0, 200)}`, field: null, line: null };
  const seconds = retryAfter !== null && /^[0-9]+$/.test(retryAfter) ? Number(retryAfter) : undefined;
  const kind = completion && detail.code === "not_found" ? WaitNotFoundError
    : BY_CODE[detail.code] ?? ApiError;
  return new kind(detail, seconds);
}
