// node spawn_handler.js [port]: a folder {"files": N} spawns its files, 100 per call.
import { app, serve } from "@statefeed/sdk";

function list(item) {
  const folder = item.json();
  if (folder.files === undefined)  // a file: its own work, then done
    return { done: true, data: { file: folder.file, checked: true } };
  const from = folder.cursor ?? 0, to = Math.min(from + 100, folder.files), spawn = [];
  for (let n = from; n < to; n++)
    spawn.push({ id: `${item.id}/file-${n}`, data: { file: `file-${n}.pdf` } });
  // Not done until the last page: called again with the cursor kept in its data.
  return { done: to === folder.files, data: { files: folder.files, cursor: to }, spawn };
}

await serve(app({ 0: list }), { port: Number(process.argv[2] || 8000) });
