"""Which heal to keep, read on validation, never on the task: the KL to the teacher per answer token on the
teacher's own answers to the held-aside calibration stubs (the teacher-answers calibration's last
VALIDATION_WINDOWS windows: stubs no heal trains on, whatever its calibration), for an edited model unhealed and
each of its heals. The same yardstick for every calibration, so their heals can be compared (each heal's own
val_kl is measured on its own calibration's split: a student-answers heal's on the student's answers).

    python benchmarks/heal_validation.py --teacher qwen2.5-coder-0.5b EDITED HEALED_A HEALED_B ... [--json]

The teacher's answers are read back from $HEADCOUNT_CACHE/teacher when a heal with the default steps and tokens
wrote them (a teacher-answers heal of 100 steps: pass --steps 100), else written now (minutes).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


def answer_kl(model, teacher, ids: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """(summed KL(teacher || model) over the answer tokens of the windows, how many): the distribution at j - 1
    scored where token j is an answer token, as the heal's masked loss counts it."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for row, targets in zip(ids, mask):
            where = targets[1:].nonzero().flatten()  # positions j - 1 whose next token is an answer token
            if where.numel() == 0:
                continue
            end = int(where.max()) + 1
            x = row[None, :end]
            p = F.log_softmax(teacher(x).logits[0, where].double(), -1)
            q = F.log_softmax(model(x).logits[0, where].double(), -1)
            total += float((p.exp() * (p - q)).sum())
            count += int(where.numel())
    return total, count


def main() -> None:
    from headcount.models.options import load_model
    from headcount.surgery.healing.calibrations import build_calibration
    from headcount.surgery.healing.config import DEFAULT_TOKENS, VALIDATION_WINDOWS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--steps", type=int, default=100, help="the heals' steps (sets how many windows are drawn)")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()

    teacher = load_model(args.teacher, "fp32", "cpu").eval()
    answers, _ = build_calibration("teacher-answers", teacher, args.steps, args.tokens, cache=True)
    ids, mask = answers.ids[-VALIDATION_WINDOWS:], answers.mask[-VALIDATION_WINDOWS:]
    rows = []
    for name in args.models:
        t0 = time.perf_counter()
        model = load_model(name, "fp32", "cpu").eval()
        total, count = answer_kl(model, teacher, ids, mask)
        rows.append({"model": name, "validation_kl": total / count, "answer_tokens": count,
                     "windows": len(ids), "seconds": round(time.perf_counter() - t0, 1)})
        del model
    if args.json:
        print(json.dumps({"teacher": args.teacher, "rows": rows}, indent=2))
        return
    print(f"KL to {args.teacher} per answer token, its answers to {len(ids)} held-aside stubs")
    for r in rows:
        print(f"{r['validation_kl']:.4f}  {r['model']}  ({r['answer_tokens']} tokens, {r['seconds']} s)")


if __name__ == "__main__":
    main()
