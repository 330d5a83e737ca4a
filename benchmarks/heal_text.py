"""Write a healing text that also holds Python source: does healing on code close the 'source' domain's gap?

    python benchmarks/heal_text.py OUT.txt [--source-chars 300000]
    headcount heal --model PRUNED --teacher smollm2 --text OUT.txt --out DIR --json

The file interleaves, paragraph by paragraph, three streams: the default corpus's calibration prose, the
code-like calibration text (torch / numpy docstrings and comments of the calibration files), and Python source
verbatim from packages no held-out domain reads (rich, click, typer, tqdm: none is torch, numpy or the standard
library). The held-out domains' texts are never in it: the 'source' domain stays standard-library modules
nobody distils on (headcount.data.SOURCE_MODULES); this only asks whether code of OTHER libraries heals it.
`heal --text` splits the file's paragraphs into calibration and held-out parts itself (crc32 % 5), so a fifth
of it is measured as the domain 'text' and never distilled on.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
from pathlib import Path

PACKAGES = ("rich", "click", "typer", "tqdm")


def source_paragraphs(max_chars: int) -> list[str]:
    """Blank-line separated blocks of the packages' .py files (sorted paths), whole files, each package until it
    has given max_chars / 4 (its last file may pass that: 525k chars in all for the default 300k)."""
    out = []
    per_package = max_chars // len(PACKAGES)
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        taken = 0
        for path in sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.py")):
            blocks = [b for b in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")) if b.strip()]
            for block in blocks:
                out.append(block)
                taken += len(block)
            if taken >= per_package:
                break
    return out


def main() -> None:
    from headcount.data import code_corpus, default_corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source-chars", type=int, default=300_000)
    args = parser.parse_args()

    def paragraphs(texts):
        return [p for t in texts for p in re.split(r"\n\s*\n", t) if p.strip()]

    streams = [paragraphs(default_corpus().texts("calibration")), paragraphs(code_corpus().texts("calibration")),
               source_paragraphs(args.source_chars)]
    chunks = [p for group in itertools.zip_longest(*streams) for p in group if p]
    args.out.write_text("\n\n".join(chunks), encoding="utf-8")
    print(f"{args.out}: {sum(map(len, chunks)):,} chars; prose {sum(map(len, streams[0])):,}, code-like "
          f"{sum(map(len, streams[1])):,}, source {sum(map(len, streams[2])):,}")


if __name__ == "__main__":
    main()
