// node spawn_handler.js [port]: a folder {"files": N} spawns its files, 100 per call.
require("http").createServer((req, res) => {
  if (req.method === "GET") return res.end('{"status":"ok"}');
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    const id = decodeURIComponent(req.headers["x-item-id"]);
    const item = JSON.parse(body || "{}");
    res.setHeader("Content-Type", "application/json");
    if (item.files === undefined)  // a file: its own work, then done
      return res.end(JSON.stringify({ done: true, data: { file: item.file, checked: true } }));
    const from = item.cursor || 0, to = Math.min(from + 100, item.files), spawn = [];
    for (let n = from; n < to; n++)
      spawn.push({ id: `${id}/file-${n}`, data: { file: `file-${n}.pdf` } });
    // Not done until the last page: called again with the cursor kept in its data.
    const answer = { done: to === item.files, data: { files: item.files, cursor: to }, spawn };
    res.end(JSON.stringify(answer));
  });
}).listen(Number(process.argv[2] || 8000));
