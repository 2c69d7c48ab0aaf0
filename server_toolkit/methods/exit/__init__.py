"""The exit-split family (seed 000, HypeMeFed): multi-exit models cut at an exit per tier.
``depthfl`` is the multi-exit baseline without hypernetwork (averaging per class with
``classwise_average``), ``hypemefed`` adds low-rank hypernetworks (``hypernet_bank`` over
``lrf_hypernet``) that generate the deep layers a device lacks, ``fedavg_exit`` holds
FedAvg-S and FedAvg-L.

Modules are imported directly; this package re-exports nothing.
"""
