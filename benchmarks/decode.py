"""SmolLM2 fp32: headcount against transformers in one process, same weights, same prompt.

    python benchmarks/decode.py [--prompt-tokens 512] [--new-tokens 64] [--repeats 3] [--json]

The same as `headcount bench decode`. Prints the medians of prefill time and decode tokens/s, side by
side, with the ratios and the targets (models/bench.py's TARGET_*): decode at least 1.3x transformers'
tokens/s, prefill in at most 0.9x its time.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: the model comes from an installed package

from headcount.models.bench import main

if __name__ == "__main__":
    sys.exit(main())
