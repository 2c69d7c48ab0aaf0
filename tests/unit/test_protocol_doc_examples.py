"""The examples of docs/protocol.md are what the code accepts: every ```json block parses; every
control message in one decodes with the reference decoder (and re-encodes to the same object, so
an example shows every field and no ignored key); every config record parses as a device parses
it; the §12.5 spec and the §6.4 chunk frame are what the reference produces."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from fedcore import modelspec
from sdk_device.outputs import OUTPUTS, check_reports
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_chunk
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import parse_plan

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
CONTROL_TYPES = {"hello", "task", "blob_request", "heartbeat", "result", "ack", "error"}


def _blocks(lang: str) -> list[tuple[int, str]]:
    text = DOC.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == lang]


def _json_examples() -> list[tuple[int, object]]:
    return [(line, json.loads(body)) for line, body in _blocks("json")]


def _messages() -> list[tuple[int, dict]]:
    return [(line, obj) for line, obj in _json_examples()
            if isinstance(obj, dict) and "schema" in obj and "type" in obj]


def _configs() -> list[tuple[int, dict]]:
    return [(line, obj) for line, obj in _json_examples()
            if isinstance(obj, dict) and "type" not in obj and isinstance(obj.get("steps"), list)]


def _check_config(config: dict, models: set[str]) -> None:
    plan = parse_plan(config, models, set(OUTPUTS), bundles="members" in config)  # §22: an edge's
    check_reports(plan.reports, models)


def test_every_json_block_is_json():
    blocks = _blocks("json")
    assert len(blocks) >= 20, "the document lost its examples"
    for line, body in blocks:
        try:
            json.loads(body)
        except ValueError as exc:  # placeholders belong in ```text blocks
            pytest.fail(f"docs/protocol.md line {line}: the json block is not JSON: {exc}")


def test_every_control_message_example_decodes():
    examples = _messages()
    assert CONTROL_TYPES <= {obj["type"] for _, obj in examples}, "an example of every message type"
    for line, obj in examples:
        payload = json.dumps(obj).encode()
        if obj["schema"] != msgs.SCHEMA_VERSION:  # an example of what v2 refuses
            with pytest.raises(ProtocolError) as info:
                msgs.decode(payload)
            assert info.value.code == "unsupported_schema", line
            continue
        try:
            message = msgs.decode(payload)
        except ProtocolError as exc:
            pytest.fail(f"docs/protocol.md line {line}: {obj['type']} does not decode: {exc}")
        again = json.loads(msgs.encode(message))
        assert again == obj, f"line {line}: the example has ignored keys or lacks fields"


def test_task_examples_carry_configs_a_device_accepts():
    tasks = [(line, obj) for line, obj in _messages() if obj["type"] == "task"]
    assert len(tasks) >= 2 and any(len(obj["programs"]) == 2 for _, obj in tasks)
    for line, obj in tasks:
        task = msgs.decode(json.dumps(obj).encode())
        try:
            _check_config(task.config, set(task.programs))
        except ProtocolError as exc:
            pytest.fail(f"docs/protocol.md line {line}: the task's config is refused: {exc}")


def test_config_examples_parse():
    configs = _configs()
    assert len(configs) >= 2
    for line, config in configs:
        named = (step.get(key) for step in config["steps"] for key in ("train", "teacher"))
        names = {"model", *config.get("return", []), *(name for name in named if name)}
        try:
            _check_config(config, names)
        except ProtocolError as exc:
            pytest.fail(f"docs/protocol.md line {line}: config refused: {exc}")


def test_worked_example_result_answers_its_task():
    """§5.6: the result names exactly the returned models, the label counts asked for, and
    records no larger than the server's limit."""
    tasks = {obj["task_id"]: obj for _, obj in _messages()
             if obj["type"] == "task" and len(obj["programs"]) == 2}
    results = [obj for _, obj in _messages() if obj["type"] == "result" and obj["task_id"] in tasks]
    assert results
    for result in results:
        task = tasks[result["task_id"]]
        config = task["config"]
        assert set(result["arrays"]) == set(config["return"])
        assert ("label_counts" in result["metrics"]) == ("label_counts" in config["report"])
        assert type(result["metrics"]["samples"]) is int and result["metrics"]["samples"] > 0
        for name, ref in result["arrays"].items():
            assert ref["size"] <= int(task["arrays"][name]["size"] * 2.0) + 65536


def test_spec_example_is_the_program_the_tasks_name():
    specs = [body.strip() for _, body in _blocks("json")
             if body.lstrip().startswith('{"format":"torchspec/1"')]
    assert len(specs) == 1
    data = specs[0].encode()
    modelspec.loads(data)  # valid
    assert modelspec.dumps(json.loads(data)) == data, "the §12.5 spec is canonical"
    program_ids = {ref["id"] for _, obj in _messages() if obj["type"] == "task"
                   for ref in obj["programs"]["model"]}
    assert program_ids == {hashlib.sha256(data).hexdigest()}
    assert f"These {len(data)} bytes" in DOC.read_text(encoding="utf-8")


def test_chunk_frame_example_is_what_the_encoder_writes():
    blob = b"fedsdk wire protocol v2 example blob"
    blob_id = hashlib.sha256(blob).hexdigest()
    frame = encode_chunk(blob_id, 2, len(blob), 16, blob[32:])
    header = frame[8:-4]
    headers = [body.strip() for _, body in _blocks("json") if body.lstrip().startswith('{"blob":')]
    assert headers == [header.decode()]
    text = DOC.read_text(encoding="utf-8")
    assert f"({len(frame)} bytes in total)" in text and f"header length {len(header)}" in text


def _interface(fmt: str) -> dict:
    blocks = [obj for _, obj in _json_examples()
              if isinstance(obj, dict) and obj.get("program_interface") == fmt]
    assert len(blocks) == 1, f"one machine-readable block for {fmt}"
    return blocks[0]


def test_pte_metadata_example_is_what_the_exporter_writes():
    """§23.2's metadata is the exporter's for the §23.9 model; its keys are §23.9's list."""
    from export.executorch import program_metadata
    from export.program_model import ProgramModel
    from fedcore.losses import Loss

    examples = [obj for _, obj in _json_examples() if isinstance(obj, dict) and obj.get("format") == "pte/1"]
    assert len(examples) == 1
    example = examples[0]
    spec = modelspec.make((1, 8, 8), 10, [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 4},
        {"op": "relu"}, {"op": "maxpool2d", "k": 2}, {"op": "flatten"},
        {"op": "linear", "in": 64, "out": 10}])
    loss, batch = Loss.from_dict(example["loss"]), example["max_batch"]
    written = program_metadata(spec, loss, batch, ProgramModel(spec))
    from_export = {"backend", "gradient_order", "parameter_output_order"}  # added once the program exists
    assert {k: v for k, v in example.items() if k not in from_export} == written
    assert set(example) == set(written) | from_export == set(_interface("pte/1")["metadata_keys"])
    params = [name for name, _ in written["params"]]
    assert sorted(example["gradient_order"]) == sorted(example["parameter_output_order"]) == sorted(params)


def test_ort_interface_names_the_program_files():
    from sdk_device.runtimes import ort_program

    assert set(_interface("ort-training/1")["entries"]) == {"index.json", *ort_program.FILES.values()}
