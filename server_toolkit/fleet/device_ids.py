"""Device ids for bulk registration (``fedsdk-server devices add --count/--from-file``)."""

from __future__ import annotations

from pathlib import Path

from sdk_device.protocol.topics import check_name


def numbered_ids(prefix: str, count: int, start: int = 0) -> list[str]:
    """``count`` ids: ``prefix`` + index ``start`` .. ``start + count - 1``, zero-padded to the
    digits of the last index (``swarm-0000`` .. ``swarm-9999``). Raises ValueError (one line)
    when ``count`` < 1 or an id is not a valid device id."""
    if count < 1 or start < 0:
        raise ValueError(f"--count must be >= 1 and --start >= 0, got {count} and {start}")
    width = len(str(start + count - 1))
    ids = [f"{prefix}{i:0{width}d}" for i in range(start, start + count)]
    check_name("device id", ids[0])
    check_name("device id", ids[-1])  # the longest; the prefix is the same in all
    return ids


def read_id_file(path: Path, default_tier: str | None = None) -> list[tuple[str, str | None]]:
    """(device id, tier) per line of ``path``: ``ID`` or ``ID,TIER``; blank lines and lines
    starting with ``#`` are skipped. Raises ValueError naming the file and line of a bad id."""
    entries = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        device_id, _, tier = (part.strip() for part in line.partition(","))
        try:
            check_name("device id", device_id)
            if tier:
                check_name("tier", tier)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        entries.append((device_id, tier or default_tier))
    return entries
