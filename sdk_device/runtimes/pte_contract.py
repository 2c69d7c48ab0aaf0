"""The contract of a ``pte/1`` training program (an ExecuTorch program fedsdk exports), defined
once: the exporter (``export/executorch.py``) writes it, the device runtimes
(``executorch_native_runtime``, ``executorch_runtime``) check it. Here, in ``sdk_device``,
because the device side must not import ``export/`` (or torch); ``export`` imports it.

``FORMAT``: the program format's name on the wire; ``META_METHOD``: the program method that
returns a JSON string naming every input and output of ``train`` / ``evaluate``; ``SCHEMA``:
the version of that JSON (a runtime refuses another).
"""

from __future__ import annotations

FORMAT = "pte/1"
META_METHOD = "fedsdk_meta"
SCHEMA = 1

KERNELS_KEY = "kernels"  # metadata key: the kernel set a program needs; absent = PORTABLE
PORTABLE = "portable"  # ATen ops only: runs on every ExecuTorch runtime
FUSED = "fused"  # also the fedsdk:: training ops of libfedsdk_kernels (export/fused_ops.py)
KERNEL_SETS = (PORTABLE, FUSED)


class UnsupportedKernels(RuntimeError):
    """The program needs a kernel set this runtime does not have (refusal code ``code``)."""

    code = "unsupported_kernels"
