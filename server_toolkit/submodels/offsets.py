"""Window offset rules: where a tier's window starts, per channel space, in a round.

A rule is ``rule(layout, ratio, round_number, phase) -> {space: offset}``; ``phase`` in
[0, 1) tells apart clients of one tier within a round (rules that give every client of a
tier the same window ignore it). Offsets are taken modulo the space's size.

* ``heterofl_offsets``: 0 in every space, every round (HeteroFL's fixed top-left block).
* ``rolling_offsets``: ``round - 1`` in every space (FedRolex: the window rolls by one
  channel per round and wraps around).
* ``four_corner_offsets``: FedDM's intermediate scheme. Every layer's block sits in one
  of its four corners (start 0 or C - n on each axis, no wrap); the corner changes every
  round, and consecutive spaces take the two bits of the corner number so that each layer
  (rows = its output space, columns = its input space) visits all four corners.
* ``balanced_offsets``: FedDM's dynamic rule (our design; the paper gives none). Window
  start in space k = ``floor(C_k * frac(phase + round * a_k))``, where ``a_1..a_S`` are the
  steps of the additive low-discrepancy "R" sequence (a_k = g^-k, g the positive root of
  x^(S+1) = x + 1, S = number of cut spaces). Over rounds every space's start visits its C
  positions evenly (each channel is covered a fraction n / C of the time), and because the
  steps differ between spaces, the (row, column) starts of every layer fill the 2-D grid
  evenly too, so every element of a weight matrix is covered about equally often; the
  same offset in every space (FedRolex) favours the diagonal. ``phase`` spreads the
  clients of one tier evenly around the channel ring within a round.
"""

from __future__ import annotations

import math

from .width import WidthLayout


def heterofl_offsets(layout: WidthLayout, ratio: float, round_number: int,
                     phase: float = 0.0) -> dict[int, int]:
    return {space: 0 for space in layout.hidden_spaces}


def rolling_offsets(layout: WidthLayout, ratio: float, round_number: int,
                    phase: float = 0.0) -> dict[int, int]:
    return {space: (round_number - 1) % layout.sizes[space] for space in layout.hidden_spaces}


def four_corner_offsets(layout: WidthLayout, ratio: float, round_number: int,
                        phase: float = 0.0) -> dict[int, int]:
    corner = (round_number - 1 + int(phase * 4)) % 4
    offsets = {}
    for position, space in enumerate(layout.hidden_spaces):
        far = (corner >> (position % 2)) & 1
        offsets[space] = far * (layout.sizes[space] - layout.window_size(space, ratio))
    return offsets


def balanced_offsets(layout: WidthLayout, ratio: float, round_number: int,
                     phase: float = 0.0) -> dict[int, int]:
    spaces = layout.hidden_spaces
    steps = r_sequence_steps(len(spaces))
    return {space: math.floor(layout.sizes[space] * ((phase + round_number * step) % 1.0))
            for space, step in zip(spaces, steps, strict=True)}


def r_sequence_steps(dims: int) -> list[float]:
    """The per-dimension steps of the R_d low-discrepancy sequence (Roberts, 2018)."""
    g = 2.0
    for _ in range(60):  # fixed-point iteration for the root of x^(d+1) = x + 1
        g = (1.0 + g) ** (1.0 / (dims + 1))
    return [(1.0 / g ** k) % 1.0 for k in range(1, dims + 1)]
