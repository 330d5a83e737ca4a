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
