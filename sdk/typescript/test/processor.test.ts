// The SDK against a real processor: `processor run` and `processor api` as subprocesses on
// a throwaway SQLite file (the test kit), with the handler served by node:http in this
// process. Needs the CLI: PROCESSOR_BIN, or `processor` on the PATH (skipped without it).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import type { IncomingMessage, ServerResponse } from "node:http";
import { after, before, describe, it } from "node:test";

import {
  AlreadyCompletedError, Fail, PartitionExistsError, PartitionNotFoundError, WaitNotFoundError, Retry, app, type FeedEvent, type Item, type Result,
  type StatefeedApp,
} from "@statefeed/sdk";
import { Testbed } from "@statefeed/sdk/testkit";

const BIN = process.env["PROCESSOR_BIN"] ?? "processor";
const missing = spawnSync(BIN, ["--version"]).error
  ? `the processor CLI (${BIN}) cannot be run: set PROCESSOR_BIN` : false;
const FILES = 5;

async function until<T>(what: string, check: () => T | undefined | false, timeout = 30_000): Promise<T> {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe("a pipeline through a real processor", { skip: missing }, () => {
  const tokens = new Map<string, string>();
  const calls: { partition: string; attempt: number; at: number }[] = [];

  // Gate 0: a folder spawns its files; each file parks until someone approves it.
  // Gate 1 (a reduce gate): the approved files' total; the reduce spawns a report at gate 2.
  function step(item: Item): Result {
    calls.push({ partition: item.partitionId, attempt: item.attempt, at: Date.now() });
    if (item.partitionId === "refused") throw new Fail("unreadable scan");
    if (item.partitionId === "busy") {
      if (calls.filter((call) => call.partition === "busy").length === 1) {
        throw new Retry("the scanner is busy", { retryAfter: 1 });
      }
      return { done: true };
    }
    if (item.gate === 2) return { done: true, data: { ...item.json<object>(), filed: true } };
    const data = item.json();
    if (item.id === "folder") {
      return { done: true, spawn: Array.from({ length: data.files }, (_, n) =>
        ({ id: `folder/file-${n}`, data: { n } })) };
    }
    tokens.set(item.id, item.completionToken);
    return { wait: { timeout: 60 }, data: { ...data, asked: true } };
  }
  const handler = app({ 0: step, 2: step }, {
    reduce: (page) => {
      const approved = page.items.map((item) => item.json()).filter((file) => file.approved);
      return {
        result: { total: approved.reduce((sum, file) => sum + file.n, 0), approved: approved.length },
        spawn: [{ id: "report", data: { approved: approved.length } }],
      };
    },
  });
  let bed: Testbed;

  before(async () => {
    bed = await Testbed.start(handler);
  });
  after(async () => {
    await bed?.stop();
  });

  it("spawns, parks, is completed through the client, reduces and spawns again", async () => {
    await bed.create("pipeline", [{ id: "folder", data: { files: FILES } }], { reduce_gates: [1] });
    const events: FeedEvent[] = [];
    const watching = (async () => {
      for await (const event of bed.client.watch("pipeline", { interval: 100 })) events.push(event);
    })();
    await until("every file to park", () => tokens.size === FILES);
    const parked = await bed.client.get("pipeline");
    assert.equal(parked.gate, 0, "the gate holds while items wait");
    const token0 = tokens.get("folder/file-0")!;
    const beat = await bed.client.heartbeat(token0, 600);
    assert.ok(Date.parse(`${beat.deadline.replace(/Z?$/, "Z")}`) > Date.now() + 500_000, beat.deadline);
    for (const [id, token] of tokens) {
      const n = Number(id.split("-").at(-1));
      const completed = await bed.client.complete(token, { gate: 1, data: { n, approved: n % 2 === 0 } });
      assert.equal(completed.item_id, id);
    }
    await assert.rejects(bed.client.complete(token0, {}), AlreadyCompletedError);

    const partition = await bed.runToEnd("pipeline");
    assert.equal(partition.status, "complete", partition.last_error ?? "");
    assert.deepEqual(partition.result, { total: 0 + 2 + 4, approved: 3 });
    assert.equal(partition.spawned, FILES + 1);
    assert.deepEqual(partition.counts, { complete: FILES + 2 });
    const file = await bed.history("pipeline", "folder/file-3");
    assert.equal(file.parent, "folder");
    assert.deepEqual(file.data, { n: 3, approved: false });
    const report = await bed.history("pipeline", "report");
    assert.deepEqual([report.gate, report.data], [2, { approved: 3, filed: true }]);

    await watching;
    assert.ok(events.some((event) => event.kind === "gate" && event.data.from === 0),
      JSON.stringify(events));
    assert.equal(events.at(-1)?.kind, "end");
    assert.equal(events.at(-1)?.data.status, "complete");
  });

  it("fails an item at once on a non-retryable error, with the handler's message", async () => {
    await bed.create("refused", [{ id: "scan", data: {} }]);
    const partition = await bed.runToEnd("refused");
    assert.equal(partition.status, "failed");
    const scan = await bed.history("refused", "scan");
    assert.equal(scan.status, "failed");
    assert.equal(scan.attempts, 1, "not retried");
    assert.match(scan.last_error ?? "", /HTTP 422: unreadable scan\b/);
    assert.equal(calls.filter((call) => call.partition === "refused").length, 1);
  });

  it("holds its calls for Retry-After, spending no attempt", async () => {
    await bed.create("busy", [{ id: "x", data: {} }]);
    const partition = await bed.runToEnd("busy");
    assert.equal(partition.status, "complete");
    const [first, second] = calls.filter((call) => call.partition === "busy");
    assert.ok(first && second);
    assert.ok(second.at - first.at >= 900, `called again after ${second.at - first.at} ms`);
    assert.equal(second.attempt, 1, "the Retry-After spent no attempt");
  });
});

describe("the client's answers and errors", { skip: missing }, () => {
  let bed: Testbed;

  before(async () => {
    bed = await Testbed.start(app(() => ({ done: true })), { runArgs: ["--manual-checkpoint"] });
  });
  after(async () => {
    await bed?.stop();
  });

  it("creates idempotently, adds, lists, and names each refusal", async () => {
    const key = { idempotencyKey: "k-1" };
    const first = await bed.client.create("ledger/2026", [{ id: "a", data: new Uint8Array([0, 255]) }], {}, key);
    const again = await bed.client.create("ledger/2026", [{ id: "a", data: new Uint8Array([0, 255]) }], {}, key);
    assert.deepEqual(again, first);
    await assert.rejects(bed.client.create("ledger/2026", []), PartitionExistsError);
    assert.equal((await bed.client.add("ledger/2026", [{ id: "b", data: { n: 1 } }])).added, 1);
    const page = await bed.client.items("ledger/2026");
    assert.deepEqual(page.items.map((item) => [item.id, item.data ?? item.data_b64]),
      [["a", "AP8="], ["b", { n: 1 }]]);
    const listed = await bed.client.list({ prefix: "ledger/" });
    assert.deepEqual(listed.partitions.map((partition) => partition.id), ["ledger/2026"]);
    await assert.rejects(bed.client.get("nope"), (error: PartitionNotFoundError) =>
      error instanceof PartitionNotFoundError && error.status === 404 && /nope/.test(error.message));
    await assert.rejects(bed.client.heartbeat("not-a-token", 10), WaitNotFoundError);
  });
});

describe("the batch protocol through a real processor", { skip: missing }, () => {
  const paths: string[] = [];
  const handler = app(async (item) => ({ done: true, data: { doubled: item.json().n * 2 } }));
  // The same app, counting which route each request took.
  const counting: StatefeedApp = Object.assign(
    (request: IncomingMessage, response: ServerResponse) => {
      if (request.method === "POST") paths.push(request.url ?? "");
      handler(request, response);
    }, { app: handler.app, fetch: handler.fetch });
  let bed: Testbed;

  before(async () => {
    bed = await Testbed.start(counting, { runArgs: ["--handler-batch-size", "8"] });
  });
  after(async () => {
    await bed?.stop();
  });

  it("answers every item of a batch from the same function", async () => {
    await bed.create("numbers", Array.from({ length: 6 }, (_, n) => ({ id: `n${n}`, data: { n } })));
    const partition = await bed.runToEnd("numbers");
    assert.equal(partition.status, "complete");
    const page = await bed.client.items("numbers");
    assert.deepEqual(page.items.map((item) => item.data), [0, 2, 4, 6, 8, 10].map((doubled) => ({ doubled })));
    assert.ok(paths.length > 0 && paths.every((path) => path === "/batch"), paths.join(" "));
  });
});
