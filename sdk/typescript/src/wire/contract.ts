/**
 * The HTTP handler contract, handler side, as pure functions: requests to items and
 * results to JSON text. Nothing here does I/O, so every rule is tested with plain
 * values; the app only moves bytes between these functions and a server.
 *
 * The contract is stated once, in `docs/reference/http-contract.md`. What the SDK adds
 * (as the Python SDK does): all five per-item headers are required (a missing or bad
 * one is a 400 naming it), and an error object carries `"retry_after": seconds` when
 * the handler asked for a delay.
 */
import { Buffer } from "node:buffer";

import {
  Item, MAX_GATE, MAX_WAIT_SECONDS, shorten,
  type Result, type Spawn, type Wait,
} from "../model.js";

/** The processor keeps no more of an error message than this. */
export const MAX_ERROR_MESSAGE_CHARS = 1000;
const SHOWN_VALUE_CHARS = 40;

export const HEADER_PARTITION = "x-partition-id";
export const HEADER_ITEM = "x-item-id";
export const HEADER_GATE = "x-gate";
export const HEADER_ATTEMPT = "x-attempt";
export const HEADER_KEY = "idempotency-key";
/** Optional: without it the item cannot park. */
export const HEADER_TOKEN = "x-completion-token";
const HEADER_NAMES: Record<string, string> = {
  [HEADER_PARTITION]: "X-Partition-Id", [HEADER_ITEM]: "X-Item-Id", [HEADER_GATE]: "X-Gate",
  [HEADER_ATTEMPT]: "X-Attempt", [HEADER_KEY]: "Idempotency-Key",
};
const REQUIRED_HEADERS_TEXT = Object.values(HEADER_NAMES).join(", ");
export const BATCH_FIELDS = [
  "partition_id", "item_id", "gate", "attempt", "idempotency_key", "data_b64",
] as const;
const RESULT_KEYS = new Set(["gate", "done", "data", "spawn", "snooze", "wait"]);
const SPAWN_KEYS = new Set(["id", "data", "gate"]);
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Reads one request header by its lower-case name. */
export type HeaderReader = (name: string) => string | undefined;

/** The request breaks the contract: answered with `status` and `no_retry`. The message
 * names the header or field and what was expected. */
export class BadRequest extends Error {
  readonly status: number;

  constructor(message: string, status = 400) {
    super(message);
    this.name = "BadRequest";
    this.status = status;
  }
}

/** A handler function returned what cannot be sent as a result: a bug in the handler,
 * answered as a retryable 500 so a fixed handler can still process the item. */
export class ResultError extends TypeError {
  constructor(message: string) {
    super(message);
    this.name = "ResultError";
  }
}

// ------------------------------------------------------------------------- requests

/**
 * The {@link Item} of a single-item request.
 *
 * @throws BadRequest a required header is missing, an id is not valid percent-encoded
 *   UTF-8, or `X-Gate`/`X-Attempt` is not an integer in range (the message names it).
 */
export function parseItem(header: HeaderReader, body: Uint8Array): Item {
  return new Item({
    id: textHeader(header, HEADER_ITEM),
    partitionId: textHeader(header, HEADER_PARTITION),
    gate: intHeader(header, HEADER_GATE, 0),
    attempt: intHeader(header, HEADER_ATTEMPT, 1),
    idempotencyKey: textHeader(header, HEADER_KEY),
    data: body,
    completionToken: header(HEADER_TOKEN) ?? "",
  });
}

/**
 * The entries of a batch request body, not yet checked one by one.
 *
 * @throws BadRequest the body is not a JSON array.
 */
export function parseBatch(body: Uint8Array): unknown[] {
  const expected = `expected an array of objects with the fields ${BATCH_FIELDS.join(", ")}`;
  let document: unknown;
  try {
    document = JSON.parse(Buffer.from(body).toString("utf8"));
  } catch (error) {
    throw new BadRequest(`the batch body is not valid JSON (${(error as Error).message}); ${expected}`);
  }
  if (!Array.isArray(document)) {
    throw new BadRequest(`the batch body is a JSON ${jsonType(document)}; ${expected}`);
  }
  return document;
}

/**
 * The {@link Item} of the batch entry at `position` (0-based).
 *
 * @throws BadRequest the entry is not an object, or a field is missing or wrong (the
 *   message names the position and the field).
 */
export function parseBatchEntry(position: number, entry: unknown): Item {
  const where = `batch entry ${position}`;
  const fields = checkEntry(where, entry, BATCH_FIELDS, "entry",
    ["partition_id", "item_id", "idempotency_key", "data_b64"]);
  const token = fields["completion_token"];
  return new Item({
    id: fields["item_id"] as string,
    partitionId: fields["partition_id"] as string,
    gate: entryNumber(where, fields, "gate", 0),
    attempt: entryNumber(where, fields, "attempt", 1),
    idempotencyKey: fields["idempotency_key"] as string,
    data: entryData(where, fields),
    completionToken: typeof token === "string" ? token : "",
  });
}

/**
 * `entry` as an object with every one of `fields`, and `strings` among them strings.
 *
 * @throws BadRequest it is not; the message names `where` and the field.
 */
export function checkEntry(where: string, entry: unknown, fields: readonly string[], noun: string,
                           strings: readonly string[]): Record<string, unknown> {
  if (!isObject(entry)) throw new BadRequest(`${where} is a JSON ${jsonType(entry)}, not an object`);
  const missing = fields.filter((name) => !(name in entry));
  if (missing.length > 0) {
    throw new BadRequest(`${where} has no ${missing.map((name) => `'${name}'`).join(", ")}; `
      + `every ${noun} needs ${fields.join(", ")}`);
  }
  for (const name of strings) {
    if (typeof entry[name] !== "string") {
      throw new BadRequest(`${where}: '${name}' must be a string, got ${showValue(entry[name])}`);
    }
  }
  return entry;
}

/** `entry[name]` if it is an integer from `minimum` to {@link MAX_GATE}.
 * @throws BadRequest it is not. */
export function entryNumber(where: string, entry: Record<string, unknown>, name: string,
                            minimum: number): number {
  const value = entry[name];
  if (!isInteger(value) || value < minimum || value > MAX_GATE) {
    throw new BadRequest(`${where}: '${name}' must be an integer from ${minimum} to ${MAX_GATE}, `
      + `got ${showValue(value)}`);
  }
  return value;
}

/** The bytes of `entry.data_b64`. @throws BadRequest it is not standard base64. */
export function entryData(where: string, entry: Record<string, unknown>): Uint8Array {
  const text = entry["data_b64"];
  if (typeof text !== "string" || !BASE64.test(text)) {
    throw new BadRequest(`${where}: 'data_b64' is not valid base64 (standard alphabet, with = padding)`);
  }
  return Buffer.from(text, "base64");
}

function textHeader(header: HeaderReader, name: string): string {
  const raw = header(name);
  if (raw === undefined) throw missing(name);
  // Node reads header bytes as latin-1: raw UTF-8 from other callers is taken too.
  // eslint-disable-next-line no-control-regex
  const value = /^[\x00-\x7f]*$/.test(raw) ? raw : decodeUtf8(name, raw);
  if (!value.includes("%")) return value;
  try {
    return decodeURIComponent(value);
  } catch {
    throw new BadRequest(`header ${HEADER_NAMES[name]} is not valid percent-encoded UTF-8: `
      + JSON.stringify(shorten(value, SHOWN_VALUE_CHARS)));
  }
}

function decodeUtf8(name: string, raw: string): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(raw, "latin1"));
  } catch {
    throw new BadRequest(`header ${HEADER_NAMES[name]} is neither ASCII nor UTF-8; percent-encode it`);
  }
}

function intHeader(header: HeaderReader, name: string, minimum: number): number {
  const raw = header(name);
  if (raw === undefined) throw missing(name);
  // Digits only: no sign, spaces, "_" or "1.0".
  const value = /^[0-9]{1,19}$/.test(raw) ? Number(raw) : Number.NaN;
  if (!(value >= minimum && value <= MAX_GATE)) {
    throw new BadRequest(`header ${HEADER_NAMES[name]} must be an integer from ${minimum} to `
      + `${MAX_GATE}, got ${JSON.stringify(shorten(raw, SHOWN_VALUE_CHARS))}`);
  }
  return value;
}

function missing(name: string): BadRequest {
  return new BadRequest(`missing header ${HEADER_NAMES[name]}; a statefeed processor sends `
    + `${REQUIRED_HEADERS_TEXT} with every item`);
}

// ------------------------------------------------------------------------- answers

/**
 * The {@link Result} a handler function's return value stands for, checked.
 *
 * `undefined` and `null` are refused: almost always a forgotten `return`, and both
 * "complete" and "run again" would silently do the wrong thing.
 *
 * @throws ResultError the value is not an object of {@link Result}'s fields, or a
 *   field has the wrong type or value (the message names it and the fix).
 */
export function coerceResult(value: unknown, owner = "the handler"): Result {
  if (value === undefined || value === null) {
    throw new ResultError(`${owner} returned ${String(value)}; return {done: true} to complete `
      + "the item, {gate: g} to move it to gate g, or {} to run it again");
  }
  if (!isObject(value)) {
    throw new ResultError(`${owner} returned a ${jsonType(value)}; return a result object `
      + "with 'gate', 'done', 'data', 'spawn', 'snooze' or 'wait'");
  }
  const unknown = Object.keys(value).filter((key) => !RESULT_KEYS.has(key));
  if (unknown.length > 0) {
    throw new ResultError(`${owner} returned a result with unknown keys `
      + `${JSON.stringify(unknown.sort())}; use only 'gate', 'done', 'data', 'spawn', 'snooze' and 'wait'`);
  }
  const result = value as Result;
  checkGate("result", result.gate);
  if (result.done !== undefined && result.done !== null && typeof result.done !== "boolean") {
    throw new ResultError(`result.done must be true or false, got ${showValue(result.done)}`);
  }
  const moves = result.done === true || (result.gate !== undefined && result.gate !== null);
  if (result.snooze !== undefined && result.snooze !== null) {
    if (typeof result.snooze !== "number" || !(result.snooze > 0) || result.snooze === Infinity) {
      throw new ResultError(`result.snooze must be a number of seconds above 0, got ${showValue(result.snooze)}`);
    }
    if (moves) {
      throw new ResultError("result.snooze keeps the item at its gate to call it again later; "
        + "it cannot come with done or gate");
    }
  }
  if (result.wait !== undefined && result.wait !== null) {
    checkWait(result.wait);
    if (moves || (result.snooze !== undefined && result.snooze !== null)) {
      throw new ResultError("result.wait parks the item at its gate; it cannot come with done, "
        + "gate or snooze");
    }
  }
  if (result.spawn !== undefined && result.spawn !== null) checkSpawn("result", result.spawn);
  return result;
}

function checkWait(wait: unknown): void {
  const object: Record<string, unknown> = isObject(wait) ? wait : { timeout: wait };
  const unknown = Object.keys(object).filter((key) => key !== "timeout" && key !== "on_timeout");
  if (unknown.length > 0) {
    throw new ResultError(`result.wait takes 'timeout' and 'on_timeout', got ${JSON.stringify(unknown)}`);
  }
  const timeout = object["timeout"];
  if (typeof timeout !== "number" || !(timeout > 0 && timeout <= MAX_WAIT_SECONDS)) {
    throw new ResultError(`result.wait timeout must be a number of seconds above 0 and at most `
      + `${MAX_WAIT_SECONDS} (30 days), got ${showValue(timeout)}`);
  }
  const onTimeout = object["on_timeout"];
  if (onTimeout !== undefined && onTimeout !== null && onTimeout !== "retry" && onTimeout !== "fail") {
    throw new ResultError(`result.wait on_timeout must be 'retry' or 'fail', got ${showValue(onTimeout)}`);
  }
}

/** @throws ResultError `gate` is neither absent nor an integer from 0 to MAX_GATE. */
export function checkGate(owner: string, gate: unknown): void {
  if (gate === undefined || gate === null) return;
  if (!isInteger(gate) || gate < 0 || gate > MAX_GATE) {
    throw new ResultError(`${owner}.gate must be an integer from 0 to ${MAX_GATE}, got ${showValue(gate)}`);
  }
}

/** @throws ResultError `spawn` is not an array of {id, data, gate?}. */
export function checkSpawn(owner: string, spawn: unknown): void {
  if (!Array.isArray(spawn)) {
    throw new ResultError(`${owner}.spawn must be an array of {id, data, gate?}, got ${jsonType(spawn)}`);
  }
  spawn.forEach((child: unknown, position) => {
    const where = `${owner}.spawn[${position}]`;
    if (!isObject(child) || !("data" in child) || Object.keys(child).some((key) => !SPAWN_KEYS.has(key))) {
      const keys = isObject(child) ? JSON.stringify(Object.keys(child)) : jsonType(child);
      throw new ResultError(`${where} must have 'id' and 'data' (and 'gate'), got ${keys}`);
    }
    if (typeof child["id"] !== "string" || child["id"] === "") {
      throw new ResultError(`${where}.id must be a non-empty string, got ${showValue(child["id"])}`);
    }
    checkGate(where, child["gate"]);
  });
}

/**
 * The JSON body of a successful answer: only the keys that say something (`gate` when
 * set, `done` when true, `data_b64` for bytes, `data` for any other value present).
 *
 * @throws ResultError data cannot be encoded as strict JSON (NaN, Infinity, a BigInt,
 *   a cycle).
 */
export function encodeResult(result: Result): string {
  return encodeJson(resultPayload(result, true), "the handler's result");
}

/** The wire object of one result (`spawn`, `snooze` and `wait` when `full`). */
export function resultPayload(result: Result, full: boolean): Record<string, unknown> {
  const payload: Record<string, unknown> = {};
  if (result.gate !== undefined && result.gate !== null) payload["gate"] = result.gate;
  if (result.done === true) payload["done"] = true;
  putData(payload, "data", result.data);
  if (!full) return payload;
  if (result.spawn && result.spawn.length > 0) payload["spawn"] = spawnPayload(result.spawn);
  if (result.snooze !== undefined && result.snooze !== null) payload["snooze"] = result.snooze;
  if (result.wait !== undefined && result.wait !== null) {
    const wait: Wait = typeof result.wait === "number" ? { timeout: result.wait } : result.wait;
    payload["wait"] = wait.on_timeout ? { timeout: wait.timeout, on_timeout: wait.on_timeout }
      : { timeout: wait.timeout };
  }
  return payload;
}

/** The `spawn` array of an answer. */
export function spawnPayload(spawn: readonly Spawn[]): Record<string, unknown>[] {
  return spawn.map((child) => {
    const entry: Record<string, unknown> = { id: child.id };
    if (child.gate !== undefined && child.gate !== null) entry["gate"] = child.gate;
    if (child.data instanceof Uint8Array) entry["data_b64"] = base64(child.data);
    else entry["data"] = child.data === undefined ? null : child.data;
    return entry;
  });
}

/** Puts `value` under `key` (`<key>_b64` for bytes); nothing for `undefined`. */
export function putData(payload: Record<string, unknown>, key: string, value: unknown): void {
  if (value === undefined) return;
  if (value instanceof Uint8Array) payload[`${key}_b64`] = base64(value);
  else payload[key] = value;
}

/**
 * `value` as compact strict JSON.
 *
 * @throws ResultError it holds NaN or an infinity (which `JSON.stringify` would turn
 *   into `null` silently), a BigInt or a cycle.
 */
export function encodeJson(value: unknown, what: string): string {
  try {
    return JSON.stringify(value, strictNumbers);
  } catch (error) {
    throw new ResultError(`${what} cannot be encoded as JSON (${shorten((error as Error).message,
      MAX_ERROR_MESSAGE_CHARS)}); return JSON-compatible values (objects, arrays, strings, `
      + "finite numbers, booleans, null) or a Uint8Array");
  }
}

function strictNumbers(_key: string, value: unknown): unknown {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new TypeError(`${value} is not valid JSON`);
  }
  return value;
}

/** The JSON body of an error answer, its message cut to {@link MAX_ERROR_MESSAGE_CHARS}.
 * Never throws. */
export function encodeError(message: string, noRetry: boolean, retryAfter?: number): string {
  const error: Record<string, unknown> = {
    message: shorten(message, MAX_ERROR_MESSAGE_CHARS), no_retry: noRetry,
  };
  if (retryAfter !== undefined) error["retry_after"] = retryAfter;
  return JSON.stringify({ error });
}

/** A `Retry-After` value: whole seconds, rounded up so the delay is a minimum. */
export function retryAfterHeader(seconds: number): string {
  return String(Math.ceil(seconds));
}

/** `"<ErrorName>: <message>"` (just the name when the message is empty). */
export function exceptionMessage(error: unknown): string {
  if (error instanceof Error) return error.message ? `${error.name}: ${error.message}` : error.name;
  return `thrown: ${showValue(error)}`;
}

export function showValue(value: unknown): string {
  try {
    const text = JSON.stringify(value);
    return text === undefined ? String(value) : shorten(text, SHOWN_VALUE_CHARS);
  } catch {
    return typeof value;
  }
}

export function jsonType(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "object") return "object";
  if (typeof value === "string") return "string";
  if (typeof value === "boolean") return "boolean";
  if (typeof value === "number") return "number";
  return typeof value;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value)
    && !(value instanceof Uint8Array);
}

function isInteger(value: unknown): value is number {
  return typeof value === "number" && Number.isInteger(value);
}

function base64(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}
