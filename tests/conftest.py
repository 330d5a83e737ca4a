import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Under pytest-xdist (`make test` runs TEST_WORKERS workers, 2 by default) each worker takes its share of the cores, and so do
# the processes it starts (torchrun ranks, sandboxes): N workers of N threads each would contend N-fold.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Deterministic property tests: fixed examples every run, no deadline (CI machines are shared).
settings.register_profile("headcount", derandomize=True, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("headcount")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _caches(tmp_path_factory, monkeypatch):
    """What a teacher writes for a heal and an edit command's task scores are cached by the commands
    (surgery/healing/teacher_cache.py, tasks/verdict_cache.py), like a merge plan's sensitivity
    (surgery/merging/sensitivity_cache.py): in tests, under fresh folders per test, never the
    user's $HEADCOUNT_CACHE, so no test reads another run's answers or verdicts."""
    from headcount.surgery.healing import teacher_cache
    from headcount.surgery.merging import sensitivity_cache
    from headcount.tasks import verdict_cache as task_cache

    teacher_root, task_root = tmp_path_factory.mktemp("teacher-cache"), tmp_path_factory.mktemp("task-cache")
    monkeypatch.setattr(teacher_cache, "cache_root", lambda: teacher_root)
    monkeypatch.setattr(task_cache, "cache_root", lambda: task_root)
    sensitivity_root = tmp_path_factory.mktemp("sensitivity-cache")
    monkeypatch.setattr(sensitivity_cache, "cache_root", lambda: sensitivity_root)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M, loaded once per test session. Tests that CHANGE weights must deepcopy it first
    (copy.deepcopy(smollm2)); analysis never changes a weight."""
    from headcount.models import load
    return load("smollm2")


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2, loaded once per test session (deepcopy before changing weights)."""
    from headcount.models import load
    return load("minilm")


def tiny_byte_decoder(max_position: int = 128):
    """A 2-layer random GQA decoder (4 query heads, 2 KV heads) with a byte-level BPE tokenizer, so the default
    corpus calibrates it and its vocabulary of 260 keeps the lm_head cheap. Seeded: the same weights each call."""
    from tokenizers import pre_tokenizers

    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.models.tokenizer import Tokenizer, byte_level_bpe

    tokens = ["<|endoftext|>"] + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=len(tokens), d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=max_position, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = Decoder(cfg).eval()
    model.tokenizer = Tokenizer(byte_level_bpe(tokens, ["Ġ t", "h e", "Ġt he"], special_ids=[0]), bos_token_id=0,
                                eos_token_id=0, pad_token_id=0, add_special_tokens=False)
    return model


@pytest.fixture(scope="module")
def one_thread():
    """A module of tiny models only: one intra-op thread for the whole module (pytest.mark.usefixtures)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread_for_tiny_models(request):
    """Tiny models: one intra-op thread (threads only spin on a shared CPU); real models keep the default."""
    if "smollm2" in request.fixturenames or "minilm" in request.fixturenames:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
