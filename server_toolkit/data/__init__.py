"""Datasets of the server and the simulator: the known datasets and their checksums
(``catalogue``), where their files are (``locate``), reading them (``idx``, ``npz``,
``datasets``), checking (``verify``) and downloading them (``fetch``), and the server's
own slice of a training split (``server_slice``). Nothing here imports torch or ``sim``."""
