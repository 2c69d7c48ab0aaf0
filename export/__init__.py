"""Export: a sub-model spec and its loss -> on-device training programs.

Formats (``programs.py`` decides which a task offers, built once per spec, loss and batch):

* ``torchspec/1`` — the model as JSON (``fedcore.modelspec``); the torch runtime executes it.
* ``pte/1`` — an ExecuTorch program (``executorch.py``): forward + loss + backward of
  ``program_model.ProgramModel`` written in ``decompositions`` the portable kernels train
  correctly; the device applies the optimiser (``sdk_device/runtimes/optimizers.py``).
* ``ort-training/1`` — ONNX Runtime training artifacts (``ort_artifacts.py``, ``onnx.py``).
* inference-only ONNX and ``tflite/1`` (``tflite.py``) for devices that only evaluate.

Every training format is checked against torch autograd (``parity.py``: loss, gradients,
BatchNorm statistics and several optimiser steps); that parity is the contract of export.
``manifest.py`` describes a program bundle (tensors, input, recipe, loss, optimiser) for apps.
"""
