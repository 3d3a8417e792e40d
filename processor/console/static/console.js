// statefeed console: keep the page's live part current without reloading it.
//
// The element with data-live names a fragment URL. Every data-every milliseconds
// (while the tab is visible) the script fetches it and patches the element in
// place: nodes whose kind, tag and data-key match are kept and only their text and
// attributes change, so nothing flickers, bars glide, and an open <details> stays
// open. The fragment is HTML the server rendered with every value escaped; it is
// parsed with DOMParser, which runs no script. The partition page also follows its
// partition's live feed with EventSource (below): no polling between its events.
"use strict";
(function () {
  const region = document.querySelector("[data-live]");
  const state = document.getElementById("live-state");
  if (!region || !window.fetch || !window.DOMParser) return;
  const url = region.getAttribute("data-live");
  const every = Math.max(500, Number(region.getAttribute("data-every")) || 1500);
  // Attributes the reader changes by hand: never overwritten by an update.
  const keep = new Set(["open"]);
  let last = null;
  let stopped = false;
  let updated = Date.now();

  function show(kind, text) {
    if (!state) return;
    state.setAttribute("data-state", kind);
    state.textContent = text;
  }

  function sameNode(a, b) {
    if (a.nodeType !== b.nodeType || a.nodeName !== b.nodeName) return false;
    if (a.nodeType !== Node.ELEMENT_NODE) return true;
    return a.getAttribute("data-key") === b.getAttribute("data-key");
  }

  function syncAttributes(target, source) {
    for (const attribute of Array.from(target.attributes)) {
      if (!keep.has(attribute.name) && !source.hasAttribute(attribute.name)) {
        target.removeAttribute(attribute.name);
      }
    }
    for (const attribute of Array.from(source.attributes)) {
      if (!keep.has(attribute.name) && target.getAttribute(attribute.name) !== attribute.value) {
        target.setAttribute(attribute.name, attribute.value);
      }
    }
  }

  // Whitespace between elements is layout, not content: the page and its fragment lay
  // it out differently (the page's include starts on a new line), and matching it by
  // position would replace every node after it on the first refresh, losing what the
  // reader did there (a ticked box, an open <details>). Kept inside <pre>.
  function meaningful(parent) {
    const all = Array.from(parent.childNodes);
    if (parent.nodeName === "PRE" || parent.nodeName === "TEXTAREA") return all;
    return all.filter(function (node) {
      return node.nodeType !== Node.TEXT_NODE || node.nodeValue.trim() !== "";
    });
  }

  function morph(target, source) {
    const have = meaningful(target);
    const want = meaningful(source);
    want.forEach(function (node, index) {
      const current = have[index];
      if (!current) {
        target.appendChild(document.importNode(node, true));
      } else if (!sameNode(current, node)) {
        target.replaceChild(document.importNode(node, true), current);
      } else if (node.nodeType === Node.ELEMENT_NODE) {
        syncAttributes(current, node);
        morph(current, node);
      } else if (current.nodeValue !== node.nodeValue) {
        current.nodeValue = node.nodeValue;
      }
    });
    for (let index = have.length - 1; index >= want.length; index--) {
      target.removeChild(have[index]);
    }
  }

  async function refresh() {
    if (stopped || document.hidden) return;
    try {
      const response = await fetch(url, {credentials: "same-origin", cache: "no-store",
                                         headers: {"Accept": "text/html"}});
      if (response.status === 401) {
        stopped = true;
        show("error", "signed out: reload");
        return;
      }
      const text = await response.text();
      if (text !== last) {
        last = text;
        const parsed = new DOMParser().parseFromString(text, "text/html");
        morph(region, parsed.body);
      }
      updated = Date.now();
      if (response.ok) show("on", "live"); else show("error", "live: " + response.status);
    } catch (error) {
      const seconds = Math.round((Date.now() - updated) / 1000);
      show("error", "reconnecting (" + seconds + " s)");
    }
  }

  // -- the live feed (the partition page) ---------------------------------------
  //
  // The element's data-feed names the partition's live feed (Server-Sent Events, the
  // ingest API's events). While it is open, each event redraws the per-gate bars, the
  // item counts and the status at once; the rest of the page is fetched again at each
  // gate move, at the end, and every FEED_SLOWER refreshes. The feed stops at the end;
  // if it fails for good (signed out, gone), the page refreshes as before.
  const FEED_SLOWER = 5;
  const feedUrl = region.getAttribute("data-feed");
  let following = false;

  function number(value) {
    return Number(value).toLocaleString("en-US");
  }

  // Each shown gate's progress from the feed's per-gate items, as the server works it
  // out (processor/console/views/pages.py, gate_progress): "done" passed the gate (complete,
  // or open at a later gate), "waiting" is available at it, "parked" waits at it for a
  // completion, "failed" failed at it or before, "not_reached" is available or parked
  // at an earlier gate.
  function progress(rows, gates) {
    const counted = rows.map(function (row) {
      const items = row.items || {};
      return {gate: row.gate, available: items.available || 0, failed: items.failed || 0,
              parked: items.waiting || 0, complete: items.complete || 0};
    }).sort(function (a, b) { return a.gate - b.gate; });
    let complete = 0;
    let open = 0;
    counted.forEach(function (row) {
      complete += row.complete;
      open += row.available + row.parked + row.failed;
    });
    const result = {};
    let below = 0, failedBelow = 0, unfinishedBelow = 0;
    gates.slice().sort(function (a, b) { return a - b; }).forEach(function (gate) {
      while (below < counted.length && counted[below].gate < gate) {
        failedBelow += counted[below].failed;
        unfinishedBelow += counted[below].available + counted[below].parked;
        below++;
      }
      const here = counted.find(function (row) { return row.gate === gate; }) ||
        {available: 0, failed: 0, parked: 0};
      result[gate] = {done: complete + open - failedBelow - unfinishedBelow - here.available
                            - here.failed - here.parked,
                      waiting: here.available, parked: here.parked,
                      failed: failedBelow + here.failed, not_reached: unfinishedBelow};
    });
    return result;
  }

  function percent(part, total) {
    return total ? Math.round(10000 * part / total) / 100 : 0;
  }

  function drawGate(step, gate, p) {
    const total = p.done + p.waiting + p.parked + p.failed + p.not_reached;
    let summary = p.done + "/" + total + " done";
    if (p.waiting) summary += ", " + p.waiting + " waiting";
    if (p.parked) summary += ", " + p.parked + " parked";
    if (p.failed) summary += ", " + p.failed + " failed";
    if (p.not_reached) summary += ", " + p.not_reached + " not reached";
    const bar = step.querySelector("svg.bar");
    if (bar) {
      bar.setAttribute("aria-label", "gate " + gate + ": " + summary);
      const title = bar.querySelector("title");
      if (title) title.textContent = "gate " + gate + ": " + summary;
      let start = 0;
      ["done", "failed", "waiting", "parked"].forEach(function (part) {
        const width = percent(p[part], total);
        const segment = bar.querySelector("rect.seg-" + part);
        if (segment) {
          segment.setAttribute("x", String(Math.round(start * 100) / 100));
          segment.setAttribute("width", String(width));
        }
        start += width;
      });
    }
    const numbers = step.querySelector(".step-numbers");
    if (!numbers) return;
    const spans = [["count-done", p.done, "done", true], ["count-waiting", p.waiting, "waiting"],
                   ["count-parked", p.parked, "parked"], ["count-failed", p.failed, "failed"],
                   ["muted", p.not_reached, "not reached"]];
    numbers.replaceChildren();
    spans.forEach(function (span) {
      if (!span[1] && !span[3]) return;
      const element = document.createElement("span");
      element.className = span[0];
      element.textContent = number(span[1]) + " " + span[2];
      numbers.append(element, " ");
    });
  }

  // Draw the feed's per-gate items on the gates the page shows; a gate it does not
  // show yet (items reached it) is drawn by fetching the page's live part again.
  function drawGates(rows) {
    const steps = {};
    region.querySelectorAll("li.step[data-gate]").forEach(function (step) {
      steps[Number(step.getAttribute("data-gate"))] = step;
    });
    const shown = Object.keys(steps).map(Number);
    const computed = progress(rows, shown);
    shown.forEach(function (gate) { drawGate(steps[gate], gate, computed[gate]); });
    if (rows.some(function (row) { return !(row.gate in steps); })) refresh();
  }

  function drawCounts(counts) {
    const items = document.getElementById("partition-items");
    if (!items) return;
    const order = (items.getAttribute("data-statuses") || "").split(" ");
    let total = 0;
    Object.keys(counts).forEach(function (name) { total += counts[name]; });
    items.replaceChildren(number(total));
    order.forEach(function (name) {
      if (!counts[name]) return;
      const element = document.createElement("span");
      element.className = "count-" + name;
      element.textContent = number(counts[name]) + " " + name;
      items.append(" · ", element);
    });
  }

  function drawStatus(status) {
    const shown = document.querySelector("#partition-status .status");
    if (!shown || shown.textContent === status) return;
    shown.className = "status status-" + status;
    shown.textContent = status;
  }

  function follow() {
    const feed = new EventSource(feedUrl);
    following = true;
    region.setAttribute("data-feed-state", "connecting");
    function read(event) {
      try { return JSON.parse(event.data); } catch (error) { return null; }
    }
    feed.addEventListener("state", function (event) {
      const data = read(event);
      if (!data) return;
      region.setAttribute("data-feed-state", "open");
      show("on", "live");
      drawGates(data.gates);
      drawCounts(data.counts);
      drawStatus(data.status);
      const gate = document.getElementById("partition-gate");
      if (gate && Number(gate.getAttribute("data-gate")) !== data.gate) refresh();
    });
    feed.addEventListener("counts", function (event) {
      const data = read(event);
      if (!data) return;
      region.setAttribute("data-feed-state", "open");
      drawGates(data.gates);
      drawCounts(data.counts);
    });
    feed.addEventListener("gate", function () {
      region.setAttribute("data-feed-state", "open");
      refresh();
    });
    feed.addEventListener("end", function (event) {
      const data = read(event);
      feed.close();
      following = false;
      region.setAttribute("data-feed-state", "ended");
      if (data) {
        drawGates(data.gates);
        drawCounts(data.counts);
        drawStatus(data.status);
      }
      refresh();
    });
    feed.addEventListener("error", function () {
      if (feed.readyState === EventSource.CLOSED) {  // refused for good: poll as before
        following = false;
        region.setAttribute("data-feed-state", "closed");
      } else {
        region.setAttribute("data-feed-state", "reconnecting");
      }
    });
  }

  show("on", "live");
  window.setInterval(function () {
    if (!following || Date.now() - updated >= every * FEED_SLOWER) refresh();
  }, every);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) refresh();
  });
  if (feedUrl && window.EventSource) follow();
})();
