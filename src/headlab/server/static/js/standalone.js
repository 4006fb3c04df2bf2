// Entry of the self-contained views that headlab.show writes (notebook outputs, the offline HTML
// file): reads the JSON embedded beside the view and draws it. No server and no network: the code
// of the layer diagram's steps and every weight travel in that JSON.
import { h, clear } from "./dom.js";
import { mountHeadView } from "./headview.js";
import { layerDiagram } from "./layer-diagram.js";
import { stageTable } from "./shapes-widget.js";

// Weights travel as little-endian uint16 in base64 (w · 65535, exact to the 4 decimals shown).
export function decodeWeights(b64, shape) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const flat = new Uint16Array(bytes.buffer);
  const build = (dims, offset) => {
    if (dims.length === 1) return Array.from(flat.subarray(offset, offset + dims[0]), (v) => v / 65535);
    const size = dims.slice(1).reduce((a, b) => a * b, 1);
    return Array.from({ length: dims[0] }, (_, k) => build(dims.slice(1), offset + k * size));
  };
  return build(shape, 0);
}

function heads(root, part, uid) {
  const data = { ...part.report };
  for (const key of ["weights", "averaged_weights"]) data[key] = decodeWeights(data[key].b64, data[key].shape);
  mountHeadView(root, data, { grid: part.grid, detail: part.detail, uid });
}

function shapes(root, part, uid) {
  const table = h("div", { class: "dg-table" });
  const onStep = (stages) => table.querySelectorAll("tr[data-stage]").forEach((tr) => tr.classList.toggle("current", stages.includes(tr.dataset.stage)));
  const fetchCode = (name) => (part.code[name] ? Promise.resolve(part.code[name]) : Promise.reject(new Error(name)));
  const layer = layerDiagram({ fetchCode, onStep, prefix: `${uid}-layer` });
  root.append(h("p", { class: "hv-title" }, part.report.verdict), layer.root, table);
  clear(table, stageTable(part.report));
  table.querySelector("table")?.removeAttribute("id");  // several outputs may share a notebook
  layer.update(part.report);
}

const KINDS = { heads, shapes };

// Draw every part of the view whose root element has this id.
export function mount(id) {
  const root = document.getElementById(id);
  const spec = JSON.parse(document.getElementById(`${id}-data`).textContent);
  spec.parts.forEach((part, k) => {
    const box = h("section", { class: `hv-part hv-${part.kind}`, "aria-label": part.title || part.kind });
    if (part.title) box.append(h("h2", { class: "hv-h" }, part.title));
    root.append(box);
    KINDS[part.kind](box, part, `${id}-${k}`);
  });
}
