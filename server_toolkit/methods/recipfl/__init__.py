"""The resource-skew family (seed 003, RecipFL): strong devices train a large model, weak ones
a small one (``strong_weak``). ``recipfl`` generates every device's weights with a graph
hypernetwork (``graph_hypernet`` over the operator graphs of ``op_graph``); ``allsmall``
and ``exclusivefl`` are its baselines. Their per-role accuracy scoring
(``server_toolkit.methods.target_accuracy``) is shared with other families and stays there.

Modules are imported directly; this package re-exports nothing.
"""
