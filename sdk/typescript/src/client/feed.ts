/**
 * A partition's live feed (`GET /v1/partitions/{id}/events`, Server-Sent Events) as
 * events: a small parser of the event stream, pure but for the reading.
 */

/** One event of the feed: `kind` (`state`, `gate`, `counts`, `result`, `end`), its `id`
 * (give it as `after` to resume), and its JSON `data`. */
export interface FeedEvent {
  kind: "state" | "gate" | "counts" | "result" | "end";
  id: string;
  data: any;
}

/** Parses the text of an event stream as it arrives; `push` returns the events its
 * chunk completed. */
export class EventStreamParser {
  private buffer = "";

  push(chunk: string): FeedEvent[] {
    this.buffer += chunk.replace(/\r\n?/g, "\n");
    const events: FeedEvent[] = [];
    let end: number;
    while ((end = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const event = parseBlock(block);
      if (event) events.push(event);
    }
    return events;
  }
}

function parseBlock(block: string): FeedEvent | undefined {
  let kind = "message", id = "";
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;  // a comment: the keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") kind = value;
    else if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  if (data.length === 0) return undefined;  // `retry:` alone
  return { kind: kind as FeedEvent["kind"], id, data: JSON.parse(data.join("\n")) };
}
