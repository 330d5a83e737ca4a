"""Chat templates: the Jinja template a checkpoint carries, rendered as transformers renders it.

Where a template lives: a GGUF file's `tokenizer.chat_template` field; a transformers directory's
`chat_template.jinja` (transformers 5) or its tokenizer_config.json's "chat_template" (transformers 4).
headcount's own saves write `chat_template.jinja` beside tokenizer.json, so an edited model keeps it.

Rendering uses jinja2's ImmutableSandboxedEnvironment (a template is data from a file, never trusted
code), set up as transformers sets it up: trim_blocks, lstrip_blocks, the loopcontrols extension, a
`tojson` filter that keeps non-ASCII characters, and the globals `raise_exception` and `strftime_now`.
The special tokens (bos_token, eos_token, ...) are passed as variables, as transformers passes them.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ChatTemplateError(ValueError):
    """A template that cannot be rendered, or messages it cannot take (one line)."""


def has_chat_template(model) -> bool:
    """True when `model` carries a tokenizer with a chat template (what asks a model in its chat format needs)."""
    return bool(getattr(getattr(model, "tokenizer", None), "chat_template", None))


def read_chat_template(directory: str | Path) -> str | None:
    """The template in `directory`: chat_template.jinja, else tokenizer_config.json's. (A GGUF file's:
    formats.gguf.chat_template.)"""
    directory = Path(directory)
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        return (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except (json.JSONDecodeError, AttributeError):
            template = None
        if isinstance(template, list):  # transformers 4's named templates: [{"name", "template"}]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if isinstance(template, str):
            return template
    return None


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ChatTemplateError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template: not valid Jinja ({e})") from None


def check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(f"messages: expected a non-empty list of {{'role', 'content'}} dicts, got {messages!r}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ChatTemplateError(f"messages[{i}]: expected a dict with string 'role' and 'content', got {m!r}")
    return [dict(m) for m in messages]


def render(template: str, messages, *, add_generation_prompt: bool = True, **variables) -> str:
    """The prompt text: the template rendered over `messages` (special tokens and extra variables passed)."""
    from jinja2 import TemplateError

    messages = check_messages(messages)
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template: {e}") from None
