// PromQL syntax checker with the Prometheus 3 grammar (quoted UTF-8 metric and label names), for the
// native-OTLP rules and dashboard (tests/consumption/test_native_otlp.py). Uses npm
// @prometheus-io/lezer-promql, the parser of Prometheus' own web UI, installed by
// .ci/install-consumption-tools.sh into .ci/node/. promtool 2.x predates quoted names.
//
// stdin (JSON):  [ { "id": "...", "expr": "<PromQL>" }, ... ]
// stdout (JSON): [ { "id", "errors": [ {from, excerpt} ], "metrics": [names], "labels": [names] } ]
//   metrics: every metric name the expression selects (bare identifier or quoted name in braces);
//   labels: every label name it matches on or groups by (quoted or not).
'use strict';

const path = require('path');
const fs = require('fs');

const nodeDir = process.env.PROMQL_NODE_DIR
  || path.resolve(__dirname, '..', '..', '.ci', 'node', 'node_modules');
const { parser } = require(path.join(nodeDir, '@prometheus-io', 'lezer-promql'));

function unquote(text) {
  // PromQL strings use Go escaping; JSON.parse reads the double-quoted form the same way.
  if (text.startsWith('"')) return JSON.parse(text);
  if (text.startsWith("'")) return JSON.parse('"' + text.slice(1, -1).replace(/"/g, '\\"') + '"');
  return text;
}

function check(expr) {
  const errors = [];
  const metrics = new Set();
  const labels = new Set();
  const tree = parser.parse(expr);
  tree.iterate({
    enter(node) {
      const text = expr.slice(node.from, node.to);
      if (node.type.isError) {
        errors.push({ from: node.from, excerpt: expr.slice(Math.max(0, node.from - 30), node.from + 30) });
        return;
      }
      const parent = node.node.parent;
      const parentName = parent ? parent.type.name : '';
      if (node.name === 'Identifier' && parentName === 'VectorSelector') {
        metrics.add(text);
      } else if (node.name === 'QuotedLabelName') {
        // Alone inside {...} it is the metric name; in a matcher or grouping list it is a label.
        const literal = node.node.getChild('StringLiteral');
        const name = unquote(literal ? expr.slice(literal.from, literal.to) : text);
        if (parentName === 'LabelMatchers') metrics.add(name);
        else labels.add(name);
      } else if (node.name === 'LabelName') {
        labels.add(text);
      }
    },
  });
  return { errors, metrics: [...metrics].sort(), labels: [...labels].sort() };
}

const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const out = input.map(({ id, expr }) => ({ id, ...check(expr) }));
process.stdout.write(JSON.stringify(out));
