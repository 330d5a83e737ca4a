import os

import pytest
import torch
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Deterministic property tests: fixed examples every run, no deadline (CI machines are shared).
settings.register_profile("headcount", derandomize=True, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("headcount")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
