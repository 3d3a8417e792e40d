// A statefeed handler in Node.js, no dependencies: node spawn_handler.js [port]
// A folder item ({"files": N}) lists its files by spawning one item per file,
// 100 per answer: each answer keeps its cursor in the folder's data and, until
// the last page, asks to be called again (same gate, not done).
const PAGE = 100;
require("http").createServer((req, res) => {
  if (req.method === "GET") return res.end('{"status":"ok"}');
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    const id = decodeURIComponent(req.headers["x-item-id"]);
    const item = JSON.parse(body || "{}");
    res.setHeader("Content-Type", "application/json");
    if (item.files === undefined) {  // one file: do its work, then it is done
      return res.end(JSON.stringify({ done: true, data: { file: item.file, checked: true } }));
    }
    const from = item.cursor || 0;
    const to = Math.min(from + PAGE, item.files);
    const spawn = [];
    for (let n = from; n < to; n++) {
      spawn.push({ id: `${id}/file-${n}`, data: { file: `file-${n}.pdf` } });
    }
    const done = to === item.files;
    res.end(JSON.stringify({ done, data: { files: item.files, cursor: to }, spawn }));
  });
}).listen(Number(process.argv[2] || 8000));
