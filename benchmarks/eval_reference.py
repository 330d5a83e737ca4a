"""HumanEval completions from transformers on the same weights: does the gap to the makers' figure come from
headcount's decoding, or from the weights and the prompt?

    python benchmarks/eval_reference.py [--model qwen2.5-coder-0.5b] [--limit 20]
        [--samples benchmarks/results/eval/qwen2.5-coder-0.5b-humaneval.samples.jsonl] [--out F.json]

transformers' side is all its own: AutoTokenizer renders the checkpoint's chat template, AutoModelForCausalLM
loads the zoo's checkpoint directory (the GGUF dequantized to fp32, what `headcount.models.load` reads too), and
`generate` decodes greedily, one problem at a time (no padding), up to 512 new tokens or the closing fence. Only
the instruction (tasks/prompts.chat_prompt_text) and the code kept from the answer (prompts.completion_of) are
headcount's, so both sides are asked and cut the same way. The completions are scored in the same sandbox and
compared, character for character, with headcount's saved samples of the same problems (`headcount eval
--samples`). Prints one JSON object; --out writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: the model comes from an installed package

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "benchmarks/results/eval/qwen2.5-coder-0.5b-humaneval.samples.jsonl"


def transformers_completions(name: str, problems, max_new_tokens: int) -> tuple[list, int, float]:
    import torch
    import transformers
    from tqdm import tqdm

    from headcount.models import zoo
    from headcount.tasks.problems import Completion
    from headcount.tasks.prompts import FENCE_STOP, PromptFormat, chat_prompt_text, completion_of

    directory = zoo.checkpoint_dir(name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    if not tokenizer.chat_template:
        raise SystemExit(f"--model: {name}'s tokenizer has no chat template; this reference asks in the chat format")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    fmt = PromptFormat("chat")
    out, new_tokens, t0 = [], 0, time.perf_counter()
    for problem in tqdm(problems, desc="transformers generate", unit="problem"):
        ids = tokenizer(chat_prompt_text(tokenizer, problem.prompt), add_special_tokens=False,
                        return_tensors="pt").input_ids
        with torch.inference_mode():
            row = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, stop_strings=[FENCE_STOP], tokenizer=tokenizer,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)[0, ids.shape[1]:]
        new_tokens += len(row)
        text = tokenizer.decode(row, skip_special_tokens=True)
        out.append(Completion(problem.task_id, completion_of(text, fmt)))
    return out, new_tokens, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--limit", type=int, default=20, help="the first N HumanEval problems")
    ap.add_argument("--samples", type=Path, default=SAMPLES, help="headcount's saved samples of the same model")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error(f"--limit: expected a positive number of problems, got {args.limit}")

    from headcount.tasks.harness import evaluate_completions
    from headcount.tasks.problems import load_problems, read_completions

    every = load_problems("humaneval")
    problems = every[:args.limit]
    ours = {c.task_id: c for c in read_completions(args.samples, every)}
    missing = [p.task_id for p in problems if p.task_id not in ours]
    if missing:
        ap.error(f"--samples: {args.samples} has no sample for {missing[0]} (and {len(missing) - 1} more)")
    theirs, new_tokens, seconds = transformers_completions(args.model, problems, args.max_new_tokens)
    scored = evaluate_completions(theirs, problems=problems).samples
    ours_passed = {c.task_id: bool(c.extra.get("passed")) for c in ours.values()}
    differ = [c.task_id for c in theirs if c.completion != ours[c.task_id].completion]
    row = {
        "model": args.model, "n_problems": len(problems),
        "identical_completions": len(problems) - len(differ), "differing_task_ids": differ,
        "passed_transformers": sum(bool(s.passed) for s in scored),
        "passed_headcount": sum(ours_passed[p.task_id] for p in problems),
        "verdicts_differ": [s.task_id for s in scored if bool(s.passed) != ours_passed[s.task_id]],
        "transformers_new_tokens": new_tokens, "transformers_seconds": round(seconds, 1),
        "samples": str(args.samples.relative_to(ROOT) if args.samples.is_relative_to(ROOT) else args.samples),
    }
    text = json.dumps(row, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
