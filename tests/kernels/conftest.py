import os

import torch

# Without a GPU, Triton kernels run in its interpreter; the flag must be set before
# any @triton.jit function is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
