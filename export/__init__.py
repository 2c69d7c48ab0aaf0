"""Export: torch sub-model + loss recipe -> on-device training programs.

Today the only program format is ``torchspec/1`` (the model as JSON, see
``fedcore.modelspec``), which the torch runtime executes. ExecuTorch ``.pte``
and ONNX Runtime training artifacts, each checked for gradient parity with torch, are the
export issue's work.
"""
