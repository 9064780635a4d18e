"""inference.gguf_file reads what gguf.GGUFReader reads, without parsing vocabularies."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from inference.gguf_file import GGUFFile, GGUFFormatError
from inference.loader import smollm2_gguf_path
from tests.inference.test_gguf_weights import small_gguf  # noqa: F401 (a fixture)


def same_as_the_reader(path) -> None:
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert ours.architecture == theirs.fields["general.architecture"].contents()
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type) == (b.name, b.tensor_type)
        assert a.shape == tuple(int(x) for x in b.shape)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, np.asarray(b.data)), a.name


def test_a_written_file_reads_as_ggufs_reader_reads_it(small_gguf):  # noqa: F811
    same_as_the_reader(small_gguf)


def test_the_shipped_smollm2_reads_as_ggufs_reader_reads_it():
    """A real file: a 49k-token vocabulary (string and number arrays) stepped over."""
    same_as_the_reader(smollm2_gguf_path())
    meta = GGUFFile(smollm2_gguf_path()).metadata
    assert meta["tokenizer.ggml.tokens"] == ("array", 49152)
    assert meta["llama.block_count"] == 30


def test_what_is_not_a_whole_gguf_file_is_refused(small_gguf, tmp_path):  # noqa: F811
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not a gguf file at all, but long enough")
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        GGUFFile(other)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes()[:200])
    with pytest.raises(GGUFFormatError):
        GGUFFile(cut)
    short = tmp_path / "short.gguf"
    data = small_gguf.read_bytes()
    short.write_bytes(data[: len(data) - 64])
    with pytest.raises(GGUFFormatError, match="past the end"):
        [t.data for t in GGUFFile(short).tensors]
