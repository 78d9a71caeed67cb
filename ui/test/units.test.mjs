// ui/src/units.ts against docs/format-vectors.json, the examples that
// deepspan_model::human (Rust) is tested against too: the web UI and the CLI
// print the same durations, shares and evidence. Compiles units.ts alone with
// the UI's TypeScript compiler, then imports it. `node ui/test/units.test.mjs`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const ui = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = mkdtempSync(join(tmpdir(), "deepspan-units-"));
try {
  execFileSync(join(ui, "node_modules", ".bin", "tsc"), [
    "--ignoreConfig", join(ui, "src", "units.ts"), "--outDir", out, "--target", "ES2022", "--module", "ESNext", "--strict",
  ], { stdio: "inherit" });
  const units = await import(pathToFileURL(join(out, "units.js")).href);
  const vectors = JSON.parse(readFileSync(join(ui, "..", "docs", "format-vectors.json"), "utf8"));
  let checked = 0;
  for (const [ns, text] of vectors.durations) { assert.equal(units.fmtNs(ns), text, `fmtNs(${ns})`); checked++; }
  for (const [f, text] of vectors.shares) { assert.equal(units.fmtShare(f), text, `fmtShare(${f})`); checked++; }
  for (const [k, v, text] of vectors.evidence) { assert.equal(units.fmtEvidence(k, v), text, `fmtEvidence(${k}, ${v})`); checked++; }
  for (const [c, text] of vectors.containers) { assert.equal(units.containerLabel(c), text, `containerLabel(${JSON.stringify(c)})`); checked++; }
  console.log(`ui units: ${checked} examples of docs/format-vectors.json ok`);
} finally {
  rmSync(out, { recursive: true, force: true });
}
