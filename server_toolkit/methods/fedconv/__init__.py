"""The FedConv family (seed 001): conv-compressed sub-models (``conv_compress``), their
transposed-conv dilation (``conv_dilate``) and learned aggregation (``learned_aggregate``),
trained on server data by ``train_generated``; the method itself is ``fedconv``. The edge
relay (``relay``: K-means clustering of a group by KL divergence, ``clustering``, and the
cross-cluster projection stage, ``projection``) is what an edge aggregator
(``server_toolkit.edge.aggregator``) runs for its group.

Modules are imported directly (``from server_toolkit.methods.fedconv.fedconv import FedConv``);
this package re-exports nothing.
"""
