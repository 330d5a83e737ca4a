"""The evaluation formats: how each model is asked a problem, where its answer stops, how many tokens it gets.

    FORMATS                     {name: EvalFormat}: the makers' published harnesses, EvalPlus's, completion
    makers_format(names) -> EvalFormat | None     the makers' entry for a model, matched on its names

One entry a family whose makers published the harness behind their reported numbers, each citing its source;
EvalPlus's generic chat format for any other chat model; the raw prompt for a base model. The answer of every
format is read by EvalPlus's sanitizer (sanitize.py), as each of these harnesses reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# evalplus/evalplus, evalplus/provider/utility.py: EOS (every model) and extra_eos_for_direct_completion (HumanEval)
EVALPLUS_EOS = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(")
DIRECT_COMPLETION_EOS = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ")
FENCE_STOP = "\n```"  # the answer's code block closes


@dataclass(frozen=True)
class EvalFormat:
    name: str  # what the JSON and --samples rows call it
    kind: str  # "makers" | "evalplus" | "completion": which --prompt-format picks it
    stops: tuple[str, ...]  # generation ends before the first of these (and at the tokenizer's special tokens)
    max_new_tokens: int
    source: str  # where the harness is published
    template: str | None = None  # makers: the literal prompt text around {prompt}, special tokens written out
    prompt_stripped: bool = True  # the problem's prompt is .strip()ped before it goes in
    matches: tuple[str, ...] = ()  # makers: regular expressions, any of which a model's name matches
    needs_tokens: tuple[str, ...] = ()  # makers: special tokens the template writes, each one token


# QwenLM/Qwen2.5-Coder, qwencoder-eval/instruct/eval_plus/model.py: class ChatML (make_model picks it for the
# "chat" models, max_new_tokens=2048; its EOS list with "\n#" and "\n```" added); generate.py strips the prompt
# and keeps the answer up to "```"; test.sh runs it --greedy, then `python -m evalplus.sanitize`. Its vLLM engine
# holds 1,536 tokens of context (VLlmDecoder's max_model_len), which bounds prompt + answer below the 2,048.
QWEN25_CODER = EvalFormat(
    name="qwen2.5-coder-instruct", kind="makers",
    stops=("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(", "\n#", FENCE_STOP),
    max_new_tokens=2048,
    source="QwenLM/Qwen2.5-Coder qwencoder-eval/instruct/eval_plus/model.py (class ChatML), test.sh",
    template=("<|im_start|>system\nYou are an intelligent programming assistant to produce Python algorithmic "
              "solutions<|im_end|>\n<|im_start|>user\nCan you complete the following Python function?\n```python\n"
              "{prompt}\n```\n<|im_end|>\n<|im_start|>assistant\n```python\n"),
    # the zoo's qwen2.5-coder-0.5b / -1.5b are the Instruct models; a checkpoint says so in its name
    matches=(r"^qwen2\.5-coder-(0\.5|1\.5)b$", r"qwen2\.5-coder-[\d.]+b-instruct"),
    needs_tokens=("<|im_start|>", "<|im_end|>"),
)

# evalplus/evalplus, evalplus/codegen.py (the instruction and response prefixes), evalplus/provider/utility.py
# (make_raw_chat_prompt: the chat template around them, the answer prefilled up to its python block; EOS),
# evalplus/provider/base.py (max_new_tokens=768), evalplus/provider/hf.py (a chat model also stops at the fence)
EVALPLUS = EvalFormat(
    name="evalplus", kind="evalplus", stops=(*EVALPLUS_EOS, FENCE_STOP), max_new_tokens=768,
    source="evalplus/evalplus evalplus/codegen.py, evalplus/provider/utility.py (make_raw_chat_prompt)",
)

# the raw HumanEval prompt continued (evalplus: a model without a chat template is a direct completion, with the
# extra stops where a new top-level statement begins; and Qwen's EOS list's "\n#")
COMPLETION = EvalFormat(
    name="completion", kind="completion", stops=(*EVALPLUS_EOS, *DIRECT_COMPLETION_EOS, "\n#"), max_new_tokens=768,
    source="evalplus/evalplus evalplus/provider/utility.py (extra_eos_for_direct_completion)", prompt_stripped=False,
)

MAKERS = (QWEN25_CODER,)
FORMATS = {f.name: f for f in (*MAKERS, EVALPLUS, COMPLETION)}
KINDS = ("auto", "makers", "evalplus", "completion", "chat")  # --prompt-format; chat = evalplus (the old name)
ALIASES = {"chat": "evalplus"}


def makers_format(names) -> EvalFormat | None:
    """The makers' format whose pattern one of `names` (a model's zoo name, path, source file) matches."""
    for fmt in MAKERS:
        for name in names:
            base = str(name).rstrip("/").lower()
            tails = {base, base.rsplit("/", 1)[-1], re.sub(r"\.gguf$", "", base.rsplit("/", 1)[-1])}
            if any(re.search(pattern, tail) for pattern in fmt.matches for tail in tails):
                return fmt
    return None
