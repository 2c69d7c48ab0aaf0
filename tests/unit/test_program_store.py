"""Exported programs kept on disk: a second server reads them instead of exporting again, a
different spec or exporter gets its own file, and parallel processes export a program once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from export import program_store, programs
from export.program_store import ProgramStore
from export.programs import ProgramCache
from fedcore import modelspec
from fedcore.recipe import Recipe
from server_toolkit.models.zoo import model_spec

SPEC = model_spec("mlp", (1, 8, 8), 10)


def test_a_second_cache_reads_the_onnx_program_the_first_exported(tmp_path, monkeypatch):
    recipe = Recipe(batch_size=8)
    first = ProgramCache(["torchspec/1", "onnx/1"], directory=tmp_path)
    (_, spec_bytes), (_, onnx_bytes) = first.programs(SPEC, recipe)
    stored = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".onnx-1")
    assert len(stored) == 1 and (tmp_path / stored[0]).read_bytes() == onnx_bytes  # torchspec: not stored

    def no_export(spec, recipe, kernels):
        raise AssertionError("exported again")

    monkeypatch.setitem(programs.EXPORTERS, "onnx/1", no_export)
    second = ProgramCache(["onnx/1"], directory=tmp_path)
    assert second.programs(SPEC, recipe) == [("onnx/1", onnx_bytes)]
    assert ProgramCache(["onnx/1"], on_disk=False).store is None


def test_a_fused_cache_keeps_fused_and_portable_pte_programs_apart(tmp_path, monkeypatch):
    """The fallback's portable program is another program; a spec the fused ops do not cover
    (no convolution, BatchNorm, ReLU or max-pool) gets the portable one."""
    made = []

    def export(spec, recipe, kernels):
        made.append(kernels)
        return kernels.encode()

    monkeypatch.setitem(programs.EXPORTERS, "pte/1", export)
    recipe, cnn = Recipe(batch_size=8), model_spec("small_cnn", (1, 8, 8), 10)
    linear = modelspec.make((1, 8, 8), 10, [{"op": "flatten"}, {"op": "linear", "in": 64, "out": 10}])
    cache = ProgramCache(["pte/1"], directory=tmp_path, kernels="fused")
    assert cache.programs(cnn, recipe) == [("pte/1", b"fused")]
    assert cache.programs(cnn, recipe, portable=True) == [("pte/1", b"portable")]
    assert cache.programs(linear, recipe) == [("pte/1", b"portable")]
    again = ProgramCache(["pte/1"], directory=tmp_path, kernels="fused")  # from disk, each under its key
    assert again.programs(cnn, recipe) == [("pte/1", b"fused")]
    assert again.programs(cnn, recipe, portable=True) == [("pte/1", b"portable")]
    assert made == ["fused", "portable", "portable"]


def test_another_spec_batch_or_exporter_version_is_another_file(tmp_path, monkeypatch):
    store = ProgramStore(tmp_path)
    key = "spec:pte/1:{}:16"
    paths = {store.path(key, "pte/1"), store.path("spec2:pte/1:{}:16", "pte/1"),
             store.path("spec:pte/1:{}:32", "pte/1")}
    monkeypatch.setattr(program_store, "exporter_version", lambda: "another exporter")
    paths.add(store.path(key, "pte/1"))
    assert len(paths) == 4


def _export_once(directory: str, log: str) -> None:
    def make() -> bytes:
        with open(log, "a") as handle:
            handle.write("exported\n")
        import time

        time.sleep(0.5)
        return b"program"

    data, _ = ProgramStore(Path(directory)).get_or_make("k", "pte/1", make)
    assert data == b"program"


def test_parallel_processes_export_a_program_once_and_read_it_whole(tmp_path):
    log = tmp_path / "exports.log"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_export_once, args=(str(tmp_path / "store"), str(log)))
               for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert log.read_text().splitlines() == ["exported"]


def test_an_unwritable_directory_still_exports(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    data, stored = ProgramStore(blocker / "programs").get_or_make("k", "pte/1", lambda: b"program")
    assert (data, stored) == (b"program", False)


def test_the_default_directory_follows_fedsdk_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSDK_CACHE_DIR", str(tmp_path))
    assert program_store.default_directory() == tmp_path / "programs"
    monkeypatch.delenv("FEDSDK_CACHE_DIR")
    assert program_store.default_directory() == Path.home() / ".cache" / "fedsdk" / "programs"
