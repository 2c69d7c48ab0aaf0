"""Training losses of exported programs: the same definitions the torch runtime trains with.

The maths lives in ``sdk_device.runtimes.losses`` so a device without ``export`` installed
computes exactly what the exported programs compute; see that module for the loss table.
"""

from sdk_device.runtimes.losses import (
    KINDS,
    Loss,
    cross_entropy_per_sample,
    kl_per_sample,
    masked_mean,
    soft_cross_entropy_per_sample,
)

__all__ = ["KINDS", "Loss", "cross_entropy_per_sample", "kl_per_sample", "masked_mean",
           "soft_cross_entropy_per_sample"]
