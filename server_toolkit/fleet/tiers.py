"""Tier assignment: which of the fleet's tiers a newly paired device trains.

Each tier's sub-model (from the method's planner, ``Method.tier_plan``) is costed from its
spec alone (``spec_cost``): parameters, forward FLOPs per sample (a multiply-add = 2 FLOPs;
conv and linear layers only) and activations per sample (every layer's output, floats).
The device measured, at pairing, the training step time of every tier's sub-model on each
runtime it has (``profile["bench"]["tiers"]``). A tier *fits* when

* memory: the runtime's own footprint (the pairing process's resident memory after loading
  the runtime, measured) + the tier's training memory at the recipe's batch size
  (``train_memory_mb``: weights, gradients and optimizer state, plus every activation and
  its gradient) is at most ``memory_share`` of the memory available on the device; and
* time: the local training of one round, ``epochs * ceil(samples / batch)`` steps of the
  tier's measured step time (fastest runtime), takes at most ``time_share`` of the round
  timeout (the rest is for transfers and stragglers). A tier the device did not time (skipped
  for memory, or its runtimes failed) gets the step time of the measured tier nearest in
  FLOPs, scaled by the FLOPs ratio; ``bench/pairing.py`` shows why measuring every tier beats
  that scaling (small sub-models are dominated by per-step overhead).

The largest tier (by FLOPs) that fits is chosen; when none fits, the smallest, flagged.
Without tiers the device trains the full model and the same check says whether it fits.
When the device gave no data at pairing, ``ASSUMED_SAMPLES`` samples are assumed (and said).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fedcore.modelspec import infer_shapes

ASSUMED_SAMPLES = 1000


@dataclass(frozen=True)
class SpecCost:
    """What one training sample costs in a model: ``params`` (count), ``flops`` (forward,
    per sample), ``activations`` (floats produced by all layers, per sample)."""

    params: int
    flops: float
    activations: int

    def to_dict(self) -> dict:
        return asdict(self)


def spec_cost(spec: dict) -> SpecCost:
    """Cost of a torchspec/1 model (see the module docstring)."""
    params, flops, acts, _ = _layers_cost(spec["layers"], tuple(spec["input_shape"]))
    return SpecCost(params, flops, acts)


def _layers_cost(layers: list[dict], shape: tuple) -> tuple[int, float, int, tuple]:
    """(params, flops, activations, output shape) of ``layers`` on per-sample input ``shape``."""
    params = flops = acts = 0
    for layer in layers:
        op = layer["op"]
        if op in ("exit", "residual"):
            out = shape
            for key in ("head",) if op == "exit" else ("shortcut", "body"):
                p, f, a, out = _layers_cost(layer.get(key, []), shape)
                params, flops, acts = params + p, flops + f, acts + a
            if op == "residual":
                acts += math.prod(out)  # the sum
                shape = out  # the trunk continues after a residual, not after an exit
            continue
        out = infer_shapes([layer], shape, "cost")[0]
        if op == "conv2d":
            per_out = layer["in"] // layer.get("groups", 1) * layer["k"] ** 2
            params += per_out * layer["out"] + (layer["out"] if layer.get("bias", True) else 0)
            flops += 2 * per_out * math.prod(out)
        elif op == "linear":
            params += layer["in"] * layer["out"] + (layer["out"] if layer.get("bias", True) else 0)
            flops += 2 * layer["in"] * layer["out"]
        elif op == "batchnorm2d":
            params += 2 * layer["c"]
        acts += math.prod(out)
        shape = out
    return params, flops, acts, shape


def train_memory_mb(cost: SpecCost, batch_size: int, optimizer: str) -> float:
    """Training memory estimate (MiB, float32): weights + gradients + optimizer state
    (momentum: 1 copy, Adam: 2) + activations and their gradients for one batch."""
    copies = 2 + (2 if optimizer == "adam" else 1)
    return (cost.params * copies + 2 * cost.activations * batch_size) * 4 / 2**20


@dataclass(frozen=True)
class TierChoice:
    """The chosen tier (None = the full model, no tiers) and why (JSON-ready)."""

    tier: str | None
    reason: dict


def measured_steps(profile: dict) -> dict[str, tuple[float, str]]:
    """tier name -> (fastest measured ms per step, its runtime), from the profile's ``bench``."""
    out = {}
    for name, entry in ((profile.get("bench") or {}).get("tiers") or {}).items():
        timed = [r for r in entry.get("runtimes", []) if isinstance(r.get("ms_per_step"), int | float)]
        if timed:
            best = min(timed, key=lambda r: r["ms_per_step"])
            out[name] = (float(best["ms_per_step"]), best["runtime"])
    return out


def choose_tier(
    profile: dict,
    costs: dict[str, SpecCost],
    full: SpecCost,
    recipe: dict,
    round_timeout_s: float,
    memory_share: float = 0.5,
    time_share: float = 0.5,
) -> TierChoice:
    """Pick the largest tier of ``costs`` (tier name -> cost; empty = no tiers: the one model,
    of cost ``full``, named "") that fits the device described by ``profile`` (see the module
    docstring). ``recipe`` is the fleet's device recipe (a dict)."""
    costs = costs or {"": full}
    measured = measured_steps(profile)
    available = profile.get("memory_available_mb") or profile.get("memory_mb")
    base_mb = float((profile.get("bench") or {}).get("base_rss_mb") or 0.0)
    samples = profile.get("num_samples")
    assumed = not isinstance(samples, int) or samples <= 0
    samples = ASSUMED_SAMPLES if assumed else samples
    batch = int(recipe.get("batch_size", 32))
    steps = int(recipe.get("epochs", 1)) * math.ceil(samples / batch)
    memory_budget = available * memory_share if available else None
    time_budget = round_timeout_s * time_share
    rows = []
    for name, cost in sorted(costs.items(), key=lambda kv: -kv[1].flops):
        need_mb = base_mb + train_memory_mb(cost, batch, recipe.get("optimizer", "sgd"))
        step_ms, runtime, source = _step_estimate(name, cost, measured, costs)
        round_s = steps * step_ms / 1000 if step_ms is not None else None
        rows.append(
            {
                "tier": name or None,
                "params": cost.params,
                "mflops": cost.flops / 1e6,
                "memory_mb": need_mb,
                "step_ms": step_ms,
                "step_source": source,
                "runtime": runtime,
                "round_s": round_s,
                "fits_memory": memory_budget is None or need_mb <= memory_budget,
                "fits_time": round_s is None or round_s <= time_budget,
            }
        )
    fitting = [r for r in rows if r["fits_memory"] and r["fits_time"]]
    chosen = fitting[0] if fitting else rows[-1]
    reason = {
        "mode": "auto",
        "tier": chosen["tier"],
        "fits": bool(fitting),
        "memory_available_mb": available,
        "memory_budget_mb": memory_budget,
        "base_rss_mb": base_mb,
        "time_budget_s": time_budget,
        "samples": samples,
        "samples_assumed": assumed,
        "steps_per_round": steps,
        "tiers": rows,
    }
    reason["summary"] = summarize(reason)
    return TierChoice(chosen["tier"], reason)


def _step_estimate(
    name: str, cost: SpecCost, measured: dict[str, tuple[float, str]], costs: dict[str, SpecCost]
) -> tuple[float | None, str | None, str | None]:
    """(ms per step, runtime, "measured" or "scaled from tier X") of one tier: its own
    measurement, else the measured tier nearest in FLOPs scaled by the FLOPs ratio."""
    if name in measured:
        return measured[name][0], measured[name][1], "measured"
    known = [(n, costs[n]) for n in measured if n in costs and costs[n].flops > 0]
    if not known or cost.flops <= 0:
        return None, None, None
    ref, ref_cost = min(known, key=lambda kv: abs(math.log(kv[1].flops / cost.flops)))
    ms, runtime = measured[ref]
    return ms * cost.flops / ref_cost.flops, runtime, f"scaled from tier {ref}"


def summarize(reason: dict) -> str:
    """One sentence: what was chosen and the deciding figures."""
    name = reason["tier"] if reason["tier"] is not None else "full model"
    if reason.get("mode") != "auto":
        return f"tier {name}: {reason.get('note', 'set by the operator')}"
    row = next(r for r in reason["tiers"] if r["tier"] == reason["tier"])
    budget = f" of a {reason['memory_budget_mb']:.0f} MB budget" if reason["memory_budget_mb"] else ""
    parts = [f"~{row['memory_mb']:.0f} MB{budget}"]
    if row["round_s"] is not None:
        how = (
            row["runtime"] if row["step_source"] == "measured" else f"{row['runtime']}, {row['step_source']}"
        )
        parts.append(
            f"~{row['round_s']:.1f} s of local training per round "
            f"(budget {reason['time_budget_s']:.0f} s, {how})"
        )
    else:
        parts.append("no step time measured")
    larger = [r for r in reason["tiers"] if r["mflops"] > row["mflops"]]
    why_not = ""
    if larger:
        r = larger[-1]
        why_not = f"; tier {r['tier']} would not fit ({'memory' if not r['fits_memory'] else 'time'})"
    verdict = "" if reason["fits"] else " (below the fleet's requirements: the smallest tier)"
    samples = f", {reason['samples']} samples" + (" assumed" if reason["samples_assumed"] else "")
    return f"tier {name}{verdict}: {', '.join(parts)}{samples}{why_not}"
