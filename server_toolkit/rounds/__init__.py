"""Rounds: the one round loop (``loop.py``) and the grids it runs over (``grid.py``: MQTT or
in-process), with the task records and checkpoints a restarted server resumes from."""
