"""Why GPT-OSS's `bench exactness --families` row misses 1e-4: both sides against a float64 reference.

    python benchmarks/gpt_oss_float64.py

The random 6-layer GPT-OSS of `headcount bench exactness --families` (sinks, GPT-OSS's yarn, 16-token windows,
top-k-then-softmax router, clamped SwiGLU), on its padded batch of 2 x 48 tokens. `.double()` alone is not a
float64 model on either side: both RMSNorms compute in float32 (transformers' GptOssRMSNorm casts to float32;
headcount's RMSNorm runs F.rms_norm on x.float() for any dtype but float32), so this script runs both in float64
(the rotary tables are float32 on both sides by design, the same numbers). Prints max |logits diff|:
  - float64 headcount vs float64 transformers (both norms in float64): the formulas, op by op;
  - fp32 transformers and fp32 headcount against that float64 reference, and against each other.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F


def main() -> None:
    import transformers.models.gpt_oss.modeling_gpt_oss as gpt_oss

    import headcount.models.decoder as decoder
    from headcount.models import from_transformers
    from headcount.models.exactness import random_transformers_model

    hf = random_transformers_model("gpt_oss")
    ours = from_transformers(hf)
    ids = torch.randint(3, 509, (2, 48), generator=torch.Generator().manual_seed(1))  # exactness's batch
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    real = mask.bool()
    with torch.inference_mode():
        hf32, ours32 = hf(input_ids=ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    hf64, ours64 = copy.deepcopy(hf).double(), copy.deepcopy(ours).double()
    hf64.config._experts_implementation = "eager"  # grouped_mm takes no float64

    def diff(a, b) -> str:
        return f"{(a - b)[real].abs().max().item():.2e}"

    with torch.inference_mode():
        a, b = hf64(input_ids=ids, attention_mask=mask).logits, ours64(ids, attention_mask=mask).logits
    print(f"logits up to {a[real].abs().max().item():.2f}")
    print(f".double() as shipped (both RMSNorms still in float32): headcount vs transformers {diff(a, b)}")

    def hf_rms(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    shipped = decoder.RMSNorm.forward

    def our_rms(self, x):
        if x.dtype == torch.float64:
            return self.weight * F.rms_norm(x, self.weight.shape, None, self.eps)
        return shipped(self, x)

    gpt_oss.GptOssRMSNorm.forward, decoder.RMSNorm.forward = hf_rms, our_rms
    with torch.inference_mode():
        a, b = hf64(input_ids=ids, attention_mask=mask).logits, ours64(ids, attention_mask=mask).logits
    print(f"float64 with both RMSNorms in float64: headcount vs transformers {diff(a, b)}")
    print(f"fp32 transformers vs float64 {diff(hf32, a)}; fp32 headcount vs float64 {diff(ours32, a)}; "
          f"fp32 headcount vs fp32 transformers {diff(ours32, hf32)}")


if __name__ == "__main__":
    main()
