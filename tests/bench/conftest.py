import os

import torch

from tests.inference.conftest import make_engine, one_thread, tiny_model  # noqa: F401

# The CUDA script runs its Triton kernels interpreted here; set before any @triton.jit.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
