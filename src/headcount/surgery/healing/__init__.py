"""Healing: distillation from the unedited model after any edit (issue 26). One place, used by every edit.

    loss.py     distill_kl: KL(teacher || student) of next-token distributions, chunked over positions
    weights.py  which weights move (attention / all / lora), the teacher and dtype checks
    loop.py     heal(): the training loop (AdamW, warm-up + cosine, validation split, early stopping)
    result.py   HealResult (to_json, the saved metadata)
    cli.py      `headcount heal` and the --heal-steps wiring of prune / merge-kv
    bench.py    `headcount bench surgery --part heal`: step speed vs plain PyTorch, quality vs tokens
"""
