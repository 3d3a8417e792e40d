/**
 * Reduce functions: one step that sees a whole gate, at any size. Two shapes are
 * served at `POST /reduce`:
 *
 * - a plain function `(page: ReducePage) => Reduced` gets the whole gate in one call
 *   (`page.pass === "all"`): the short way for gates that fit one page
 *   (`--reduce-page-items`). `GET /reduce` says so, so a processor fails a partition
 *   with more items than a page before any item work; a paged request that still comes
 *   gets a final error naming the fix.
 * - {@link Reduce}, from a *fold* and an *apply* function, serves gates of any size:
 *   a big gate comes in pages, first to fold (each page with the accumulator of the one
 *   before), then again to apply (each with the final accumulator). A small gate comes
 *   in one call, and `Reduce` runs fold, result and apply on it in turn, so the same
 *   functions answer both.
 */
import { Fail } from "./errors.js";
import type { Item, Reduced, ReducePage, Result } from "./model.js";

type MaybePromise<T> = T | Promise<T>;

/** A reduce function that takes a whole gate at once. */
export type ReduceFunction = (page: ReducePage) => MaybePromise<Reduced>;

const REDUCED = Symbol("statefeed.reduced");

/** Marks a full {@link Reduced} answer returned by `apply` (rather than a map of item
 * ids to results): `apply` may then set `result`, `default` or `spawn` too. */
export function reduced(answer: Reduced): Reduced {
  return Object.defineProperty({ ...answer }, REDUCED, { value: true, enumerable: false });
}

/** What `apply` returns: item ids to results (items not named complete), or
 * {@link reduced}`({...})`. */
export type ApplyAnswer = Readonly<Record<string, Result>> | ReadonlyMap<string, Result> | Reduced;

/** The functions of a {@link Reduce}; each may be async. */
export interface ReduceOptions<A> {
  /** Folds one page into the accumulator (`initial` before the first page). The
   * accumulator must be JSON-compatible: the processor stores it between pages. */
  fold: (accumulator: A, items: Item[]) => MaybePromise<A>;
  /** The answers of one page, given the final accumulator. */
  apply: (accumulator: A, items: Item[]) => MaybePromise<ApplyAnswer>;
  /** The partition result from the final accumulator (default: the accumulator). */
  result?: (accumulator: A) => unknown;
  /** The accumulator before the first page (default `null`). */
  initial?: A;
}

/**
 * A reduce of any size from plain functions. Failed items (`item.failed`) reach `fold`
 * and `apply` too, so a reduce can report them; answers for them are refused by the
 * processor.
 *
 * @throws TypeError (constructing) `fold` or `apply` is not a function.
 */
export class Reduce<A = unknown> {
  readonly options: ReduceOptions<A>;

  constructor(options: ReduceOptions<A>) {
    for (const name of ["fold", "apply"] as const) {
      if (typeof options?.[name] !== "function") {
        throw new TypeError(`new Reduce({${name}}) must be a function, got ${typeof options?.[name]}`);
      }
    }
    if (options.result !== undefined && typeof options.result !== "function") {
      throw new TypeError(`new Reduce({result}) must be a function, got ${typeof options.result}`);
    }
    this.options = options;
  }

  /** Answers one reduce request, whatever its pass; throws what the functions throw. */
  async call(page: ReducePage): Promise<Reduced> {
    const { fold, apply } = this.options;
    const items = [...page.items];
    if (page.pass === "apply") return answers(await apply(page.accumulator as A, items));
    const start = page.pass === "all" || page.page === 0
      ? (this.options.initial ?? null) as A : page.accumulator as A;
    const accumulator = await fold(start, items);
    if (page.pass === "fold") {
      if (!page.last) return { accumulator };
      return { accumulator, result: await this.result(accumulator) };
    }
    const answered = answers(await apply(accumulator, items));
    return { ...answered, result: "result" in answered ? answered.result : await this.result(accumulator) };
  }

  private async result(accumulator: A): Promise<unknown> {
    return this.options.result ? this.options.result(accumulator) : accumulator;
  }
}

/** Wraps a plain reduce function: it answers `"all"` requests, and a paged request gets
 * a final error naming the fix. */
export function wholeGateOnly(reduce: ReduceFunction): ReduceFunction {
  return async (page) => {
    if (page.pass !== "all") {
      throw new Fail("this gate holds more items than one reduce page, and the handler's "
        + "reduce function takes the whole gate at once; serve it with new Reduce({fold, apply}) "
        + "or raise the processor's --reduce-page-items");
    }
    return reduce(page);
  };
}

function answers(value: ApplyAnswer): Reduced {
  if (value instanceof Map) return { items: Object.fromEntries(value) };
  if (typeof value === "object" && value !== null && REDUCED in value) return { ...value } as Reduced;
  if (typeof value === "object" && value !== null && !Array.isArray(value)) {
    return { items: value as Record<string, Result> };
  }
  throw new TypeError(`new Reduce({apply}) must return {itemId: result}, a Map, or reduced({...}), `
    + `got ${Array.isArray(value) ? "an array" : typeof value}`);
}
