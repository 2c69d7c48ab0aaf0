"""fedcore: what the server, the exporters and a device's torch runtime share.

* ``modelspec``: ``torchspec/1``, a model as plain JSON (torch-free);
* ``recipe``: the training recipe a task carries (torch-free);
* ``losses``: the training losses, one definition for the torch runtime and every exported
  program (imports torch);
* ``torch_model``: a ``torch.nn.Module`` built from a spec (imports torch);

``sdk_device`` imports only the torch-free modules at import time; its torch runtime imports
the others when a device actually trains with torch.
"""
