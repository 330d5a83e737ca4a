"""The report page: built from a synthetic report.json (no model), opened in headless Chromium.

The browser test needs Debian's `chromium` (/usr/bin/chromium) and playwright's Python package; it
skips, saying which is missing, where they are absent (.ci/run installs chromium before `make test`).
"""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from headcount.report.build import write_report
from headcount.report.example import example_report
from headcount.report.html import render_html

CHROMIUM = os.environ.get("HEADCOUNT_CHROMIUM", "/usr/bin/chromium")


def _figure_ids(page: str) -> list[str]:
    return re.findall(r'<div id="(fig-[a-z-]+)" class="plotly-graph-div"', page)


def test_page_is_self_contained_and_has_every_chart():
    page = render_html(example_report())
    # plotly.js inlined exactly once, and nothing fetched from elsewhere
    assert page.count("Plotly.newPlot") == 7
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', page)
    assert _figure_ids(page) == ["fig-accounts", "fig-headmap", "fig-importance", "fig-attention", "fig-pruning",
                                 "fig-faith", "fig-rank"]
    assert 'class="na"' not in page


def test_the_commands_results_are_shown_with_their_source():
    """C11, C15 and healing show what the commands give: the command line, the saved file, the three domains on the
    commands' windows, and healing's before / after the edit / after healing with steps, tokens and seconds."""
    r = example_report()
    page = render_html(r)
    assert 'id="healing"' in page and '<a href="#healing">Healing</a>' in page
    table = re.search(r'<table class="data domains" id="healing-table">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr><td>(\w+)</td><td>4 \u00d7 512</td><td>([\d.]+)</td><td>([\d.]+)</td><td>([\d.]+)</td>",
                      table)
    assert rows == [("prose", "16.50", "23.20", "19.30"), ("code", "24.40", "35.40", "28.20"),
                    ("source", "9.10", "17.20", "13.50")]
    assert "200 steps" in page and "95,744 calibration tokens" in page and "429 s of healing" in page
    for cmd in ("headcount prune --model example --fraction 0.2 --out DIR --json",
                "headcount merge-kv --model example --kv-heads 1 --json",
                "headcount prune --model example --fraction 0.5 --heal-steps 200 --out DIR --json"):
        assert f"<code>{cmd}</code>" in page
    assert page.count("saved result of <code>") == 3 and "measured on these weights" in page
    src = {c["id"]: c["source"] for c in r["claims"]}
    assert src["C11"].startswith("saved result of `headcount prune --model example --fraction 0.2")
    assert "saved result of `headcount merge-kv --model example --kv-heads 1 --json`" in src["C15"]
    # without a saved healing result the section says how to get one
    gone = render_html(example_report(missing=("healing",)))
    assert "Healing: not available" in gone


def test_missing_sections_become_panels_with_their_reason():
    r = example_report(missing=("roles", "importance", "pruning", "prune_command", "kv_merge", "healing",
                                "faithfulness", "rank"))
    page = render_html(r)
    assert page.count('class="na"') == 7
    assert "left out of this example" in page
    assert _figure_ids(page) == ["fig-accounts", "fig-attention"]
    statuses = {c["id"]: c["status"] for c in r["claims"]}
    assert {k: statuses[k] for k in ("C7", "C9", "C11", "C13", "C15")} == \
        {"C7": "not measured", "C9": "not measured", "C11": "not measured", "C13": "not measured", "C15": "partly"}
    assert set(statuses) == {f"C{i}" for i in range(1, 16)}
    # what does not depend on the missing sections still holds
    assert all(statuses[k] == "held" for k in ("C1", "C2", "C3", "C4", "C5", "C6", "C8", "C10", "C12", "C14"))


def test_every_claim_card_shows_its_number_test_and_source():
    r = example_report(overrides={"prune_command": lambda p: dict(p, ppl_after=p["ppl_before"] * 1.2)})
    page = render_html(r)
    for i in range(1, 16):
        card = re.search(rf'<div class="claim (\w+)" id="claim-C{i}">(.*?)</div>', page, re.S)
        assert card, f"C{i}"
        assert "Number: <b>" in card.group(2) and "Test: " in card.group(2) and "Source: " in card.group(2)
    c11 = re.search(r'<div class="claim (\w+)" id="claim-C11">(.*?)</div>', page, re.S)
    assert c11.group(1) == "nothold" and "did not hold" in c11.group(2) and "Number: <b>0.2</b>" in c11.group(2)
    assert "(14 of 15 held)" in page and "<b>14 / 15</b>" in page


def test_attention_data_is_embedded_once_per_layer():
    r = example_report(n_layers=3, n_heads=4)
    page = render_html(r)
    blob = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(blob)
    assert data["layers"] == r["sample"]["layers"]
    assert len(data["titles"]) == 3 and len(data["titles"][0]) == 4
    # the previous-token head of layer 0 is titled with its role
    assert data["titles"][0][0] == "head 0 \u00b7 previous-token"


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (Debian's package, driven by playwright; no download)."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright's Python package is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.mark.parametrize("missing", [(), ("roles", "importance", "pruning", "prune_command", "kv_merge", "healing",
                                          "faithfulness", "rank")],
                         ids=["full", "sections-missing"])
def test_page_renders_offline_in_chromium(browser, tmp_path, missing):
    from PIL import Image, ImageStat

    out = write_report(example_report(missing=missing), tmp_path / "report")
    n_figs = len(_figure_ids((out / "index.html").read_text()))
    errors, outside = [], []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:

        def route(r):
            if r.request.url.startswith(("file://", "data:", "about:")):
                r.continue_()
            else:
                outside.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto((out / "index.html").as_uri(), wait_until="load")
        page.wait_for_function(f"document.querySelectorAll('.plotly-graph-div .main-svg').length >= {n_figs}",
                               timeout=30_000)
        rendered = page.evaluate("Array.from(document.querySelectorAll('.plotly-graph-div'))"
                                 ".map(d => [d.id, d.querySelectorAll('.main-svg').length > 0])")
        assert len(rendered) == n_figs and all(ok for _, ok in rendered), rendered
        # switching layers restyles the small multiples with that layer's weights
        before = page.evaluate("document.getElementById('fig-attention').data[0].z[2][1]")
        page.select_option("#attn-layer", "1")
        page.wait_for_timeout(200)
        after = page.evaluate("document.getElementById('fig-attention').data[0].z[2][1]")
        title = page.evaluate("document.getElementById('fig-attention').layout.annotations[0].text")
        if not missing:
            assert (before, after) == (1.0, 0.0) and title.startswith("head 0")
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    assert errors == []
    assert outside == []
    img = Image.open(shot).convert("L")
    assert img.size[1] > 2000
    assert ImageStat.Stat(img).stddev[0] > 20  # not blank: headings, charts and cards on the page
    keep = os.environ.get("HEADCOUNT_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / f"report-{'full' if not missing else 'missing'}.png")
