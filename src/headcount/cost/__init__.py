"""The three accounts (parameters, FLOPs, score memory) and the KV cache. Pure Python: no torch.

    >>> from headcount.cost import get_preset, report
    >>> report(get_preset("llama-3-8b").shape, seq=8192, dtype="bf16")["params"]["total"]
    8030261248

measure.py (the checks against a run) imports torch inside its functions only.
"""

from headcount.cost.accounts import (FLOP_CONVENTION, attention_flops, attention_params, flop_counts, kv_cache,
                                     mlp_flops, mlp_params, param_counts, report, score_memory)
from headcount.cost.fit import fit, parse_budget, parse_seq
from headcount.cost.presets import ALIASES, PRESETS, Preset, get_preset, preset_names
from headcount.cost.shape import (DTYPES, CostError, ModelShape, describe, from_config, override, parse_dtype,
                                  shape_from_config_dict)

__all__ = [
    "ALIASES", "DTYPES", "FLOP_CONVENTION", "PRESETS", "CostError", "ModelShape", "Preset", "attention_flops",
    "attention_params", "describe", "fit", "flop_counts", "from_config", "get_preset", "kv_cache", "mlp_flops",
    "mlp_params", "override", "param_counts", "parse_budget", "parse_dtype", "parse_seq", "preset_names", "report",
    "score_memory", "shape_from_config_dict",
]
