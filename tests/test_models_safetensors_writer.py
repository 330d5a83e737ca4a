"""formats.tensors.SafetensorsWriter / write_safetensors: the file safetensors' own reader loads, written one
tensor at a time (save / write_checkpoint use it so that saving never holds a second copy of the model)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.tensors import SafetensorsFile, SafetensorsWriter, write_safetensors

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool]


@settings(max_examples=25, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=5),
       dtypes=st.lists(st.sampled_from(DTYPES), min_size=5, max_size=5), seed=st.integers(0, 2**16))
def test_written_files_load_with_safetensors_and_headcount(tmp_path_factory, shapes, dtypes, seed):
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        t = torch.randn(shape, generator=g) * 50
        tensors[f"t{i}.weight"] = t > 0 if dtype == torch.bool else t.to(dtype)
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    write_safetensors(path, tensors, metadata={"format": "pt"})
    back = load_file(str(path))
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    ours = SafetensorsFile(path)
    for k, v in tensors.items():
        assert torch.equal(ours[k], v)


def test_non_contiguous_tensors_are_written_as_their_values(tmp_path):
    t = torch.arange(12.0).reshape(3, 4)
    write_safetensors(tmp_path / "w.safetensors", {"a": t.T, "b": t[:, 1]})
    back = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(back["a"], t.T) and torch.equal(back["b"], t[:, 1])


def test_a_writer_refuses_wrong_sizes_and_missing_tensors(tmp_path):
    w = SafetensorsWriter(tmp_path / "w.safetensors", [("a", (2, 3), torch.float32), ("b", (4,), "BF16")])
    with pytest.raises(CheckpointError, match="'a' produced 12 bytes, expected 24"):
        w.write([torch.zeros(3)])
    w = SafetensorsWriter(tmp_path / "v.safetensors", [("a", (2,), torch.float32), ("b", (4,), "BF16")])
    w.write([torch.zeros(2)])
    with pytest.raises(CheckpointError, match="1 tensor"):
        w.close()
    with pytest.raises(ValueError, match="dtype"):
        SafetensorsWriter(tmp_path / "u.safetensors", [("a", (2,), torch.complex64)])
