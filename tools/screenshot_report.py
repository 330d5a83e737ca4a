"""Screenshot of the head report for the README: docs/report.png.

    .venv/bin/python tools/screenshot_report.py                      # the synthetic example report
    .venv/bin/python tools/screenshot_report.py --page out/report-smollm2/index.html   # after `make demo`

By default it writes the synthetic example report (`python -m headcount.report.example DIR`: hand-built
attention patterns, made-up scores, no model, a second or two) into a temporary folder, opens it in
headless Chromium (Debian: `apt-get install chromium`; another binary with --chromium or
$HEADCOUNT_CHROMIUM) at 1280 x 1600, and writes the top of the page as a PNG scaled to --width pixels
and reduced to a 256-colour palette, so that the file stays small (well under 400 KB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def find_chromium(explicit: str | None) -> str:
    for name in (explicit, os.environ.get("HEADCOUNT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name) or (name if Path(name).is_file() else None)):
            return path
    sys.exit("screenshot_report: no Chromium found (Debian: apt-get install chromium; or pass --chromium PATH)")


def example_page(folder: Path) -> Path:
    from headcount.report.build import write_report
    from headcount.report.example import example_report

    out = Path(write_report(example_report(), folder / "report-example", force=True))
    return out if out.suffix == ".html" else out / "index.html"


def screenshot(chromium: str, page: Path, png: Path, size: tuple[int, int], wait_ms: int) -> None:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={wait_ms}",
           f"--screenshot={png}", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not png.is_file():
        sys.exit(f"screenshot_report: chromium failed ({done.returncode}): {done.stderr[-2000:]}")


def shrink(raw: Path, out: Path, width: int) -> None:
    from PIL import Image

    with Image.open(raw) as im:
        im = im.convert("RGB")
        if im.width > width:
            im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
        im = im.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        out.parent.mkdir(parents=True, exist_ok=True)
        im.save(out, optimize=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, help="an index.html written by `headcount report` (default: the "
                    "synthetic example report, built on the spot)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png", help="the PNG to write")
    ap.add_argument("--width", type=int, default=1000, help="width of the written PNG in pixels")
    ap.add_argument("--window", default="1280,1600", help="browser window WIDTH,HEIGHT")
    ap.add_argument("--wait-ms", type=int, default=8000, help="virtual time for the page's scripts to draw")
    ap.add_argument("--chromium", help="Chromium binary")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.window.split(","))
    chromium = find_chromium(args.chromium)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        page = args.page if args.page is not None else example_page(tmp)
        if not page.is_file():
            sys.exit(f"screenshot_report: no page at {page}")
        raw = tmp / "raw.png"
        screenshot(chromium, page, raw, (w, h), args.wait_ms)
        shrink(raw, args.out, args.width)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) from {page if args.page else 'the example report'}")


if __name__ == "__main__":
    main()
