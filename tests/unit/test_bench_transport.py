"""Smoke test of bench/transport.py: one small blob, one repeat, against a real mosquitto."""

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from server_toolkit.broker.mosquitto import MosquittoBroker
from tests.bench_module import load_bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "transport.py"

pytestmark = pytest.mark.skipif(
    not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()), reason="needs mosquitto"
)


def _load_bench() -> ModuleType:
    return load_bench("transport")


@pytest.mark.timeout(60)
def test_bench_measures_all_three_transports(tmp_path: Path) -> None:
    bench = _load_bench()
    (tmp_path / "broker").mkdir()
    with MosquittoBroker(workdir=tmp_path / "broker", extra_config=bench.BROKER_CONFIG) as broker:
        [result] = bench.run(broker.address, [0.25], repeats=1, chunk_bytes=64 * 1024, window=4,
                             workdir=tmp_path)
        assert bench.broker_rss_kib(broker.proc.pid) > 0

    for measurement in (result.raw, result.raw_nodelay, result.fedsdk):
        assert measurement.size_bytes == 250_000
        assert measurement.matched  # the bytes received are the bytes sent
        assert len(measurement.seconds) == 1
        assert measurement.mb_per_s > 0
    assert result.ratio > 0 and result.ratio_nodelay > 0
    assert result.label == "0.25MB"
    assert "0.25MB" in bench.format_table([result])


def test_main_rejects_bad_sizes() -> None:
    bench = _load_bench()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--sizes", "one"])
    assert exc.value.code == 2
