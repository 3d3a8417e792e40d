// statefeed console: keep the page's live part current without reloading it.
//
// The element with data-live names a fragment URL. Every data-every milliseconds
// (while the tab is visible) the script fetches it and patches the element in
// place: nodes whose kind, tag and data-key match are kept and only their text and
// attributes change, so nothing flickers, bars glide, and an open <details> stays
// open. The fragment is HTML the server rendered with every value escaped; it is
// parsed with DOMParser, which runs no script.
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

  function morph(target, source) {
    const have = Array.from(target.childNodes);
    const want = Array.from(source.childNodes);
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

  show("on", "live");
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) refresh();
  });
})();
