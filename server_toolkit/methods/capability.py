"""The one capability edges, async, privacy and secure aggregation ask of a method: is its
aggregate a weighted mean of per-element contributions?

A method declares it with ``Method.weighted_sum`` (a ``WeightedSum``; None, the default: it
is not). Declaring it says: per element of each global tensor, the new value is
``sum_i a_i w_i / sum_i a_i`` over the updates covering that element, where ``a_i`` does not
depend on the values (a device's samples; for a ``Method.classifiers`` row, its samples of
that class); and ``Method.summands(global_weights, update)`` gives one update's
``(w_i, where, a_i)`` per global tensor (``methods/summands.py``).

Each feature reads only this (``weighted_sum`` / ``why_not`` below):

* edges pre-add the summands (``edge/fold.py``): every declared method without ``server_step``;
* ``--mode async`` folds staleness-weighted deltas through ``aggregate_train``
  (``rounds/staleness.py``): every declared method;
* DP and robust aggregation replace the mean by a clipped / noised / robust one over windows
  (``privacy/windows.py``): layouts ``full`` and ``window``, without ``server_step``;
* secure aggregation sums masked contributions in the layout (``secagg/aggregate.py``):
  every declared method with ``secure``.

Decisions: the declaration is inherited, but a subclass that overrides ``aggregate_train``
without declaring again has a rule of its own and is not a sum (FedDM below HeteroFL's
base); an instance may set ``weighted_sum`` in ``__init__`` when its options change the
answer (HypeMeFed without hypernetworks) - class-level checks (the CLI, before a method is
built) read the class's declaration.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, WINDOW, PRESENT = "full", "window", "present"
LAYOUTS = (FULL, WINDOW, PRESENT)
EDGES, ASYNC, PRIVACY, SECAGG = "edges", "async", "privacy", "secagg"
FEATURES = (EDGES, ASYNC, PRIVACY, SECAGG)


@dataclass(frozen=True)
class WeightedSum:
    """A method's declaration that its aggregate is a weighted mean of per-element contributions.

    ``layout``: where a device's returned tensors sit in the global ones -
    ``full``: every tensor whole, under its global name, weighted by the device's samples;
    ``window``: blocks of the global tensors, at ``method.index_map(instruction.context)``
    (``np.ix_``-style indices of the leading axes per tensor);
    ``present``: some global tensors whole, named by
    ``method.global_names(global_weights, instruction)`` (returned name -> global name),
    ``method.classifiers`` rows weighted per class.
    ``server_step``: ``aggregate_train`` applies a step of its own to that mean (FedAvgM's
    server momentum); features that feed the mean back through ``aggregate_train`` as one
    update (async, secure aggregation) serve it, those that replace the aggregate (edges,
    DP / robust) do not.
    ``secure``: secure aggregation serves it (AllSmall: False, it is not in the SecAgg plan).
    """

    layout: str = FULL
    server_step: bool = False
    secure: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"WeightedSum layout must be one of {LAYOUTS}, got {self.layout!r}")

    def serves(self, feature: str) -> bool:
        """Whether ``feature`` (one of ``FEATURES``) can run a method with this declaration."""
        if feature == EDGES:
            return not self.server_step
        if feature == ASYNC:
            return True
        if feature == PRIVACY:
            return self.layout in (FULL, WINDOW) and not self.server_step
        if feature == SECAGG:
            return self.secure
        raise ValueError(f"unknown feature {feature!r}; features: {', '.join(FEATURES)}")


def weighted_sum(method: object) -> WeightedSum | None:
    """``method``'s (an instance or a class) declaration, or None when its aggregate is not a
    weighted sum (nothing declared, or ``aggregate_train`` overridden below the declaration)."""
    cls = method if isinstance(method, type) else type(method)
    if not isinstance(method, type) and "weighted_sum" in vars(method):
        return method.weighted_sum  # the instance's own answer, by its options
    declared = next((c for c in cls.__mro__ if "weighted_sum" in vars(c)), None)
    aggregates = next((c for c in cls.__mro__ if "aggregate_train" in vars(c)), None)
    if declared is None or (aggregates is not None and aggregates is not declared
                            and issubclass(aggregates, declared)):
        return None
    return declared.__dict__["weighted_sum"]


def why_not(method: object, feature: str) -> str | None:
    """Why ``feature`` cannot run ``method`` (an instance or a class): a clause for the
    feature's one-line error; None: it can."""
    declared = weighted_sum(method)
    if declared is not None and declared.serves(feature):
        return None
    cls = method if isinstance(method, type) else type(method)
    if declared is None:
        if method.not_a_sum:
            return method.not_a_sum
        inherited = any(vars(c).get("weighted_sum") is not None for c in cls.__mro__)
        return ("it aggregates by a rule of its own, not by weighted sums" if inherited
                else "its aggregate is not a weighted sum of the devices' updates")
    if declared.server_step:
        return "it applies a server step of its own (e.g. momentum) to the mean, which this replaces"
    if feature == SECAGG:
        return "it is not in the secure-aggregation plan yet"
    return f"its updates are laid out as {declared.layout!r} (this needs 'full' or 'window')"


def accepting(classes: dict[str, type], feature: str) -> list[str]:
    """The ids in ``classes`` (id -> method class) whose declaration ``feature`` serves, sorted."""
    return sorted(name for name, cls in classes.items() if why_not(cls, feature) is None)
