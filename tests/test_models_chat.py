"""Chat templates (models/chat.py): the template a checkpoint carries, rendered with the ids transformers'
apply_chat_template gives; kept through headcount's save and its transformers export; sandboxed."""

import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from headcount.cli import app  # noqa: E402
from headcount.models import load  # noqa: E402
from headcount.models.chat import ChatTemplateError, render  # noqa: E402
from headcount.models.formats.gguf import chat_template as gguf_chat_template  # noqa: E402

CONVERSATIONS = [
    [{"role": "user", "content": "Write a function that adds two numbers."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Ünïcode ✓ and\n\ttabs"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


@pytest.fixture(scope="module")
def qwen():
    return load("qwen2.5-coder-0.5b")


@functools.lru_cache(maxsize=4)
def _transformers_tokenizer(directory):
    return transformers.AutoTokenizer.from_pretrained(directory)


def _transformers_ids(directory, messages, generation=True):
    tok = _transformers_tokenizer(str(directory))
    ids = tok.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _cache_dir(model):
    from headcount.models.formats.gguf import cached_checkpoint

    return cached_checkpoint(model.source_gguf)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_qwen_gguf_template_gives_transformers_ids(qwen, messages):
    directory = _cache_dir(qwen)
    assert qwen.tokenizer.chat_template == gguf_chat_template(qwen.source_gguf)  # the GGUF's own field
    for generation in (True, False):
        ours = qwen.tokenizer.apply_chat_template(messages, add_generation_prompt=generation)
        assert ours == _transformers_ids(directory, messages, generation)
    text = qwen.tokenizer.apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and messages[-1]["content"] in text


def test_smollm2_template_comes_from_its_gguf_and_renders_as_transformers_renders_it():
    from transformers.utils.chat_template_utils import render_jinja_template

    model = load("smollm2")
    template = model.tokenizer.chat_template
    assert template and "<|im_start|>" in template
    for messages in CONVERSATIONS:
        want = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                     **model.tokenizer.special_tokens)[0][0]
        assert model.tokenizer.apply_chat_template(messages, tokenize=False) == want
        assert model.tokenizer.apply_chat_template(messages) == model.tokenizer.encode(want, add_special_tokens=False)


def test_the_template_survives_save_and_transformers_export(tmp_path):
    from headcount.models import export_transformers, save

    model = load("smollm2")  # the smallest model with a template (the weights only ride along)
    saved = save(model, tmp_path / "saved")
    assert load(str(saved)).tokenizer.chat_template == model.tokenizer.chat_template
    exported = export_transformers(model, tmp_path / "hf")
    assert (exported / "chat_template.jinja").is_file()
    assert _transformers_ids(exported, CONVERSATIONS[1]) == model.tokenizer.apply_chat_template(CONVERSATIONS[1])


def test_templates_are_sandboxed_and_bad_messages_are_named():
    with pytest.raises(ChatTemplateError, match="chat template"):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="no roles here"):
        render("{{ raise_exception('no roles here') }}", CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]"):
        render("{{ messages }}", [{"role": "user"}])
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        render("{% for %}", CONVERSATIONS[0])


def test_generate_chat_cli_and_a_model_without_a_template(tmp_path):
    import copy

    from headcount.models import Decoder, save
    from headcount.models.decoder import DecoderConfig

    tok = copy.copy(load("smollm2").tokenizer)
    tok.chat_template = None  # a base model's tokenizer: no template anywhere
    plain = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    plain.tokenizer = tok
    save(plain, tmp_path / "plain")
    runner = CliRunner()
    result = runner.invoke(app, ["generate", "--model", str(tmp_path / "plain"), "--chat", "hi", "-n", "2"])
    assert result.exit_code == 2 and "no chat template" in result.output
    result = runner.invoke(app, ["generate", "--model", "smollm2", "--system", "x"])
    assert result.exit_code == 2 and "PROMPT" in result.output
    result = runner.invoke(app, ["generate", "--model", "smollm2", "--chat", "Say hello.", "--system", "Be brief.",
                                 "-n", "4"])
    assert result.exit_code == 0, result.output
