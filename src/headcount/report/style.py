"""The page's CSS and its one script (layer switching), kept as strings so the page has no files beside it."""

CSS = """
:root { --ink:#1f2330; --muted:#6b7080; --line:#e4e6ee; --card:#ffffff; --bg:#f5f6fa; --accent:#E45756;
        --held:#2e9d5b; --partly:#d98b1a; --nothold:#c8413f; --na:#9aa0ad; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:15px/1.5 Inter, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
header { background:linear-gradient(120deg,#1f2330 0%,#2d3350 60%,#4b3a5c 100%); color:#fff; padding:34px 48px 30px; }
header h1 { margin:0 0 4px; font-size:30px; font-weight:700; letter-spacing:-0.01em; }
header .sub { color:#c9cce0; font-size:15px; }
.stats { display:flex; flex-wrap:wrap; gap:14px; margin-top:22px; }
.stat { background:rgba(255,255,255,0.08); border:1px solid rgba(255,255,255,0.14); border-radius:10px;
        padding:10px 16px; min-width:130px; }
.stat b { display:block; font-size:22px; font-weight:700; }
.stat span { font-size:12px; color:#c9cce0; text-transform:uppercase; letter-spacing:0.04em; }
main { max-width:1240px; margin:0 auto; padding:26px 32px 60px; }
nav { display:flex; flex-wrap:wrap; gap:8px; margin:0 0 18px; }
nav a { color:var(--ink); text-decoration:none; background:#fff; border:1px solid var(--line); border-radius:999px;
        padding:4px 12px; font-size:13px; }
nav a:hover { border-color:var(--ink); }
section.card { background:var(--card); border:1px solid var(--line); border-radius:14px; padding:22px 26px;
               margin:0 0 22px; box-shadow:0 1px 2px rgba(20,20,40,0.04); }
section.card h2 { margin:0 0 4px; font-size:20px; }
p.lede { margin:0 0 14px; color:var(--muted); max-width:900px; }
.grid2 { display:grid; grid-template-columns:1fr 1fr; gap:22px; }
.grid2 > div { min-width:0; }
.wide { display:grid; grid-template-columns:minmax(0,3fr) minmax(260px,2fr); gap:22px; align-items:start; }
@media (max-width: 900px) { .grid2, .wide { grid-template-columns:1fr; } }
.claims { display:grid; grid-template-columns:repeat(auto-fill,minmax(360px,1fr)); gap:14px; }
.claim { border:1px solid var(--line); border-left:6px solid var(--na); border-radius:10px; padding:12px 16px; }
.claim.held { border-left-color:var(--held); } .claim.partly { border-left-color:var(--partly); }
.claim.nothold { border-left-color:var(--nothold); }
.claim h3 { margin:0 0 4px; font-size:15px; display:flex; align-items:center; gap:8px; }
.claim .id { color:var(--muted); font-weight:600; font-size:13px; }
.badge { margin-left:auto; font-size:11px; font-weight:700; text-transform:uppercase; letter-spacing:0.05em;
         color:#fff; background:var(--na); border-radius:999px; padding:2px 9px; white-space:nowrap; }
.badge.held { background:var(--held); } .badge.partly { background:var(--partly); }
.badge.nothold { background:var(--nothold); }
.claim .says { color:var(--muted); font-size:13px; margin:0 0 6px; }
.claim .found { font-size:14px; margin:0; }
.claim .test { color:var(--muted); font-size:12px; margin:6px 0 0; font-style:italic; }
.claim .num { font-size:13px; margin:6px 0 0; } .claim .num b { font-variant-numeric:tabular-nums; }
.claim .src { color:var(--muted); font-size:12px; margin:4px 0 0; }
table.data { border-collapse:collapse; width:100%; font-size:13px; font-variant-numeric:tabular-nums; }
table.data th { text-align:right; font-weight:600; color:var(--muted); border-bottom:2px solid var(--line);
                padding:6px 10px; white-space:nowrap; }
table.data td { text-align:right; padding:5px 10px; border-bottom:1px solid var(--line); }
table.data th:first-child, table.data td:first-child { text-align:left; white-space:nowrap; }
table.data tr.mine td { background:#fff4f3; font-weight:600; }
.scroll { max-height:420px; overflow:auto; border:1px solid var(--line); border-radius:8px; }
.scroll table.data th { position:sticky; top:0; background:#fff; }
.cell-bar { display:inline-block; height:8px; border-radius:4px; background:#4C78A8; vertical-align:middle;
            margin-left:6px; max-width:40px; }
.legend { display:flex; flex-wrap:wrap; gap:10px 16px; margin:4px 0 10px; font-size:13px; }
.legend i { display:inline-block; width:14px; height:14px; border-radius:3px; margin-right:6px; vertical-align:-2px; }
.na { border:2px dashed #cfd3de; border-radius:12px; padding:22px; text-align:center; color:var(--muted);
      background:repeating-linear-gradient(135deg,#fafbfd,#fafbfd 10px,#f3f4f8 10px,#f3f4f8 20px); }
.na b { display:block; color:var(--ink); font-size:16px; margin-bottom:4px; }
.na code { font-size:12px; }
.controls { display:flex; align-items:center; gap:10px; margin:0 0 8px; flex-wrap:wrap; }
.controls select, .controls button { font:inherit; font-size:14px; padding:4px 10px; border:1px solid var(--line);
                                     border-radius:8px; background:#fff; cursor:pointer; }
.controls .sentence { color:var(--muted); font-size:13px; }
.kpis { display:grid; grid-template-columns:repeat(auto-fill,minmax(200px,1fr)); gap:12px; }
.kpi { border:1px solid var(--line); border-radius:10px; padding:12px 14px; }
.kpi span { display:block; color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:0.04em; }
.kpi b { font-size:20px; }
.kpi small { color:var(--muted); }
h3.sub { font-size:15px; margin:18px 0 6px; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px 0 30px; }
"""

# Switches the attention small multiples between layers: the data sits once in a JSON script tag as
# integers in thousandths; restyle swaps every head's z and relayout the subplot titles.
ATTENTION_JS = """
(function () {
  var data = JSON.parse(document.getElementById('attn-data').textContent);
  var div = document.getElementById('fig-attention');
  var select = document.getElementById('attn-layer');
  if (!div || !select) { return; }
  function show(layer) {
    var heads = data.layers[layer];
    var z = heads.map(function (h) { return h.map(function (row) { return row.map(function (v) { return v / data.scale; }); }); });
    var idx = heads.map(function (_, i) { return i; });
    Plotly.restyle(div, {z: z}, idx);
    var titles = {};
    data.titles[layer].forEach(function (t, i) { titles['annotations[' + i + '].text'] = t; });
    Plotly.relayout(div, titles);
    select.value = String(layer);
  }
  select.addEventListener('change', function () { show(parseInt(select.value, 10)); });
  document.getElementById('attn-prev').addEventListener('click', function () {
    show(Math.max(0, parseInt(select.value, 10) - 1)); });
  document.getElementById('attn-next').addEventListener('click', function () {
    show(Math.min(data.layers.length - 1, parseInt(select.value, 10) + 1)); });
})();
"""
