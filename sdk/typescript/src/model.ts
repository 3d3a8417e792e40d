/**
 * What a handler function receives ({@link Item}, {@link ReducePage}) and returns
 * ({@link Result}, {@link Reduced}). Results are plain objects: the wire module
 * checks and encodes them.
 */
import { ItemDataError } from "./errors.js";

/** The processor stores gates as 32-bit integers. */
export const MAX_GATE = 2 ** 31 - 1;
/** The longest wait a handler may ask for: 30 days, in seconds. */
export const MAX_WAIT_SECONDS = 30 * 24 * 3600;

/** Item data, or a value stored as its compact JSON: bytes are stored as they are. */
export type Data = unknown;

/** Fields of an {@link Item}. */
export interface ItemFields {
  id: string;
  partitionId: string;
  gate?: number;
  attempt?: number;
  idempotencyKey?: string;
  data?: Uint8Array;
  status?: string;
  lastError?: string | null;
  inReduce?: boolean;
  completionToken?: string;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * One item, as the processor sent it.
 *
 * - `id`, `partitionId`: the item and its partition (percent-decoded).
 * - `gate`: its current gate; `attempt`: 1 on the first call of this step.
 * - `idempotencyKey`: the same for every retry of one step of one item: make side
 *   effects (charging, e-mailing) happen once with it.
 * - `data`: its bytes, unchanged.
 * - `completionToken`: this call's token. If the answer parks the item
 *   (`{wait: ...}`), whoever holds it completes the wait (`Client.complete`). Hand it
 *   to the outside system; never log it. `""` when the processor sent none.
 * - `status`, `lastError`: in a reduce, `"failed"` and its error for an item that
 *   failed at an earlier gate of a partition that carries on without it.
 * - `inReduce`: it came in a reduce page (the SDK's own errors then name it).
 *
 * Tests of handler functions build one directly:
 * `new Item({ id: "r1", partitionId: "p", data: new TextEncoder().encode("{}") })`.
 */
export class Item {
  readonly id: string;
  readonly partitionId: string;
  readonly gate: number;
  readonly attempt: number;
  readonly idempotencyKey: string;
  readonly data: Uint8Array;
  readonly status: string;
  readonly lastError: string | null;
  readonly inReduce: boolean;
  declare readonly completionToken: string;

  constructor(fields: ItemFields) {
    this.id = fields.id;
    this.partitionId = fields.partitionId;
    this.gate = fields.gate ?? 0;
    this.attempt = fields.attempt ?? 1;
    this.idempotencyKey = fields.idempotencyKey ?? "";
    this.data = fields.data ?? new Uint8Array();
    this.status = fields.status ?? "available";
    this.lastError = fields.lastError ?? null;
    this.inReduce = fields.inReduce ?? false;
    // Not enumerable: a token printed with the item (console.log) would leak it.
    Object.defineProperty(this, "completionToken", {
      value: fields.completionToken ?? "", enumerable: false,
    });
  }

  /** Whether the item failed at an earlier gate (seen only by a reduce). */
  get failed(): boolean {
    return this.status === "failed";
  }

  /**
   * The data decoded as UTF-8 JSON.
   *
   * @throws ItemDataError the data is not valid UTF-8 JSON (uncaught: a
   *   non-retryable 400 answer).
   */
  json<T = any>(): T {
    const text = this.decoded("JSON");
    try {
      return JSON.parse(text) as T;
    } catch (error) {
      const start = JSON.stringify(text.slice(0, 40));
      throw new ItemDataError(
        `${this.named()}data is not valid JSON (${shorten((error as Error).message, 200)}); `
        + `it starts with ${start}`);
    }
  }

  /**
   * The data decoded as UTF-8 text.
   *
   * @throws ItemDataError the data is not valid UTF-8.
   */
  text(): string {
    return this.decoded("UTF-8 text");
  }

  /** The partition, item, gate and attempt, for a handler's own logs (errors need none). */
  describe(): string {
    return `partition ${JSON.stringify(this.partitionId)} item ${JSON.stringify(this.id)} `
      + `gate ${this.gate} (attempt ${this.attempt})`;
  }

  private decoded(what: string): string {
    try {
      return utf8.decode(this.data);
    } catch {
      throw new ItemDataError(`${this.named()}data is not valid ${what}: not UTF-8`);
    }
  }

  /** The processor names the partition, item, gate and attempt of a per-item call;
   * in a reduce page it names the page, so the SDK names the item. */
  private named(): string {
    return this.inReduce ? `item ${JSON.stringify(this.id)}: ` : "";
  }
}

/**
 * A new item of the partition, spawned with an answer, exactly once.
 *
 * - `id`: unique in the partition: derive it from the parent's id and a position, so a
 *   step that runs again spawns the same ids.
 * - `data`: its content: bytes (`Uint8Array`) as they are, any other value as its JSON.
 * - `gate`: where it starts; absent: the gate the spawning item was called at (in a
 *   reduce, the gate after the reduce gate).
 */
export interface Spawn {
  id: string;
  data: Data;
  gate?: number | null;
}

/** How long a parked item waits, and what its timeout does. */
export interface Wait {
  /** Seconds, above 0 and at most 30 days. */
  timeout: number;
  /** `"retry"` (default: an attempt spent, called again) or `"fail"`. */
  on_timeout?: "retry" | "fail";
}

/**
 * A handler function's answer for one item. Every field is optional; `{}` runs the
 * item again at the same gate (a loop).
 *
 * - `gate`: its next gate; absent: the current one.
 * - `done`: `true` completes it.
 * - `data`: its new content when the key is present (`undefined` keeps the stored
 *   bytes; `null` stores `null`); a `Uint8Array` is stored as it is.
 * - `spawn`: new items, written with this answer (at most `--max-spawn` per answer).
 * - `snooze`: seconds before it is called again at this gate (no attempt spent); not
 *   with `done` or `gate`.
 * - `wait`: park it at its gate until its completion token is used or the timeout
 *   passes: seconds or a {@link Wait}; not with `done`, `gate` or `snooze`.
 */
export interface Result {
  gate?: number | null;
  done?: boolean;
  data?: Data;
  spawn?: readonly Spawn[];
  snooze?: number;
  wait?: number | Wait;
}

/** Which pass of a reduce a page belongs to. */
export type ReducePass = "all" | "fold" | "apply";

/**
 * What a reduce function receives: a whole gate (`pass: "all"`), or one page of the
 * fold or apply pass.
 */
export interface ReducePage {
  partitionId: string;
  gate: number;
  attempt: number;
  pass: ReducePass;
  /** 0-based position in the pass; `last` marks its last page. */
  page: number;
  last: boolean;
  /** The same for every retry of this page. */
  idempotencyKey: string;
  /** The page's items in id order; failed ones (`item.failed`) cannot be answered. */
  items: readonly Item[];
  /** The previous fold page's accumulator (`null` on the first), or the final one
   * during the apply pass. */
  accumulator: unknown;
}

/**
 * A reduce function's answer.
 *
 * - `items`: per item id, a {@link Result} that completes it or moves it to a later
 *   gate (it may not spawn).
 * - `default`: the result of the items not named; absent: they complete.
 * - `result`: the partition result (JSON value, or bytes); absent: none stored.
 * - `accumulator`: a fold page's answer.
 * - `spawn`: new items at gates after the reduce gate (not on a fold page).
 */
export interface Reduced {
  items?: Readonly<Record<string, Result>>;
  default?: Result;
  result?: Data;
  accumulator?: unknown;
  spawn?: readonly Spawn[];
}

/** The partition, gate, pass, page and attempt of a reduce page, for a handler's logs. */
export function describePage(page: ReducePage): string {
  return `partition ${JSON.stringify(page.partitionId)} gate ${page.gate} reduce ${page.pass} `
    + `page ${page.page} (attempt ${page.attempt})`;
}

export function shorten(text: string, limit: number): string {
  return text.length <= limit ? text : `${text.slice(0, limit)}...`;
}
