"""FedConv's options (``--method-option KEY=VALUE``; ``fedsdk-server methods show fedconv``).

Server epochs are passes over the server's data (``server_fraction`` of the training set);
the three server stages (compress, dilate, aggregate) and the optional server training use
``server_batch_size``. Why the defaults are what they are: ``methods/fedconv/fedconv.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import MethodOptions, option

AGGREGATIONS = ("learned", "average")
INITS = ("delta", "random")  # a compressor's / dilator's starting weights
RESTARTS = ("delta", "warm")  # compress_init / dilate_init: fresh every round, or kept across rounds
DILATE_BASES = ("zeros", "global")
DILATE_WHATS = ("update", "model", "pullback")


@dataclass(frozen=True)
class FedConvOptions(MethodOptions):
    server_fraction: float = option(
        0.05, "Share of the training set the server keeps for its three stages, in (0, 1).", minimum=0.0)
    pretrain_epochs: int = option(
        5, "Epochs the global model is pre-trained on the server data before round 1 (0: none).", minimum=0)
    server_train_epochs: int = option(
        0, "Epochs the aggregate is trained on the server data after every round (0: never).", minimum=0)
    compress_epochs: int = option(
        20, "Epochs each shrinkage ratio's compressor is tuned on the server data per round.", minimum=0)
    dilate_epochs: int = option(
        20, "Epochs each returned model's dilator is tuned on the server data.", minimum=0)
    aggregate_epochs: int = option(
        10, "Epochs the learned per-layer aggregation weights are tuned on the server data.", minimum=0)
    lr_max: float = option(
        1e-3, "Adam learning rate of compressors and dilators (the cosine schedule's top).", minimum=0.0)
    lr_min: float = option(1e-5, "Lowest learning rate of the cosine schedule.", minimum=0.0)
    t_max: int = option(4, "Half-period of the cosine schedule, in epochs.", minimum=1)
    cosine: bool = option(True, "Cosine learning rate between lr_max and lr_min (false: lr_max throughout).")
    aggregate_lr: float = option(1e-3, "Adam learning rate of the learned aggregation weights.", minimum=0.0)
    kld_weight: float = option(
        0.2, "Weight of the KL-divergence terms beside cross-entropy in the learned aggregation.",
        minimum=0.0)
    server_batch_size: int = option(16, "Batch size (samples) of every server-side training.", minimum=1)
    expand_channels: int = option(
        16, "Channels of the 1x1 block of compressors and dilators (0: no block, no skip).", minimum=0)
    mlr: bool = option(False, "Modified Leaky ReLU (0.85 / 0.001) on generated weights (the paper's block).")
    weight_norm: bool = option(True, "Weight normalisation on the size-changing conv of the block.")
    init: str = option(
        "delta", "Start of a compressor/dilator: the top-left block / zero padding, or random.",
        choices=INITS)
    keep_norm: bool = option(True, "Rescale each compressed tensor to the norm of the global top-left block.")
    dilate_init: str = option(
        "delta", "Dilators: a fresh one per returned model (delta), or one per device kept across "
        "rounds (warm, the authors' code).",
        choices=RESTARTS)
    dilate_base: str = option(
        "zeros", "With dilate_what=model: add the global values outside the device's block (global) or not.",
        choices=DILATE_BASES)
    dilate_what: str = option(
        "update", "What is brought to full size: the device's update (global + dilated change), the returned "
        "model, or the update pulled back through the compressor (no dilator).", choices=DILATE_WHATS)
    compress_init: str = option(
        "delta", "Compressors: a fresh one per ratio every round (delta), or kept across rounds (warm, the "
        "paper's Algorithm 1).", choices=RESTARTS)
    aggregation: str = option(
        "learned", "How full-size models are combined: learned per-layer weights, or a sample-weighted "
        "average (the paper's ablation).",
        choices=AGGREGATIONS)
    tier_ratios: dict[str, float] = option(
        {}, "Shrinkage ratio in (0, 1] of each named tier, e.g. {\"phone\": 0.5}; other tiers are ratios.")
    seed: int = option(0, "Seed of the compressors', dilators' and server trainings' randomness.")
