"""The command-line options every room shares, declared once: the same flag, default and help everywhere.

    from headcount.cli_options import ModelOpt, JsonOpt, OutOpt, ForceOpt

    @app.command("prune")
    def prune_cmd(model: ModelOpt = "smollm2", json_out: JsonOpt = False, out: OutOpt = None, ...):

Each is an `Annotated[type, typer.Option(...)]`; the default is the parameter's own default (typer reads it
from the signature), so a command that needs another default (eval's `--model`, which has none) says so in
its signature and keeps the flag and the help. Sits low, beside cli_errors: imports typer only, so every
room's cli.py may use it. The help texts that models/options.py and surgery/cli_common.py used to hold live
here; they re-export them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

MODEL_HELP = ("a zoo name (minilm, smollm2, gemma3-270m, qwen2.5-coder-0.5b, ...), a transformers / headcount "
              "checkpoint directory, or a .gguf file")
DTYPE_HELP = "weights' precision: fp32, bf16 or fp16 (statistics are always accumulated in fp32 / fp64)"
DEVICE_HELP = "cpu, cuda, cuda:N or auto (cuda when available)"
EVAL_HELP = ("TASK[:N]: also judge the edit by pass@1 on a task (humaneval, or a JSONL file of problems; N = the "
             "first N), before the edit, after it and after healing; repeatable")
TEXT_HELP = ("UTF-8 text split into calibration and held-out paragraphs (default: the default corpus)")
HEAL_STEPS_HELP = "heal the edited model: distillation steps from the unedited one (headcount heal; 0 = none)"
EVAL_WINDOWS_HELP = "held-out windows of 512 tokens measured per domain"

ModelOpt = Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP)]
OptionalModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help=MODEL_HELP)]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)]
DeviceOpt = Annotated[str, typer.Option("--device", help=DEVICE_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="directory to save the edited model to")]
ForceOpt = Annotated[bool, typer.Option("--force", help="replace --out if it exists")]
TextOpt = Annotated[Optional[Path], typer.Option("--text", help=TEXT_HELP)]
EvalOpt = Annotated[Optional[list[str]], typer.Option("--eval", help=EVAL_HELP)]
HealStepsOpt = Annotated[int, typer.Option("--heal-steps", help=HEAL_STEPS_HELP)]
EvalWindowsOpt = Annotated[int, typer.Option("--eval-windows", help=EVAL_WINDOWS_HELP)]
PngOpt = Annotated[Optional[Path], typer.Option("--png", help="also write the figure to this PNG file")]
SeedOpt = Annotated[int, typer.Option("--seed", help="random seed")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="under torchrun: seconds a collective waits for the "
                                                             "other ranks before this rank gives up")]

# The edit commands' own options (prune, merge-kv, heal): declared here too, so a command's signature is a list
# of names. A default that is a library constant stays the library's (the command passes it as the default).
CALIBRATION_WINDOWS_HELP = "calibration windows of 512 tokens (default corpus: half prose, half code-like text)"
CalibrationWindowsOpt = Annotated[int, typer.Option("--calibration-windows", help=CALIBRATION_WINDOWS_HELP)]
FractionOpt = Annotated[Optional[float], typer.Option("--fraction", help="share of query heads to remove, in (0, 1)")]
PruneModeOpt = Annotated[str, typer.Option("--mode", help="query (any heads) or group (whole GQA groups)")]
CompensateOpt = Annotated[Optional[str], typer.Option("--compensate", help="none, mean or lstsq (default lstsq; "
                                                                           "with --joint none, the only choice)")]
OrderOpt = Annotated[str, typer.Option("--order", help="importance method (gradient, ablation, confidence, "
                                                       "reconstruction) or random")]
UniformOpt = Annotated[bool, typer.Option("--uniform", help="same number from every layer (and GQA group)")]
CurveOpt = Annotated[bool, typer.Option("--curve", help="the pruning curve instead of one pruned model")]
PruneMethodOpt = Annotated[str, typer.Option("--method", help="retraining-free (heads chosen by --order) or l0 "
                                                              "(trained hard-concrete gates choose them; --steps, "
                                                              "--lr)")]
JointOpt = Annotated[bool, typer.Option("--joint", help="--method l0: train the model's weights WITH the gates "
                                                        "(distillation from the unedited model), then remove the "
                                                        "closed heads")]
JointParamsOpt = Annotated[Optional[str], typer.Option("--joint-params", help="with --joint: the weights that train "
                                                                              "(attention, the default: q/k/v/o and "
                                                                              "their norms; or all)")]
KVHeadsOpt = Annotated[int, typer.Option("--kv-heads", help="KV heads per merged layer (1 = MQA)")]
MergeMethodOpt = Annotated[str, typer.Option("--method", help="aware (activation-aware, rotary-respecting) or mean "
                                                              "(GQA paper mean-pooling; needs a divisor of the "
                                                              "current count)")]
LayersOpt = Annotated[Optional[str], typer.Option("--layers", help="comma-separated layers to merge (default all)")]
LocalStepsOpt = Annotated[int, typer.Option("--local-steps", help="aware: Adam steps per merged layer reproducing "
                                                                  "its own output, one calibration window a step "
                                                                  "(block-wise reconstruction; 0 = the closed form "
                                                                  "alone)")]
LocalTokensOpt = Annotated[int, typer.Option("--local-tokens", help="aware: tokens of its window each local step "
                                                                    "fits, the first ones (exact for a causal "
                                                                    "layer; 0 = the whole window)")]
TeacherOpt = Annotated[str, typer.Option("--teacher", help="the unedited model it came from (zoo name or path)")]

# Read-only commands' options (perplexity, roles, faithfulness, rank, generate, the report).
TEXT_FILE_HELP = ("a UTF-8 text file, read whole (default: the default corpus: its held-out part to measure on, its "
                  "calibration part to analyse)")
TextFileOpt = Annotated[Optional[Path], typer.Option("--text", help=TEXT_FILE_HELP)]
OptionalSeedOpt = Annotated[Optional[int], typer.Option("--seed", help="random seed")]
EditedModelOpt = Annotated[str, typer.Option("--model", "-m", help="the edited model (a directory `headcount prune` / "
                                                                   "`merge-kv` saved, or any model)")]
SensitivityOpt = Annotated[str, typer.Option("--sensitivity", help="a merge plan's (--budget, merge:B) cost of "
                                             "each layer: the next-token loss on calibration text (loss) or the KL "
                                             "to the unedited model on its own chat answers and prose (kl); auto: kl "
                                             "for a model with a chat template, else loss; the table is kept under "
                                             "$HEADCOUNT_CACHE/merge-sensitivity by weights hash")]
