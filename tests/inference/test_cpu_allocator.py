"""The engine's allocator setting on glibc."""

import platform

import pytest

from inference.cpu_allocator import keep_heap_pages


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_accepts_the_heap_padding():
    assert keep_heap_pages() is True
