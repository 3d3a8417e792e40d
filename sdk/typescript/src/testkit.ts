/**
 * A test kit (`@statefeed/sdk/testkit`): runs a handler app in process against a real
 * `processor run` and `processor api` on a throwaway SQLite file, with helpers to
 * create a partition, run it to the end, read an item's history and complete a parked
 * item.
 *
 * ```ts
 * const bed = await Testbed.start(app({ 0: step }));
 * try {
 *   await bed.create("p", [{ id: "a", data: {} }]);
 *   const partition = await bed.runToEnd("p");
 * } finally {
 *   await bed.stop();
 * }
 * ```
 *
 * Needs the `processor` CLI: `PROCESSOR_BIN`, or `processor` on the `PATH`.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { serve } from "./adapters/node.js";
import type { StatefeedApp } from "./serving.js";
import {
  Client, type Completed, type Completion, type CreateSettings, type Created, type NewItem,
  type Partition,
} from "./client/client.js";

/** Options of {@link Testbed.start}. */
export interface TestbedOptions {
  /** The `processor` executable (default `PROCESSOR_BIN`, else `processor`). */
  processorBin?: string;
  /** More `processor run` options, such as `["--handler-batch-size", "8"]`. */
  runArgs?: string[];
  /** Seconds between two polls for free partitions (default 0.1). */
  pollInterval?: number;
}

/** One entry of an item's error history. */
export interface ErrorEntry {
  at: string;
  attempt: number;
  gate: number;
  error: string;
}

/** An item as `processor items P --show ITEM --json` prints it. */
export interface ItemHistory {
  partition: string;
  id: string;
  status: string;
  gate: number;
  attempts: number;
  last_error: string | null;
  parent: string | null;
  data?: unknown;
  error_history: ErrorEntry[];
  [field: string]: unknown;
}

/** A handler app, a processor and the ingest API on a throwaway SQLite database. */
export class Testbed {
  /** A client of the testbed's ingest API. */
  readonly client: Client;
  /** The SQLite database's URL. */
  readonly dbUrl: string;
  /** Where the processor sends items. */
  readonly handlerUrl: string;
  private readonly bin: string;
  private readonly children: ChildProcess[];
  private readonly server: Server;
  private readonly directory: string;
  private stopped = false;

  private constructor(fields: {
    client: Client; dbUrl: string; handlerUrl: string; bin: string; children: ChildProcess[];
    server: Server; directory: string;
  }) {
    this.client = fields.client;
    this.dbUrl = fields.dbUrl;
    this.handlerUrl = fields.handlerUrl;
    this.bin = fields.bin;
    this.children = fields.children;
    this.server = fields.server;
    this.directory = fields.directory;
  }

  /**
   * Serves `handler` on a free loopback port, and starts `processor api` and
   * `processor run` on a new SQLite file.
   *
   * @throws Error the processor CLI cannot be run, or the API did not start (the
   *   message holds its output).
   */
  static async start(handler: StatefeedApp, options: TestbedOptions = {}): Promise<Testbed> {
    const bin = options.processorBin ?? process.env["PROCESSOR_BIN"] ?? "processor";
    const directory = await mkdtemp(join(tmpdir(), "statefeed-testbed-"));
    const dbUrl = `sqlite:///${join(directory, "statefeed.db")}`;
    const children: ChildProcess[] = [];
    const server = await serve(handler, { port: 0 });
    try {
      await run(bin, ["migrate", "--db-url", dbUrl]);
      const api = launch(bin, ["api", "--db-url", dbUrl, "--port", "0", "--log-level", "warning"]);
      children.push(api.child);
      const apiUrl = await api.line(/statefeed ingest API: (http:\/\/\S+?\/)v1\//);
      const handlerUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
      const processor = launch(bin, [
        "run", "--db-url", dbUrl, "--handler-url", handlerUrl, "--health-port", "0",
        "--poll-interval", String(options.pollInterval ?? 0.1), "--lease-duration", "2",
        "--retry-backoff", "0.1", "--log-level", "warning", ...(options.runArgs ?? []),
      ]);
      children.push(processor.child);
      return new Testbed({ client: new Client({ url: apiUrl }), dbUrl, handlerUrl, bin, children,
        server, directory });
    } catch (error) {
      await shutdown(children, server, directory);
      throw error;
    }
  }

  /** Creates partition `id` with `items` through the API. */
  create(id: string, items: readonly NewItem[], settings: CreateSettings = {}): Promise<Created> {
    return this.client.create(id, items, settings);
  }

  /** Waits until partition `id` is complete, failed or cancelled (default 60 s). */
  runToEnd(id: string, options: { timeout?: number } = {}): Promise<Partition> {
    return this.client.wait(id, { timeout: options.timeout ?? 60 });
  }

  /** Item `itemId` of partition `partitionId`: status, gate, attempts, parent, data
   * and error history. */
  async history(partitionId: string, itemId: string): Promise<ItemHistory> {
    const output = await run(this.bin, ["items", partitionId, "--show", itemId, "--all", "--json",
      "--db-url", this.dbUrl]);
    return JSON.parse(output) as ItemHistory;
  }

  /** Completes the parked item `token` names, through the API. */
  complete(token: string, answer: Completion = {}): Promise<Completed> {
    return this.client.complete(token, answer);
  }

  /** Stops the processor, the API and the handler, and deletes the database. Safe to
   * call twice. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await shutdown(this.children, this.server, this.directory);
  }
}

function launch(bin: string, args: string[]): { child: ChildProcess; line: (pattern: RegExp) => Promise<string> } {
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout?.on("data", (chunk: Buffer) => { output += chunk.toString(); });
  child.stderr?.on("data", (chunk: Buffer) => { output += chunk.toString(); });
  const line = (pattern: RegExp): Promise<string> => new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error(`processor ${args[0]} did not start in 30 s:\n${output}`)), 30_000);
    const check = (): void => {
      const match = pattern.exec(output);
      if (match) {
        clearTimeout(timer);
        child.stdout?.off("data", check);
        resolve(match[1] ?? match[0]);
      }
    };
    const fail = (error: Error): void => {
      clearTimeout(timer);
      reject(error);
    };
    child.stdout?.on("data", check);
    child.once("error", (error) => fail(new Error(`cannot run ${bin}: ${error.message}; set PROCESSOR_BIN`)));
    child.once("exit", (code) => fail(new Error(`processor ${args[0]} exited with ${code}:\n${output}`)));
    check();
  });
  return { child, line };
}

function run(bin: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "", stderr = "";
    child.stdout.on("data", (chunk: Buffer) => { stdout += chunk.toString(); });
    child.stderr.on("data", (chunk: Buffer) => { stderr += chunk.toString(); });
    child.once("error", (error) => reject(new Error(`cannot run ${bin}: ${error.message}; set PROCESSOR_BIN`)));
    child.once("exit", (code) => {
      if (code === 0) resolve(stdout);
      else reject(new Error(`${bin} ${args.join(" ")} exited with ${code}: ${stderr || stdout}`));
    });
  });
}

async function shutdown(children: ChildProcess[], server: Server, directory: string): Promise<void> {
  // The processor first, so that it hangs up on the handler rather than the reverse.
  for (const child of [...children].reverse()) await stopChild(child);
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await rm(directory, { recursive: true, force: true });
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const kill = setTimeout(() => child.kill("SIGKILL"), 10_000);
    child.once("exit", () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill("SIGTERM");
  });
}
