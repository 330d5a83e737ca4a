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

# Read-only commands' options (perplexity, roles, faithfulness, rank, generate, the report).
TEXT_FILE_HELP = ("a UTF-8 text file, read whole (default: the default corpus: its held-out part to measure on, its "
                  "calibration part to analyse)")
TextFileOpt = Annotated[Optional[Path], typer.Option("--text", help=TEXT_FILE_HELP)]
OptionalSeedOpt = Annotated[Optional[int], typer.Option("--seed", help="random seed")]
