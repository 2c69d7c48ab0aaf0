"""Bring your own: a model, a dataset or a method from the user's code (``--model
pkg.module:build`` / ``file.py[:build]``, ``--dataset …:load``, the ``fedsdk.methods``
entry-point group). See docs/byo.md."""
