"""The width family: sub-models that are channel windows of the global model, averaged per
element over the devices covering it (``coverage``, driven by ``width_shared``).
``heterofl`` (HeteroFL, Diao et al., 2021: fixed top-left windows), ``fedrolex`` (FedRolex,
Alam et al., 2022: rolling windows) and ``feddm`` (FedDM, seed 004: balanced moving windows
plus the cooperation tree of ``similarity_tree``).

Modules are imported directly; this package re-exports nothing.
"""
