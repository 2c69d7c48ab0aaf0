"""Seeded label partitioners that spread a dataset over simulated clients.

Every partitioner takes a 1-D integer ``labels`` array of length N and returns one int64
index array per client (indices into ``labels``, sorted ascending).  Parts are disjoint;
every index is used at most once.  The same seed always gives the same parts.

Schemes: ``"iid"``, ``"dirichlet"`` (Hsu et al. 2019), ``"k-classes"`` and
``"quantity-skew"`` (RecipFL-style strong/weak devices).
"""

from __future__ import annotations

import numpy as np

SCHEMES = ("iid", "dirichlet", "k-classes", "quantity-skew")
_ALIASES = {"kclasses": "k-classes"}
MAX_DIRICHLET_TRIES = 100


class PartitionError(ValueError):
    """A partition was asked for with impossible or invalid parameters."""


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str = "iid",
    *,
    seed: int = 0,
    alpha: float = 0.5,
    min_size: int = 10,
    classes_per_client: int = 2,
    num_strong: int = 1,
    strong_share: float = 0.5,
) -> list[np.ndarray]:
    """Split the indices of ``labels`` (N,) over ``num_clients`` with the named scheme.

    Returns ``num_clients`` int64 index arrays.  ``alpha`` is the Dirichlet concentration
    (for "dirichlet" and for the weak clients of "quantity-skew"); smaller is more skewed.
    """
    labels = _check_labels(labels, num_clients)
    key = scheme.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    rng = np.random.default_rng(seed)
    if key == "iid":
        return iid(labels, num_clients, rng)
    if key == "dirichlet":
        return dirichlet(labels, num_clients, rng, alpha, min_size)
    if key == "k-classes":
        return k_classes(labels, num_clients, rng, classes_per_client)
    if key == "quantity-skew":
        return quantity_skew(labels, num_clients, rng, num_strong, strong_share, alpha)
    raise PartitionError(
        f"unknown partition scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}"
    )


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle all N indices and cut them into ``num_clients`` parts differing by at most one."""
    labels = _check_labels(labels, num_clients)
    order = rng.permutation(len(labels))
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_clients)]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float,
    min_size: int,
) -> list[np.ndarray]:
    """Label-Dirichlet split: each class's indices go to clients in Dir(alpha) proportions.

    Redraws (up to ``MAX_DIRICHLET_TRIES`` times) until every client holds at least
    ``min_size`` samples.  All N indices are used.
    """
    labels = _check_labels(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    if min_size < 0:
        raise PartitionError(f"min_size must be >= 0, got {min_size}")
    n = len(labels)
    if min_size * num_clients > n:
        raise PartitionError(
            f"min_size={min_size} x num_clients={num_clients} = {min_size * num_clients} "
            f"exceeds the {n} samples available"
        )
    classes = np.unique(labels)
    smallest = n
    for _ in range(MAX_DIRICHLET_TRIES):
        chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = np.floor(np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
            for client, piece in enumerate(np.split(idx, cuts)):
                chunks[client].append(piece)
        parts = [np.sort(np.concatenate(c)).astype(np.int64) for c in chunks]
        sizes = [len(p) for p in parts]
        if min(sizes) >= min_size:
            return parts
        smallest = min(smallest, min(sizes))
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) draw gave every one of {num_clients} clients "
        f">= {min_size} samples in {MAX_DIRICHLET_TRIES} tries (best smallest client: "
        f"{smallest}); raise alpha, lower min_size or use fewer clients"
    )


def k_classes(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int,
) -> list[np.ndarray]:
    """Give each client ``classes_per_client`` distinct classes, dealt round-robin.

    Classes are shuffled, then client i takes slots i*k .. i*k+k-1 of that list (wrapping),
    so all classes are used when num_clients * k >= num_classes.  Each class's samples are
    split evenly among the clients holding it; a class nobody holds is left out.
    """
    labels = _check_labels(labels, num_clients)
    classes = rng.permutation(np.unique(labels))
    k = classes_per_client
    if not 1 <= k <= len(classes):
        raise PartitionError(
            f"classes_per_client must be in [1, {len(classes)}] (classes present), got {k}"
        )
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for client in range(num_clients):
        for j in range(k):
            holders[int(classes[(client * k + j) % len(classes)])].append(client)

    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        owners = holders[int(c)]
        if not owners:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for owner, piece in zip(owners, np.array_split(idx, len(owners)), strict=True):
            chunks[owner].append(piece)
    return [np.sort(np.concatenate(c)).astype(np.int64) for c in chunks]


def quantity_skew(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_strong: int,
    strong_share: float,
    alpha: float,
) -> list[np.ndarray]:
    """Strong/weak quantity skew (RecipFL): clients 0..num_strong-1 are the strong devices.

    The strong devices together get round(strong_share * N) IID samples, split equally.
    The weak devices split the rest equally in count; each weak device's label mix is drawn
    from Dir(alpha) and filled from the remaining pool class by class, topping up from the
    classes it favours next when a class runs out.  All N indices are used.
    """
    labels = _check_labels(labels, num_clients)
    if not 0 < num_strong < num_clients:
        raise PartitionError(
            f"num_strong must be in [1, num_clients-1] = [1, {num_clients - 1}], got {num_strong}"
        )
    if not 0.0 < strong_share < 1.0:
        raise PartitionError(f"strong_share must be in (0, 1), got {strong_share}")
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    n = len(labels)
    num_weak = num_clients - num_strong
    n_strong = int(round(strong_share * n))
    if n_strong < num_strong or n - n_strong < num_weak:
        raise PartitionError(
            f"{n} samples with strong_share={strong_share} leave {n_strong} for {num_strong} "
            f"strong and {n - n_strong} for {num_weak} weak clients; each needs at least one"
        )

    order = rng.permutation(n)
    parts = [np.sort(p).astype(np.int64) for p in np.array_split(order[:n_strong], num_strong)]

    rest = order[n_strong:]
    classes = np.unique(labels)
    pools = [rest[labels[rest] == c] for c in classes]  # already shuffled by `order`
    taken = np.zeros(len(classes), dtype=np.int64)
    for size in (len(p) for p in np.array_split(rest, num_weak)):
        shares = rng.dirichlet(np.full(len(classes), alpha))
        want = rng.multinomial(size, shares)
        picked: list[np.ndarray] = []
        need = size
        # First the drawn counts (capped by what is left), then top up by preference order.
        for ci in range(len(classes)):
            take = min(int(want[ci]), len(pools[ci]) - int(taken[ci]))
            picked.append(pools[ci][taken[ci]:taken[ci] + take])
            taken[ci] += take
            need -= take
        for ci in np.argsort(-shares, kind="stable"):
            if need == 0:
                break
            take = min(need, len(pools[ci]) - int(taken[ci]))
            picked.append(pools[ci][taken[ci]:taken[ci] + take])
            taken[ci] += take
            need -= take
        parts.append(np.sort(np.concatenate(picked)).astype(np.int64))
    return parts


def label_histogram(
    labels: np.ndarray, parts: list[np.ndarray], num_classes: int
) -> np.ndarray:
    """Per-client label counts, int64 shape (num_clients, num_classes)."""
    labels = np.asarray(labels)
    hist = np.zeros((len(parts), num_classes), dtype=np.int64)
    for client, part in enumerate(parts):
        client_labels = labels[np.asarray(part, dtype=np.int64)]
        if client_labels.size and (client_labels.min() < 0 or client_labels.max() >= num_classes):
            raise PartitionError(f"client {client} has labels outside [0, {num_classes})")
        hist[client] = np.bincount(client_labels, minlength=num_classes)
    return hist


def _check_labels(labels: np.ndarray, num_clients: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(
            f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}"
        )
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(f"num_clients={num_clients} exceeds the {len(labels)} samples")
    return labels
