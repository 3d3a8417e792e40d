/**
 * Reduce calls, handler side: a reduce request to a {@link ReducePage}, and a reduce
 * function's answer to JSON text. Pure, like `contract.ts`, whose checks it shares.
 */
import { Buffer } from "node:buffer";

import { Item, type Reduced, type ReducePage, type ReducePass, type Result } from "../model.js";
import {
  BadRequest, ResultError, checkEntry, checkSpawn, coerceResult, encodeJson, entryData,
  entryNumber, isObject, jsonType, putData, resultPayload, showValue, spawnPayload,
} from "./contract.js";

export const REDUCE_PASSES: readonly ReducePass[] = ["all", "fold", "apply"];
export const REDUCE_FIELDS = [
  "partition_id", "gate", "attempt", "pass", "page", "last", "idempotency_key", "items",
] as const;
const REDUCE_ITEM_FIELDS = ["item_id", "status", "gate", "data_b64"] as const;
const REDUCED_KEYS = new Set(["items", "default", "result", "accumulator", "spawn"]);

/**
 * The {@link ReducePage} of a reduce request body.
 *
 * @throws BadRequest the body is not a JSON object with the reduce fields, or a field
 *   has the wrong type or value (the message names it).
 */
export function parseReduce(body: Uint8Array): ReducePage {
  let document: unknown;
  try {
    document = JSON.parse(Buffer.from(body).toString("utf8"));
  } catch (error) {
    throw new BadRequest(`the reduce body is not valid JSON (${(error as Error).message})`);
  }
  if (!isObject(document)) {
    throw new BadRequest(`the reduce body is a JSON ${jsonType(document)}; expected an object `
      + `with the fields ${REDUCE_FIELDS.join(", ")}`);
  }
  const missing = REDUCE_FIELDS.filter((name) => !(name in document));
  if (missing.length > 0) {
    throw new BadRequest(`the reduce body has no ${missing.map((name) => `'${name}'`).join(", ")}; `
      + `a statefeed processor sends ${REDUCE_FIELDS.join(", ")}`);
  }
  for (const name of ["partition_id", "idempotency_key"]) {
    if (typeof document[name] !== "string") {
      throw new BadRequest(`reduce field '${name}' must be a string, got ${showValue(document[name])}`);
    }
  }
  const pass = document["pass"];
  if (!REDUCE_PASSES.includes(pass as ReducePass)) {
    throw new BadRequest(`reduce field 'pass' must be one of ${REDUCE_PASSES.join(", ")}, `
      + `got ${showValue(pass)}`);
  }
  const gate = entryNumber("the reduce body", document, "gate", 0);
  const attempt = entryNumber("the reduce body", document, "attempt", 1);
  const page = entryNumber("the reduce body", document, "page", 0);
  if (typeof document["last"] !== "boolean") {
    throw new BadRequest(`reduce field 'last' must be true or false, got ${showValue(document["last"])}`);
  }
  const entries = document["items"];
  if (!Array.isArray(entries)) {
    throw new BadRequest(`reduce field 'items' must be an array, got ${showValue(entries)}`);
  }
  const partitionId = document["partition_id"] as string;
  const idempotencyKey = document["idempotency_key"] as string;
  const items = entries.map((entry: unknown, position) => {
    const where = `reduce item ${position}`;
    const fields = checkEntry(where, entry, REDUCE_ITEM_FIELDS, "item", ["item_id", "status", "data_b64"]);
    const lastError = fields["last_error"] ?? null;
    if (lastError !== null && typeof lastError !== "string") {
      throw new BadRequest(`${where}: 'last_error' must be a string or null, got ${showValue(lastError)}`);
    }
    return new Item({
      id: fields["item_id"] as string, partitionId, gate: entryNumber(where, fields, "gate", 0),
      attempt, idempotencyKey, data: entryData(where, fields), status: fields["status"] as string,
      lastError, inReduce: true,
    });
  });
  return {
    partitionId, gate, attempt, pass: pass as ReducePass, page, last: document["last"],
    idempotencyKey, items, accumulator: document["accumulator"] ?? null,
  };
}

/**
 * The {@link Reduced} a reduce function's return value stands for, checked.
 *
 * @throws ResultError it is not an object of Reduced's fields, an item's result is
 *   refused, or an item's result spawns (a reduce spawns from `spawn` at the top).
 */
export function coerceReduced(value: unknown): Reduced {
  if (!isObject(value)) {
    throw new ResultError(`the reduce function returned ${value === undefined ? "undefined"
      : `a ${jsonType(value)}`}; return {items, default, result, accumulator, spawn}`);
  }
  const unknown = Object.keys(value).filter((key) => !REDUCED_KEYS.has(key));
  if (unknown.length > 0) {
    throw new ResultError(`the reduce function returned unknown keys ${JSON.stringify(unknown.sort())}; `
      + "use items, default, result, accumulator and spawn");
  }
  const reduced = value as Reduced;
  const results: Result[] = [];
  if (reduced.items !== undefined && reduced.items !== null) {
    if (!isObject(reduced.items)) {
      throw new ResultError(`Reduced.items must map item ids to results, got ${jsonType(reduced.items)}`);
    }
    for (const [id, result] of Object.entries(reduced.items)) {
      results.push(coerceResult(result, `the reduce function's result for item ${JSON.stringify(id)}`));
    }
  }
  if (reduced.default !== undefined && reduced.default !== null) {
    results.push(coerceResult(reduced.default, "the reduce function's default"));
  }
  if (results.some((result) => result.spawn && result.spawn.length > 0)) {
    throw new ResultError("a reduce spawns from Reduced.spawn, not from an item's result");
  }
  if (reduced.spawn !== undefined && reduced.spawn !== null) checkSpawn("Reduced", reduced.spawn);
  return reduced;
}

/**
 * The JSON body of a reduce answer.
 *
 * @throws ResultError a value cannot be encoded as strict JSON.
 */
export function encodeReduced(reduced: Reduced): string {
  const payload: Record<string, unknown> = {};
  if (reduced.items && Object.keys(reduced.items).length > 0) {
    payload["items"] = Object.fromEntries(Object.entries(reduced.items)
      .map(([id, result]) => [id, resultPayload(result, false)]));
  }
  if (reduced.default) payload["default"] = resultPayload(reduced.default, false);
  putData(payload, "result", reduced.result);
  if (reduced.accumulator !== undefined) payload["accumulator"] = reduced.accumulator;
  if (reduced.spawn && reduced.spawn.length > 0) payload["spawn"] = spawnPayload(reduced.spawn);
  return encodeJson(payload, "the reduce answer");
}

