"""What a heal holds at its peak, as a formula of the model's shape (the bound it must meet: a 1.5B model heals in
bf16 within 2x its weights + 1 GiB), and the measurement it is checked against.

    heal_memory(shape, *, dtype="bf16", edited_layers=None, teacher="separate", ...) -> {term: bytes, "total": ...}
    measure_peak(config, *, dtype="bf16", ...) -> [{"peak_bytes", "formula_bytes", ...}]   (in a fresh process)

The terms (b = bytes per weight of `dtype`, m = the weights that move, N = tokens of one step):
- student weights: every parameter x b; teacher: the same again when loaded apart (`headcount heal --teacher`),
  or only its own attention when it shares every other tensor with the student (`--heal-steps` on an edit:
  models.copying.attention_copy);
- moved weights: fp32 master (4) + AdamW's two fp32 moments (8) when b < 4, else the moments only, plus the
  best-validation copy (b): m x (12 + b) (fp32: m x (8 + 4));
- the teacher's cached hidden states: windows x (window - 1) x d_model x b (0 when past step.CACHE_BYTES);
- the heal's own runtime (RUNTIME_BYTES, measured: the modules it imports, autograd's engine);
- then the larger of (a) the step's activations: autograd's saved tensors per token and layer from the first
  edited layer on, counted on the decoder (bf16: 2 x (3 d_ff + 6 d_model + 3 n_heads head_dim + 3 n_kv_heads
  head_dim) + 4 n_heads bytes), times ACTIVATION_FACTOR (1.6, measured), the KL's student gradient and teacher
  rows (2 x N x d_model x b) and LOGIT_COPIES fp32 [rows, vocab] chunks (rows = min(N, LOGIT_ELEMENTS_GRAD //
  vocab)); with layer checkpointing (heal(checkpoint_layers=True), the default for bf16 weights of 1 GiB or more) each
  layer's input (N x d_model x b per layer) and ONE layer's activations instead; and (b) the optimizer step:
  the fp32 gradients of the moved weights (m x 4) plus AdamW's temporaries: on CPU one tensor at a time (2 x
  4 bytes x the largest moved tensor), on CUDA (foreach) one of every moved weight (m x 4 more).
The process itself (Python, torch's libraries, ~0.3-0.5 GiB resident on CPU) is not a term: the target speaks
of what the run holds. The counts are for bf16 (the target's dtype); an fp32 heal holds fewer bytes per
saved element than 2x (some norms save fp32 copies in bf16 too), so the formula overestimates it. Measured against heal() on random configs by measure_peak (tests/test_surgery_heal_scale).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from headcount.arguments import one_of

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LOGIT_COPIES = 4  # fp32 [rows, vocab] tensors alive at once in loss._fused (3, plus a linear's output in flight)
# measured on random configs (tests/test_surgery_heal_scale.py, docs/healing.md): the resident peak of a step's
# activations is 1.6x the saved tensors counted (backward's transient gradients of the layer it is in, the
# allocator's rounding), and the heal brings in ~80 MiB of its own (modules it imports, autograd's engine)
ACTIVATION_FACTOR = 1.6
RUNTIME_BYTES = 80 << 20


def _moved(shape, layers: int) -> int:
    """Weights heal's "attention" default moves in `layers` edited layers: q/k/v/o (+ biases, q/k norms) and the
    norms around the attention (attn_norm, and post_attn_norm where the block has post-norms)."""
    from headcount.cost.accounts import _norm_params, attention_params

    return layers * (attention_params(shape)["total"] + (2 if shape.post_norms else 1) * _norm_params(shape))


def activation_bytes_per_token(shape, dtype: str = "bf16") -> int:
    """Autograd's saved tensors for one token through one layer whose attention trains (frozen MLP)."""
    elements = 3 * shape.d_ff + 6 * shape.d_model + 3 * shape.n_heads * shape.head_dim + \
        3 * shape.n_kv_heads * shape.head_dim
    return BYTES[dtype] * elements + 4 * shape.n_heads


def heal_memory(shape, *, dtype: str = "bf16", edited_layers: int | None = None, teacher: str = "separate",
                batch_windows: int | None = None, window: int | None = None, cached_windows: int | None = None,
                checkpoint_layers: bool = False, device: str = "cpu") -> dict:
    """The heal's peak in bytes, by term (see the module doc); shape: a cost.ModelShape. edited_layers: how many
    layers' attention moves (None: every layer), counted from the first edited layer to the last layer for
    the activations. teacher: "separate" (a second full model) or "shared" (attention_copy). checkpoint_layers:
    heal's layer checkpointing (each layer's input kept, one layer's activations at a time). device: "cpu"
    (AdamW steps one tensor at a time: its temporaries are the largest moved tensor's) or "cuda" (foreach: a
    temporary of every moved weight). batch_windows / window / cached_windows: None = heal's defaults (BATCH_SIZE
    windows of WINDOW tokens a step, DEFAULT_TOKENS // WINDOW windows cached)."""
    from headcount.cost.accounts import param_counts
    from headcount.models.decoder import LOGIT_ELEMENTS_GRAD
    from headcount.surgery.healing.loop import BATCH_SIZE, DEFAULT_TOKENS, WINDOW
    from headcount.surgery.healing.step import CACHE_BYTES

    batch_windows = BATCH_SIZE if batch_windows is None else batch_windows
    window = WINDOW if window is None else window
    cached_windows = DEFAULT_TOKENS // window if cached_windows is None else cached_windows

    one_of("dtype", dtype, BYTES)
    one_of("teacher", teacher, ("separate", "shared"), expected="'separate' or 'shared'")
    b = BYTES[dtype]
    layers = shape.n_layers if edited_layers is None else edited_layers
    weights = param_counts(shape)["total"]
    moved = _moved(shape, layers)
    tokens = batch_windows * window
    cache = cached_windows * (window - 1) * shape.d_model * b
    terms = {
        "student_weights": weights * b,
        "teacher_weights": weights * b if teacher == "separate" else moved * b,
        "moved_fp32_master_and_adam": moved * ((12 if b < 4 else 8) + b),
        "teacher_hidden_cache": cache if cache <= CACHE_BYTES else 0,
        "runtime": RUNTIME_BYTES,
    }
    rows = min(tokens, max(1, LOGIT_ELEMENTS_GRAD // shape.vocab_size))  # distill_kl's chunk of positions
    per_token = ACTIVATION_FACTOR * activation_bytes_per_token(shape, dtype)
    saved = tokens * (layers * shape.d_model * b + per_token) if checkpoint_layers else tokens * layers * per_token
    activations = int(saved) + 2 * tokens * shape.d_model * b + LOGIT_COPIES * 4 * rows * shape.vocab_size
    from headcount.cost.accounts import attention_params
    a = attention_params(shape)
    largest = max(a["q"] + a["k"] + a["v"], a["o"])
    step = moved * 8 if device == "cuda" else moved * 4 + 2 * 4 * largest
    terms["activations_or_step"] = max(activations, step)
    terms["total"] = sum(terms.values())
    return {**terms, "moved_params": moved, "weights": weights, "activations": activations, "step": step}


# ------------------------------------------------------------------------------------------ measured
def _child(args: dict) -> dict:
    import gc

    import torch

    from headcount.cost.measure import status_kib
    from headcount.heap import bound_heap
    from headcount.models.copying import attention_copy
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.surgery.healing.loop import heal

    bound_heap()  # as `headcount heal` does for a model of 1 GiB or more (the 1.5B): freed blocks go back
    torch.set_num_threads(1)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args["dtype"]]
    cfg = DecoderConfig(**args["config"], rope_theta=10000.0, norm_eps=1e-5)
    n, t = args["windows"], args["window"]
    ids = torch.randint(0, cfg.vocab_size, (n, t), generator=torch.Generator().manual_seed(1))
    peaks = []
    for flag in args["checkpoint_layers"]:  # one heal per setting, each on fresh models, the peak reset between
        torch.manual_seed(0)
        teacher = Decoder(cfg).to(dtype).eval()
        student = attention_copy(teacher)  # every layer heals (nothing differs: heal moves every layer's attention)
        with torch.no_grad():
            teacher(ids[:1, :8])  # warm-up: thread pools, kernels
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak-RSS high-water mark (Linux >= 4.0)
        before = status_kib("VmRSS")
        heal(student, teacher, steps=args["steps"], tokens=n * t, calibration=ids, window=t,
             batch_size=args["batch"], validation_windows=2, held_out=False, progress=False, checkpoint_layers=flag)
        peaks.append((status_kib("VmHWM") - before) * 1024)
        del teacher, student
        gc.collect()
    return {"peak_bytes": peaks}


def measure_peak(config: dict, *, dtype: str = "bf16", window: int = 256, batch: int = 2, windows: int = 8,
                 steps: int = 3, checkpoint_layers=(False, True), timeout: float = 300.0) -> list[dict]:
    """Heal a random Decoder(DecoderConfig(**config)) in `dtype` for `steps` steps in a fresh process, once per
    checkpoint_layers setting; each one's peak resident memory above what the two models already held,
    against the formula's (every term but the weights present before the heal: the student's, and the
    teacher's which it shares but for attention)."""
    from headcount.cost.shape import ModelShape

    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    procs = []
    for flag in checkpoint_layers:  # one fresh process per setting, run side by side (each its own peak)
        args = {"config": config, "dtype": dtype, "window": window, "batch": batch, "windows": windows,
                "steps": steps, "checkpoint_layers": [flag]}
        procs.append(subprocess.Popen([sys.executable, "-m", "headcount.surgery.healing.memory", json.dumps(args)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    measured = {"peak_bytes": []}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"heal peak-memory child failed ({proc.returncode}): {tail}")
        measured["peak_bytes"] += json.loads(stdout.strip().splitlines()[-1])["peak_bytes"]
    c = config
    shape = ModelShape(name="random", d_model=c["d_model"], n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
                       head_dim=c["head_dim"], n_layers=c["n_layers"], d_ff=c["d_ff"], vocab_size=c["vocab_size"],
                       mlp="gated", norm="rmsnorm", final_norm=True, tied_embeddings=c.get("tie_embeddings", True))
    out = []
    for flag, peak in zip(checkpoint_layers, measured["peak_bytes"]):
        terms = heal_memory(shape, dtype=dtype, teacher="shared", batch_windows=batch, window=window,
                            cached_windows=windows, checkpoint_layers=flag)
        # present before the heal: the student's weights and its own attention copy (the teacher's share)
        formula = terms["total"] - terms["student_weights"] - terms["teacher_weights"]
        out.append({"checkpoint_layers": flag, "peak_bytes": peak, "formula_bytes": formula, "terms": terms})
    return out

if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
