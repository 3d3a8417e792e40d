// The handler side without a processor: the wire module's rules, and the app's routes
// through its Fetch API face and the Hono adapter.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Hono } from "hono";

import {
  Fail, Item, ItemDataError, Reduce, Retry, app, type ReducePage, type Result,
} from "@statefeed/sdk";
import { statefeed } from "@statefeed/sdk/hono";
import {
  BadRequest, ResultError, coerceResult, encodeResult, parseItem,
} from "@statefeed/sdk/wire";

const encoder = new TextEncoder();
const HEADERS: Record<string, string> = {
  "x-partition-id": "opening%2F42", "x-item-id": "r%C3%A9sum%C3%A9-1", "x-gate": "0",
  "x-attempt": "1", "idempotency-key": "k1", "x-completion-token": "tok",
};

function post(path: string, body: string, headers: Record<string, string> = HEADERS): Request {
  return new Request(`http://handler${path}`, { method: "POST", body, headers });
}

describe("the wire", () => {
  it("decodes percent-encoded ids and the token from the headers", () => {
    const item = parseItem((name) => HEADERS[name], encoder.encode('{"a":1}'));
    assert.equal(item.partitionId, "opening/42");
    assert.equal(item.id, "résumé-1");
    assert.equal(item.completionToken, "tok");
    assert.deepEqual(item.json(), { a: 1 });
    assert.ok(!JSON.stringify(item).includes("tok"), "the token is not enumerable");
  });

  it("refuses a gate header that is not a plain integer, naming it", () => {
    for (const gate of ["-1", "1.0", " 1", "2147483648", ""]) {
      const headers: Record<string, string> = { ...HEADERS, "x-gate": gate };
      assert.throws(() => parseItem((name) => headers[name], new Uint8Array()),
        (error: BadRequest) => error instanceof BadRequest && /X-Gate/.test(error.message));
    }
  });

  it("refuses a missing header, naming it", () => {
    const { "idempotency-key": _, ...headers } = HEADERS;
    assert.throws(() => parseItem((name) => headers[name], new Uint8Array()), /Idempotency-Key/);
  });

  it("writes only the keys that say something, bytes as base64", () => {
    assert.equal(encodeResult(coerceResult({ done: true })), '{"done":true}');
    assert.equal(encodeResult(coerceResult({})), "{}");
    assert.equal(encodeResult(coerceResult({ gate: 1, data: null })), '{"gate":1,"data":null}');
    assert.equal(encodeResult(coerceResult({ data: encoder.encode("hi") })), '{"data_b64":"aGk="}');
    assert.equal(encodeResult(coerceResult({ spawn: [{ id: "c", data: 1, gate: 2 }], wait: 60 })),
      '{"spawn":[{"id":"c","gate":2,"data":1}],"wait":{"timeout":60}}');
  });

  it("refuses results the processor would refuse, or that JSON would change", () => {
    const refused: unknown[] = [
      undefined, null, "done", { gates: 1 }, { gate: -1 }, { gate: 1.5 }, { done: "yes" },
      { snooze: 0 }, { snooze: 5, done: true }, { wait: 0 }, { wait: { timeout: 5, on_timeout: "x" } },
      { wait: 5, gate: 1 }, { spawn: [{ id: "", data: 1 }] }, { spawn: [{ id: "a" }] },
      { spawn: { id: "a", data: 1 } },
    ];
    for (const value of refused) {
      assert.throws(() => coerceResult(value), ResultError, JSON.stringify(value) ?? "undefined");
    }
    assert.throws(() => encodeResult({ data: { score: Number.NaN } }), /not valid JSON/);
  });

  it("names the item in a reduce page's JSON error only", () => {
    const bad = encoder.encode("{nope");
    assert.throws(() => new Item({ id: "a", partitionId: "p", data: bad }).json(),
      (error: Error) => error instanceof ItemDataError && error.message.startsWith("data is not valid JSON"));
    assert.throws(() => new Item({ id: "a", partitionId: "p", data: bad, inReduce: true }).json(),
      /^ItemDataError: item "a": data is not valid JSON/);
  });
});

describe("the app", () => {
  const handler = app({
    0: (item) => ({ gate: 1, data: { seen: item.json() } }),
    1: (item): Result => {
      const { kind } = item.json();
      if (kind === "retry") throw new Retry("busy", { retryAfter: 1.2 });
      if (kind === "fail") throw new Fail("unreadable scan");
      if (kind === "bug") throw new RangeError("off by one");
      if (kind === "forgot") return undefined as unknown as Result;
      return { done: true };
    },
  });

  it("answers an item routed by its gate", async () => {
    const response = await handler.fetch(post("/", '{"x":1}'));
    assert.equal(response.status, 200);
    assert.deepEqual(await response.json(), { gate: 1, data: { seen: { x: 1 } } });
  });

  it("answers each way a function can end as the contract says", async () => {
    const cases: [string, number, boolean, string | null][] = [
      ["retry", 503, false, "2"], ["fail", 422, true, null], ["bug", 500, false, null],
      ["forgot", 500, false, null],
    ];
    for (const [kind, status, noRetry, retryAfter] of cases) {
      const response = await handler.fetch(post("/", JSON.stringify({ kind }), { ...HEADERS, "x-gate": "1" }));
      const body = await response.json() as { error: { message: string; no_retry: boolean; retry_after?: number } };
      assert.equal(response.status, status, kind);
      assert.equal(body.error.no_retry, noRetry, kind);
      assert.equal(response.headers.get("retry-after"), retryAfter, kind);
      if (kind === "retry") assert.equal(body.error.retry_after, 1.2);
      if (kind === "bug") assert.equal(body.error.message, "RangeError: off by one");
      if (kind === "forgot") assert.match(body.error.message, /returned undefined; return \{done: true\}/);
    }
  });

  it("fails an item at a gate it has no function for, without retry", async () => {
    const response = await handler.fetch(post("/", "{}", { ...HEADERS, "x-gate": "7" }));
    assert.equal(response.status, 422);
    assert.deepEqual(await response.json(),
      { error: { message: "no handler for this gate; this app handles gates 0, 1", no_retry: true } });
  });

  it("answers a batch in order, one bad entry spoiling nothing", async () => {
    const entry = { partition_id: "p", item_id: "a", gate: 0, attempt: 1, idempotency_key: "k",
      data_b64: Buffer.from('{"n":1}').toString("base64") };
    const response = await handler.fetch(post("/batch", JSON.stringify([entry, { ...entry, gate: "x" }])));
    const body = await response.json() as unknown[];
    assert.equal(response.status, 200);
    assert.deepEqual(body[0], { gate: 1, data: { seen: { n: 1 } } });
    assert.match((body[1] as { error: { message: string } }).error.message, /batch entry 1: 'gate'/);
  });

  it("refuses unknown routes, wrong methods and large bodies", async () => {
    assert.equal((await handler.fetch(post("/nope", "{}"))).status, 404);
    const wrong = await handler.fetch(new Request("http://handler/", { method: "GET" }));
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get("allow"), "POST");
    const small = app(() => ({ done: true }), { maxBodyBytes: 4 });
    assert.equal((await small.fetch(post("/", "12345"))).status, 413);
    assert.equal((await small.fetch(new Request("http://handler/healthz"))).status, 200);
  });

  it("says on GET /reduce whether it takes pages", async () => {
    const whole = app(() => ({ done: true }), { reduce: () => ({}) });
    const paged = app(() => ({ done: true }), {
      reduce: new Reduce({ fold: () => 0, apply: () => ({}) }),
    });
    assert.deepEqual(await (await whole.fetch(new Request("http://handler/reduce"))).json(),
      { pages: false, max_body_bytes: 16 * 1024 * 1024 });
    assert.deepEqual(await (await paged.fetch(new Request("http://handler/reduce"))).json(),
      { pages: true, max_body_bytes: 16 * 1024 * 1024 });
  });
});

describe("a reduce", () => {
  const items = [1, 2, 3].map((n) => ({
    item_id: `i${n}`, status: "available", gate: 1, last_error: null,
    data_b64: Buffer.from(JSON.stringify({ n })).toString("base64"),
  }));
  const request = (pass: string, page: number, last: boolean, accumulator: unknown, slice = items) =>
    post("/reduce", JSON.stringify({ partition_id: "p", gate: 1, attempt: 1, pass, page, last,
      idempotency_key: "k", accumulator, items: slice }), { "content-type": "application/json" });
  const sum = new Reduce<number>({
    initial: 0,
    fold: (total, page) => page.reduce((acc, item) => acc + item.json().n, total),
    apply: (total, page) => Object.fromEntries(page.map((item) =>
      [item.id, { done: true, data: { share: item.json().n / total } }])),
    result: (total) => ({ total }),
  });
  const handler = app(() => ({ done: true }), { reduce: sum });

  it("folds, results and applies a whole gate in one call", async () => {
    const body = await (await handler.fetch(request("all", 0, true, null))).json() as Record<string, any>;
    assert.deepEqual(body["result"], { total: 6 });
    assert.deepEqual(body["items"]["i3"], { done: true, data: { share: 0.5 } });
  });

  it("carries the accumulator across fold pages, and applies with the final one", async () => {
    const first = await (await handler.fetch(request("fold", 0, false, null, items.slice(0, 2)))).json();
    assert.deepEqual(first, { accumulator: 3 });
    const last = await (await handler.fetch(request("fold", 1, true, 3, items.slice(2)))).json();
    assert.deepEqual(last, { accumulator: 6, result: { total: 6 } });
    const applied = await (await handler.fetch(request("apply", 0, true, 6, items.slice(0, 1)))).json();
    assert.deepEqual(applied, { items: { i1: { done: true, data: { share: 1 / 6 } } } });
  });

  it("refuses a paged request to a whole-gate function, for good", async () => {
    const whole = app(() => ({ done: true }), { reduce: (page: ReducePage) => ({ result: page.items.length }) });
    const response = await whole.fetch(request("fold", 0, false, null));
    assert.equal(response.status, 422);
    assert.match(((await response.json()) as any).error.message, /new Reduce\(\{fold, apply\}\)/);
  });
});

describe("the Hono adapter", () => {
  it("serves the app under a prefix", async () => {
    const server = new Hono();
    server.get("/", (context) => context.text("home"));
    server.all("/jobs/*", statefeed(app(() => ({ done: true, data: "ok" })), { basePath: "/jobs" }));
    const response = await server.request("/jobs/", { method: "POST", body: "{}", headers: HEADERS });
    assert.equal(response.status, 200);
    assert.deepEqual(await response.json(), { done: true, data: "ok" });
    assert.equal((await server.request("/jobs/healthz")).status, 200);
    assert.equal(await (await server.request("/")).text(), "home");
  });
});
