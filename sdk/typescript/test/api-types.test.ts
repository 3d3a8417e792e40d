// src/api-types.ts is generated from the ingest API's OpenAPI document: it must be what
// `npm run api-types` writes now, or the client's types have drifted from the API.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { it } from "node:test";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const DOCUMENT = resolve(PACKAGE, "../../processor/api/openapi.json");
const GENERATOR = join(PACKAGE, "node_modules/.bin/openapi-typescript");

it("src/api-types.ts is what openapi-typescript makes of processor/api/openapi.json",
  { skip: !existsSync(DOCUMENT) && "not inside the statefeed repository" }, () => {
    const folder = mkdtempSync(join(tmpdir(), "statefeed-api-types-"));
    try {
      const output = join(folder, "api-types.ts");
      execFileSync(GENERATOR, [DOCUMENT, "-o", output], { stdio: "pipe" });
      const fresh = readFileSync(output, "utf8");
      const checkedIn = readFileSync(join(PACKAGE, "src/api-types.ts"), "utf8");
      assert.ok(fresh === checkedIn,
        "src/api-types.ts is stale: run `npm run api-types` in sdk/typescript and commit it");
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
  });
