"""The three accounts (parameters, FLOPs, score memory) and the KV cache. Pure Python: no torch.

    >>> from headcount.cost import get_preset, report
    >>> report(get_preset("llama-3-8b").shape, seq=8192, dtype="bf16")["params"]["total"]
    8030261248
    >>> kv = report(get_preset("gemma-3-270m").shape, seq=32768, dtype="bf16")["kv_cache"]
    >>> kv["bytes_for_context"], kv["bytes_for_context_without_window"]   # 15 of 18 layers keep 512 positions
    (108527616, 603979776)

measure.py (the checks against a run) imports torch inside its functions only.
"""

from headcount.cost.accounts import (FLOP_CONVENTION, attention_flops, attention_params, flop_counts, kv_cache,
                                     mlp_flops, mlp_params, param_counts, report, score_memory, window_pairs)
from headcount.cost.fit import fit, parse_budget, parse_seq
from headcount.cost.presets import ALIASES, PRESETS, Preset, get_preset, preset_names
from headcount.cost.shape import (DTYPES, LAYER_TYPES, CostError, ModelShape, describe, from_config, global_every,
                                  override, parse_dtype, shape_from_config_dict)

__all__ = [
    "ALIASES", "DTYPES", "FLOP_CONVENTION", "LAYER_TYPES", "PRESETS", "CostError", "ModelShape", "Preset", "attention_flops",
    "attention_params", "describe", "fit", "flop_counts", "from_config", "get_preset", "global_every", "kv_cache",
    "mlp_flops",
    "mlp_params", "override", "param_counts", "parse_budget", "parse_dtype", "parse_seq", "preset_names", "report",
    "score_memory", "shape_from_config_dict", "window_pairs",
]
