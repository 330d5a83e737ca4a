"""Healing: distillation from the unedited model after any edit. One place, used by every edit.

    loss.py     distill_kl: KL(teacher || student) of next-token distributions, chunked over positions
    weights.py  which weights move (attention / all / lora), the teacher and dtype checks
    loop.py     heal(): the training loop over _Healing (setup / step / validate / back off), on headcount.training
    step.py     one step: the teacher's hidden-state cache, the KL of a batch, fp32 master weights
    teacher_text.py   the teacher's own sampled text, a calibration stream (heal --calibration teacher)
    result.py   HealResult (to_json, the saved metadata)
    cli.py      `headcount heal` and the --heal-steps step prune / merge-kv hand to surgery.editing.run_edit
    bench.py    `headcount bench surgery --part heal`: step speed vs plain PyTorch, quality vs tokens
"""
