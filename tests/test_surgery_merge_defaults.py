"""One truth for K/V merging: merge_kv(model, n) with no overrides is `headcount merge-kv --kv-heads n`.
The command's own code path (the MergeKV edit run by the edit commands' skeleton, what `headcount merge-kv` calls) and the API with its defaults give
bit-identical weights on a tiny random decoder, and the API's defaults include the command's local reconstruction
and its short uptrain."""

import pytest
import torch
from conftest import tiny_byte_decoder

from headcount.models import load
from headcount.surgery import merge_kv, save
from headcount.surgery.merging import cli
from headcount.surgery.merging.defaults import CALIBRATION_WINDOWS, LOCAL_STEPS, UPTRAIN_STEPS


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: conftest's module-wide single thread


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """conftest's 2-layer random GQA decoder with a byte-level tokenizer, saved: what `headcount merge-kv --model
    DIR` loads."""
    path = tmp_path_factory.mktemp("merge_defaults") / "tiny"
    save(tiny_byte_decoder(max_position=512), path)
    return path


def test_the_api_defaults_are_the_commands(saved_tiny, tmp_path):
    out = tmp_path / "merged"
    from headcount.surgery.command import EditOptions, run_edit_command

    # `headcount merge-kv --kv-heads 1 --out D`
    data, _ = run_edit_command(cli.MergeKV(cli.MergeSettings(1)),
                               EditOptions(model=str(saved_tiny), out=out, eval_windows=1))
    by_command = load(out).state_dict()

    model = load(saved_tiny)
    result = merge_kv(model, 1, progress=False)  # no overrides
    by_api = model.state_dict()
    assert by_command.keys() == by_api.keys()
    for name, tensor in by_api.items():
        assert torch.equal(tensor, by_command[name]), name
    assert all(layer.attn.n_kv_heads == 1 for layer in model.layers)

    # the defaults themselves: the command's calibration, local reconstruction and uptrain, run by the API
    assert result.options["n_windows"] == CALIBRATION_WINDOWS and result.options["local_steps"] == LOCAL_STEPS
    assert result.calibration_tokens == CALIBRATION_WINDOWS * 512
    assert result.uptrain is not None and result.uptrain["steps"] == UPTRAIN_STEPS
    assert result.options["uptrain_steps"] == UPTRAIN_STEPS
    assert all(layer.error_after_local is not None for layer in result.layers)  # the local steps ran
    # the command's JSON carries the same merge and the weights it started from (what saved results are keyed by)
    from headcount.models.fingerprint import weights_hash
    assert data["weights_sha256"] == weights_hash(load(saved_tiny))
    assert data["edit"]["uptrain"] == result.uptrain | {k: data["edit"]["uptrain"][k] for k in ("seconds",)}


def test_closed_form_when_asked(saved_tiny):
    model = load(saved_tiny)
    result = merge_kv(model, 1, local_steps=0, uptrain_steps=0, n_windows=2, progress=False)
    assert result.uptrain is None and all(layer.error_after_local is None for layer in result.layers)
    with pytest.raises(ValueError, match="uptrain_steps"):
        merge_kv(load(saved_tiny), 1, uptrain_steps=-1, progress=False)
