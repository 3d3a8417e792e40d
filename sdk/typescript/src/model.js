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
    id;
    partitionId;
    gate;
    attempt;
    idempotencyKey;
    data;
    status;
    lastError;
    inReduce;
    constructor(fields) {
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
    get failed() {
        return this.status === "failed";
    }
    /**
     * The data decoded as UTF-8 JSON.
     *
     * @throws ItemDataError the data is not valid UTF-8 JSON (uncaught: a
     *   non-retryable 400 answer).
     */
    json() {
        const text = this.decoded("JSON");
        try {
            return JSON.parse(text);
        }
        catch (error) {
            const start = JSON.stringify(text.slice(0, 40));
            throw new ItemDataError(`${this.named()}data is not valid JSON (${shorten(error.message, 200)}); `
                + `it starts with ${start}`);
        }
    }
    /**
     * The data decoded as UTF-8 text.
     *
     * @throws ItemDataError the data is not valid UTF-8.
     */
    text() {
        return this.decoded("UTF-8 text");
    }
    /** The partition, item, gate and attempt, for a handler's own logs (errors need none). */
    describe() {
        return `partition ${JSON.stringify(this.partitionId)} item ${JSON.stringify(this.id)} `
            + `gate ${this.gate} (attempt ${this.attempt})`;
    }
    decoded(what) {
        try {
            return utf8.decode(this.data);
        }
        catch {
            throw new ItemDataError(`${this.named()}data is not valid ${what}: not UTF-8`);
        }
    }
    /** The processor names the partition, item, gate and attempt of a per-item call;
     * in a reduce page it names the page, so the SDK names the item. */
    named() {
        return this.inReduce ? `item ${JSON.stringify(this.id)}: ` : "";
    }
}
/** The partition, gate, pass, page and attempt of a reduce page, for a handler's logs. */
export function describePage(page) {
    return `partition ${JSON.stringify(page.partitionId)} gate ${page.gate} reduce ${page.pass} `
        + `page ${page.page} (attempt ${page.attempt})`;
}
export function shorten(text, limit) {
    return text.length <= limit ? text : `${text.slice(0, limit)}...`;
}
//# sourceMappingURL=model.js.map