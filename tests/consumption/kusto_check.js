// KQL static checker for the consumption tests (tests/consumption/test_kql.py).
// One node process parses and analyses every query handed to it with the Kusto language service
// (npm @kusto/language-service-next, installed by .ci/install-consumption-tools.sh into .ci/node/).
//
// stdin (JSON):
//   { "tables": { "<Table>": "(Col:type, ...)", ... },
//     "queries": [ { "id": "...", "text": "<KQL>", "tables": ["<Table>", ...] }, ... ] }
//   Each query is analysed against a database holding only the tables it lists.
// stdout (JSON): [ { "id", "diagnostics": [ {severity, code, message, start, length, excerpt} ],
//                    "columns": [ [name, type], ... ] } ]   (columns = the query's result schema)
'use strict';

const path = require('path');
const fs = require('fs');

const nodeDir = process.env.KUSTO_NODE_DIR
  || path.resolve(__dirname, '..', '..', '.ci', 'node', 'node_modules');
const pkg = path.join(nodeDir, '@kusto', 'language-service-next');
require(path.join(pkg, 'bridge.min.js'));
require(path.join(pkg, 'Kusto.Language.Bridge.min.js'));
/* global Kusto */
const K = Kusto.Language;

const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const tableSymbols = {};
for (const [name, schema] of Object.entries(input.tables)) {
  tableSymbols[name] = new K.Symbols.TableSymbol.$ctor7(name, schema, null);
}

const globalsCache = new Map();
function globalsFor(tables) {
  const key = [...tables].sort().join(',');
  if (!globalsCache.has(key)) {
    const symbols = tables.map((t) => {
      if (!tableSymbols[t]) throw new Error(`unknown table ${t}`);
      return tableSymbols[t];
    });
    const db = new K.Symbols.DatabaseSymbol.ctor('workspace', symbols);
    globalsCache.set(key, K.GlobalState.Default.WithDatabase(db));
  }
  return globalsCache.get(key);
}

const results = input.queries.map((q) => {
  const code = K.KustoCode.ParseAndAnalyze(q.text, globalsFor(q.tables));
  const diags = code.GetDiagnostics();
  const diagnostics = [];
  for (let i = 0; i < diags.Count; i += 1) {
    const d = diags.getItem(i);
    diagnostics.push({
      severity: String(d.Severity),
      code: String(d.Code),
      message: String(d.Message),
      start: d.Start,
      length: d.Length,
      excerpt: q.text.substr(Math.max(0, d.Start - 30), d.Length + 60),
    });
  }
  const columns = [];
  const rt = code.ResultType;
  if (rt && rt.Columns) {
    for (let i = 0; i < rt.Columns.Count; i += 1) {
      const c = rt.Columns.getItem(i);
      columns.push([String(c.Name), String(c.Type.Name)]);
    }
  }
  return { id: q.id, diagnostics, columns };
});

process.stdout.write(JSON.stringify(results));
