"""The personalised family (seed 002, MH-pFedHN / MH-pFedHNGD; pFedHN, Shamsian et al., 2021):
every device gets a model of its own architecture. ``hypernetwork`` is the shared machinery
of the hypernetwork methods (``pfedhn``, ``mh_pfedhn``, ``mh_pfedhngd``), whose network is
``personal_hypernet``; ``personalized`` holds per-device models and tiers for them and for
the baselines ``local`` and ``fedavg_groups``.

Modules are imported directly; this package re-exports nothing.
"""
