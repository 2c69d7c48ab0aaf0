"""Training losses, as a ``loss`` dict: one definition for the torch runtime and every
exported program (``fedcore.losses`` re-exports this module; it imports torch).

==============================================  ==========================================
``{"kind": "ce"}``                              sum over the model's outputs (exits, then
                                                final) of the mean cross-entropy: the
                                                torch runtime's loss.
``{"kind": "kd", "temperature": T,              (1 - alpha) * CE-sum + alpha * T^2 *
"alpha": a}``                                   KL(p_teacher,T || p_student,T) on the final
                                                output (MH-pFedHNGD stage 2).
``{"kind": "recipfl_kt", "features": F}``       RecipFL's strong-device small-model loss:
                                                CE-sum + CE(student, softmax(teacher
                                                logits)) + KL(softmax(teacher features) ||
                                                softmax(student features)).
``{"kind": "depthfl_sd", "temperature": T,      DepthFL's mutual self-distillation between
"alpha": w}``                                   the outputs: CE-sum + w * T^2 / (n - 1) *
                                                sum over ordered pairs i != j of
                                                KL(p_j,T detached || p_i,T); n outputs
                                                (one output: CE-sum). Reads no teacher.
==============================================  ==========================================

Decisions where the papers are silent (METHODS.md sets the weights):

* Every per-sample term is averaged over the real samples of the batch (``sample_mask``
  is 1 for a real sample, 0 for padding of a short last batch).
* KD: the distillation term applies to the final output only; exits keep plain CE. The
  KL direction is KL(teacher || student), torch's ``KLDivLoss(log p_s, p_t)``, the usual
  Hinton form (MH-pFedHN's text writes the arguments the other way round).
* RecipFL KT: "features" are the inputs of the model's last linear layer. The paper
  writes D_KL(p^S || p^L); we use KL(p^L || p^S) like the authors' code and like KD,
  so the student is pulled towards the teacher's distribution. As in the authors' code
  the feature term is dropped when the teacher's feature size differs from the
  student's (``features`` = the teacher's feature size, 0 or absent = no feature term).
* DepthFL SD (Kim et al., ICLR 2023, "mutual self-distillation", after Deep Mutual
  Learning): every output i is a student of every other output j, whose softened
  prediction is a constant (detached: no gradient flows into the teacher side), and the
  KL terms of output i are averaged over its n - 1 teachers. The paper's text gives no
  temperature or weight; defaults T = 1 and w = 1 (the weight ``alpha`` caps at 1 like
  ``kd``'s), the values of the published reproductions. T^2 keeps the gradient scale of
  Hinton's KD at T != 1 (T = 1: no effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .recipe import LOSS_KINDS

KINDS = tuple(LOSS_KINDS)  # the one table is fedcore.recipe.LOSS_KINDS


def cross_entropy_per_sample(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, K) logits, (B,) int64 labels -> (B,) cross-entropy (log-softmax and a one-hot)."""
    classes = torch.arange(logits.shape[1], dtype=labels.dtype)
    one_hot = (labels.reshape(-1, 1) == classes).to(logits.dtype)
    return -(F.log_softmax(logits, dim=1) * one_hot).sum(dim=1)


def soft_cross_entropy_per_sample(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """(B, K) logits against (B, K) target probabilities -> (B,) cross-entropy."""
    return -(F.log_softmax(logits, dim=1) * target_probs).sum(dim=1)


def kl_per_sample(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)) per sample, (B,)."""
    teacher_log_probs = F.log_softmax(teacher_logits, dim=1)
    diff = teacher_log_probs - F.log_softmax(student_logits, dim=1)
    return (teacher_log_probs.exp() * diff).sum(dim=1)


def masked_mean(per_sample: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
    """Mean of a (B,) tensor over the samples whose mask is 1."""
    return (per_sample * sample_mask).sum() / sample_mask.sum()


def mutual_distillation(outputs: tuple[torch.Tensor, ...], sample_mask: torch.Tensor,
                        temperature: float) -> torch.Tensor:
    """DepthFL's self-distillation term over n (B, K) outputs: T^2 / (n - 1) * sum over
    i != j of the masked mean of KL(softmax(o_j / T) detached || softmax(o_i / T)); 0 for n < 2."""
    n, t = len(outputs), temperature
    terms = [masked_mean(kl_per_sample(student / t, teacher.detach() / t), sample_mask)
             for i, student in enumerate(outputs) for j, teacher in enumerate(outputs) if i != j]
    if not terms:
        return outputs[0].new_zeros(())
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total * (t * t / (n - 1))


@dataclass(frozen=True)
class Loss:
    """A validated loss recipe. ``extra_inputs(K, F)`` names the per-sample tensors the
    training step needs besides the labels, with their per-sample shapes."""

    kind: str = "ce"
    temperature: float = 1.0
    alpha: float = 0.0
    teacher_features: int = 0

    @classmethod
    def from_dict(cls, loss: dict) -> Loss:
        kind = loss.get("kind", "ce")
        known = {"ce": {"kind"}, "kd": {"kind", "temperature", "alpha"},
                 "recipfl_kt": {"kind", "features"}, "depthfl_sd": {"kind", "temperature", "alpha"}}
        if kind not in known:
            raise ValueError(f"loss kind {kind!r} is not one of {KINDS}")
        unknown = sorted(set(loss) - known[kind])
        if unknown:
            raise ValueError(f"unknown keys {unknown} for loss {kind!r}")
        if kind in ("kd", "depthfl_sd"):
            t, a = loss.get("temperature", 1.0), loss.get("alpha", 0.5 if kind == "kd" else 1.0)
            if not (isinstance(t, int | float) and math.isfinite(t) and t > 0 and isinstance(a, int | float)
                    and 0 <= a <= 1):
                raise ValueError(f"{kind} needs temperature > 0 and 0 <= alpha <= 1, got {t}, {a}")
            return cls(kind, float(t), float(a))
        if kind == "recipfl_kt":
            f = loss.get("features", 0) or 0
            if not (isinstance(f, int) and f >= 0):
                raise ValueError(f"recipfl_kt features must be an integer >= 0, got {f!r}")
            return cls(kind, teacher_features=f)
        return cls(kind)

    def to_dict(self) -> dict:
        if self.kind in ("kd", "depthfl_sd"):
            return {"kind": self.kind, "temperature": self.temperature, "alpha": self.alpha}
        if self.kind == "recipfl_kt":
            return {"kind": "recipfl_kt", "features": self.teacher_features}
        return {"kind": "ce"}

    def uses_features(self, student_features: int) -> bool:
        return self.kind == "recipfl_kt" and self.teacher_features == student_features > 0

    def extra_inputs(self, num_classes: int, student_features: int) -> list[tuple[str, tuple[int, ...]]]:
        """[(name, per-sample shape)] of the teacher tensors this loss reads, in input order."""
        if self.kind in ("ce", "depthfl_sd"):
            return []
        extras = [("teacher_logits", (num_classes,))]
        if self.uses_features(student_features):
            extras.append(("teacher_features", (student_features,)))
        return extras

    def __call__(self, outputs: tuple[torch.Tensor, ...], features: torch.Tensor, labels: torch.Tensor,
                 sample_mask: torch.Tensor, extras: dict[str, torch.Tensor]) -> torch.Tensor:
        """The scalar training loss. outputs: (B, K) logits, exits first then final;
        features: (B, F) inputs of the last linear layer; labels (B,) int64."""
        ce = masked_mean(cross_entropy_per_sample(outputs[0], labels), sample_mask)
        for out in outputs[1:]:
            ce = ce + masked_mean(cross_entropy_per_sample(out, labels), sample_mask)
        if self.kind == "ce":
            return ce
        if self.kind == "depthfl_sd":
            return ce + mutual_distillation(outputs, sample_mask, self.temperature) * self.alpha
        teacher = extras["teacher_logits"]
        if self.kind == "kd":
            t = self.temperature
            kl = masked_mean(kl_per_sample(outputs[-1] / t, teacher / t), sample_mask)
            return ce * (1.0 - self.alpha) + kl * (self.alpha * t * t)
        soft = masked_mean(soft_cross_entropy_per_sample(outputs[-1], F.softmax(teacher, dim=1)), sample_mask)
        loss = ce + soft
        if "teacher_features" in extras:
            loss = loss + masked_mean(kl_per_sample(features, extras["teacher_features"]), sample_mask)
        return loss
