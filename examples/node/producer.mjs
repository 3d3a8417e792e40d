// node producer.mjs [partition]: stream 10,000 numbers to the ingest API as NDJSON, wait
// for the partition to finish, print its status, counts and result. The API is at
// PROCESSOR_API_URL (default http://127.0.0.1:8091/), with PROCESSOR_API_TOKEN if it has one.
const base = process.env.PROCESSOR_API_URL ?? "http://127.0.0.1:8091/";
const token = process.env.PROCESSOR_API_TOKEN;
const id = process.argv[2] ?? "numbers";
const ITEMS = 10_000, LINES_PER_CHUNK = 1_000, ATTEMPTS = 5;
const headers = token ? { Authorization: `Bearer ${token}` } : {};

function fail(message) {
  console.error(`producer: ${message}`);
  process.exit(1);
}

function url(path) {
  try {
    return new URL(`v1/partitions/${encodeURIComponent(id)}${path}`, base);
  } catch {
    fail(`PROCESSOR_API_URL must be the API's URL, such as http://127.0.0.1:8091/; got ${base}`);
  }
}

// A fresh body for each attempt: a stream is read once. Each line is one item.
function ndjson() {
  let next = 0;
  return new ReadableStream({
    pull(controller) {
      let lines = "";
      for (const end = Math.min(next + LINES_PER_CHUNK, ITEMS); next < end; next++)
        lines += JSON.stringify({ id: `n${next}`, data: { n: next } }) + "\n";
      controller.enqueue(new TextEncoder().encode(lines));
      if (next === ITEMS) controller.close();
    },
  });
}

// Sends a request, again on a network error (the same request, so the same key).
async function send(what, request) {
  for (let attempt = 1; ; attempt++) {
    try {
      const response = await request();
      const text = await response.text();
      let body = {};
      try { body = JSON.parse(text); } catch { /* not JSON: a proxy's page, say */ }
      if (!response.ok)
        fail(`${what}: HTTP ${response.status}: ${body.error?.message ?? text.slice(0, 200)}`);
      return { response, body };
    } catch (error) {
      if (!(error instanceof TypeError)) throw error;  // fetch's network errors only
      const why = error.cause?.message ?? error.message;
      if (attempt === ATTEMPTS) fail(`${what}: ${why} (gave up after ${ATTEMPTS} attempts)`);
      console.error(`producer: ${what}: ${why}; retrying`);
      await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
    }
  }
}

const key = crypto.randomUUID();  // a retried create with this key is answered, not redone
const createUrl = url("?reduce_gates=1"), waitUrl = url("/wait?timeout=30");
const created = await send("create", () => fetch(createUrl, {
  method: "PUT", body: ndjson(), duplex: "half",
  headers: { ...headers, "Content-Type": "application/x-ndjson", "Idempotency-Key": key },
}));
const replayed = created.response.headers.get("idempotent-replayed") === "true";
const note = replayed ? " (replayed)" : "";
console.error(`producer: created ${id}, ${created.body.items} items${note}`);

let partition;
do {  // each call waits up to 30 s: 200 once finished, 202 while still open
  ({ body: partition } = await send("wait", () => fetch(waitUrl, { headers })));
} while (!partition.finished);
console.log(`${id}: ${partition.status} ${JSON.stringify(partition.counts)}`);
console.log(JSON.stringify(partition.result ?? null));
if (partition.status !== "complete") fail(`${id} is ${partition.status}: ${partition.last_error}`);
