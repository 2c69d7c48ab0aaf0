"""One function per conformance check (docs/protocol.md). Each takes the ``Context`` and
raises ``CheckFailed`` with a one-line reason; returning means the device passed.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from sdk_device.protocol.blobs import decode_tensors

from .peer import ServerPeer, message
from .tasks import TaskFactory


class CheckFailed(Exception):
    """The device did not do what the protocol says."""


@dataclass
class Context:
    peer: ServerPeer
    tasks: TaskFactory
    result_timeout_s: float = 60.0
    notes: dict = field(default_factory=dict)


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise CheckFailed(reason)


def _is(kind: str, **match):
    return lambda b: b.get("type") == kind and all(b.get(k) == v for k, v in match.items())


def _expect_error(ctx: Context, code: str, ref, timeout_s: float = 10.0) -> None:
    got = ctx.peer.wait_for(_is("error", ref=ref), timeout_s)
    _require(got is not None, f"no error {code!r} with ref {ref!r} within {timeout_s:.0f} s")
    _require(
        got.body.get("code") == code,
        f"expected error {code!r}, got {got.body.get('code')!r}: {got.body.get('detail')}",
    )


def _run_task(ctx: Context, task: dict, answer: bool = True) -> dict:
    """Send ``task``, wait for its result, pull and check every record; ack it if ``answer``."""
    ctx.peer.send(task)
    got = ctx.peer.wait_for(
        lambda b: (
            b.get("type") in ("result", "error") and task["task_id"] in (b.get("task_id"), b.get("ref"))
        ),
        ctx.result_timeout_s,
    )
    _require(got is not None, f"no result for task {task['task_id'][:8]} within {ctx.result_timeout_s:.0f} s")
    result = got.body
    _require(
        result["type"] == "result",
        f"the device refused a valid task: {result.get('code')}: {result.get('detail')}",
    )
    _require(result.get("round") == task["round"], "result.round differs from the task's round")
    _require(
        set(result.get("arrays", {})) == {"model"},
        f"result.arrays must be exactly ['model'], got {list(result.get('arrays', {}))}",
    )
    samples = result.get("metrics", {}).get("samples")
    _require(
        type(samples) is int and samples > 0, f"metrics.samples must be a JSON integer > 0, got {samples!r}"
    )
    trained = decode_tensors(ctx.peer.pull(result["arrays"]["model"]))
    sent = ctx.tasks.sent[task["task_id"]]
    _require(set(trained) == set(sent), "the result's tensor names differ from the task's")
    for name, value in sent.items():
        _require(
            trained[name].shape == value.shape and trained[name].dtype == value.dtype,
            f"{name}: shape/dtype changed",
        )
        _require(bool(np.isfinite(trained[name]).all()), f"{name}: not finite")
    _require(any(not np.array_equal(trained[k], sent[k]) for k in sent), "training changed no weight")
    if answer:
        ctx.peer.send(message("ack", ref=task["task_id"], detail="persisted"))
    return result


def check_hello(ctx: Context) -> None:
    """§9.1: the start hello names this device; §3.1: a new live epoch brings a second hello."""
    hello = ctx.peer.wait_for(_is("hello"), 30)
    _require(hello is not None, "no hello within 30 s of start")
    body = hello.body
    _require(
        body.get("schema") == 2 and body.get("device_id") == ctx.peer.device,
        f"bad hello: {json.dumps(body)[:200]}",
    )
    _require(
        isinstance(body.get("runtimes"), list) and type(body.get("num_samples")) is int,
        "hello lacks runtimes/num_samples",
    )
    ctx.peer.new_epoch(window_s=0.0)
    _require(
        ctx.peer.wait_for(_is("hello"), 10) is not None, "no hello within 10 s of a new server epoch (§3.1)"
    )


def check_status_request(ctx: Context) -> None:
    """§3.2: after its start hello the device asks for the server's status; an answer naming
    a new epoch (a server restarted while the device was away) brings a hello."""
    asked = ctx.peer.wait_for(_is("status_request"), 30)
    _require(asked is not None, "no status_request after the start hello (§3.2)")
    epoch = uuid.uuid4().hex
    ctx.peer.send(message("server_status", epoch=epoch, started_at=time.time(), announce_window_s=0.0))
    _require(ctx.peer.wait_for(_is("hello"), 10) is not None,
             "no hello within 10 s of a server_status naming a new epoch (§3.2)")


def check_task_round_trip(ctx: Context) -> None:
    """§8: pull, train, offer, result; a training heartbeat at progress 1.0 with QoS 0 (§9.4)."""
    task = ctx.tasks.task(ctx.peer)
    result = _run_task(ctx, task)
    beat = ctx.peer.wait_for(_is("heartbeat", task_id=task["task_id"]), 5)
    _require(beat is not None, "no training heartbeat for the task")
    _require(beat.qos == 0, f"heartbeats must be published with QoS 0, got QoS {beat.qos}")
    ctx.notes["acked"] = result


def check_offers_withdrawn_after_ack(ctx: Context) -> None:
    """§7.1: after the ack the result blob is withdrawn (not_offered); a repeated ack is not answered."""
    result = ctx.notes.get("acked")
    _require(result is not None, "needs the task round trip")
    ref = result["arrays"]["model"]["id"]
    since = time.monotonic()
    ctx.peer.send(message("ack", ref=result["task_id"], detail="persisted"))
    time.sleep(1.0)  # the answer is handled in turn with other work (§9.1), not at once
    ctx.peer.send(message("blob_request", blob=ref, indices=[0], chunk_bytes=65536))
    _expect_error(ctx, "not_offered", ref)
    _require(
        ctx.peer.wait_for(_is("error", ref=result["task_id"]), 1.5, since) is None,
        "the device answered a duplicate ack",
    )


def _with_fault(ctx: Context, fault) -> None:
    weights = ctx.tasks.fresh_weights()
    task = ctx.tasks.task(ctx.peer, weights=weights)
    blob = task["arrays"]["model"]["id"]
    ctx.peer.faults[blob] = fault
    _run_task(ctx, task)
    _require(ctx.peer.served.get((blob, 0), 0) >= 2, "the damaged chunk was never requested again")


def check_chunk_loss(ctx: Context) -> None:
    """§7.3: a lost chunk frame is requested again after the idle timeout."""
    _with_fault(ctx, lambda blob, index, times, frame: [] if times == 0 else [frame])


def check_corrupt_chunk(ctx: Context) -> None:
    """§7.3 step 5: a chunk whose bytes differ from its declared sha256 is fetched again."""

    def corrupt(blob, index, times, frame):
        return [frame[:-1] + bytes([frame[-1] ^ 0xFF])] if times == 0 else [frame]

    _with_fault(ctx, corrupt)


def check_wrong_sizes(ctx: Context) -> None:
    """§6.3: frames with a wrong data length or a size that is not the blob's are dropped."""

    def wrong(blob, index, times, frame):
        if times:
            return [frame]
        head_len = int.from_bytes(frame[4:8], "big")
        header = json.loads(frame[8 : 8 + head_len])
        header["size"] += 1
        bad_header = json.dumps(header).encode()
        return [
            frame[:-1],
            frame[:4] + len(bad_header).to_bytes(4, "big") + bad_header + frame[8 + head_len :],
        ]

    _with_fault(ctx, wrong)


def check_envelope_errors(ctx: Context) -> None:
    """§5.2: invalid control messages are answered with the envelope code and ref null. The rate
    limit of §5.2 lets a receiver leave a second invalid message with the same code within a
    minute unanswered: a repeated code's answer is optional, but if it comes it has that code."""
    answered: set[str] = set()
    cases = [
        (b"{not json", "malformed"),
        (json.dumps({**message("ack", ref="x"), "schema": 1}).encode(), "unsupported_schema"),
        (json.dumps(message("no_such_type")).encode(), "unknown_type"),
        (json.dumps(message("task", task_id="t", round=1)).encode(), "invalid_field"),
        (json.dumps({**message("ack", ref="x"), "msg_id": 5}).encode(), "invalid_field"),
        (json.dumps({**message("ack", ref="x"), "pad": "x" * 70000}).encode(), "too_large"),
    ]
    for payload, code in cases:
        ctx.peer.send_raw(payload)
        if code not in answered:
            _expect_error(ctx, code, None)
            answered.add(code)
            continue
        got = ctx.peer.wait_for(_is("error", ref=None), 1.5)
        _require(got is None or got.body.get("code") == code,
                 f"expected error {code!r} or none (rate limit), got {got and got.body.get('code')!r}")
    since = time.monotonic()
    ctx.peer.send(message("error", code="invalid_field", detail="a valid error", ref=None))
    _require(ctx.peer.wait_for(_is("error"), 1.5, since) is None, "the device answered a valid error")


def check_refusals(ctx: Context) -> None:
    """§9.3: deadline_passed, invalid_field, unsupported_task and bad_task, each with ref = task id."""
    cases = [
        (ctx.tasks.task(ctx.peer, deadline_s=-10), "deadline_passed"),
        (ctx.tasks.task(ctx.peer, config={"steps": [{"train": "model"}], "bogus": 1}), "invalid_field"),
        (
            ctx.tasks.task(ctx.peer, config={"steps": [{"train": "model", "recipe": {"epochs": 0}}]}),
            "invalid_field",
        ),
        (
            ctx.tasks.task(
                ctx.peer, config={"steps": [{"train": "model"}], "report": {"no_such_output": {}}}
            ),
            "unsupported_task",
        ),
        (ctx.tasks.task(ctx.peer, formats=["x-unknown/1"]), "unsupported_task"),
    ]
    unpullable = ctx.tasks.task(ctx.peer)
    ctx.peer.refuse.add(unpullable["arrays"]["model"]["id"])
    cases.append((unpullable, "bad_task"))
    for task, code in cases:
        ctx.peer.send(task)
        _expect_error(ctx, code, task["task_id"], timeout_s=30)


def check_clock_rule(ctx: Context) -> None:
    """§9.6: the deadline is a duration from the task's server_time, whatever the device's clock.
    A server clock an hour behind: 120 s left, the task is trained (a device comparing the
    deadline with its own clock refuses it); an hour ahead with the deadline 5 s before its
    server_time: deadline_passed (a device comparing with its own clock trains it)."""
    _run_task(ctx, ctx.tasks.task(ctx.peer, deadline_s=120, server_clock_s=-3600))
    late = ctx.tasks.task(ctx.peer, deadline_s=-5, server_clock_s=3600)
    ctx.peer.send(late)
    _expect_error(ctx, "deadline_passed", late["task_id"], timeout_s=30)


def check_blob_serving_refusals(ctx: Context) -> None:
    """§7.2: a holder refuses unknown blobs (not_offered) and bad indices (invalid_field)."""
    task = ctx.tasks.task(ctx.peer)
    result = _run_task(ctx, task, answer=False)
    ref = result["arrays"]["model"]
    ctx.peer.send(message("blob_request", blob="0" * 64, indices=[0], chunk_bytes=1024))
    _expect_error(ctx, "not_offered", "0" * 64)
    ctx.peer.send(message("blob_request", blob=ref["id"], indices=[10**6], chunk_bytes=1024))
    _expect_error(ctx, "invalid_field", ref["id"])
    ctx.notes["unanswered"] = (task, result)


def check_result_reoffer(ctx: Context) -> None:
    """§9.5: an unanswered result is sent again when the server's status turns online live;
    an error with ref = the task id ends it (its blobs are withdrawn)."""
    task, result = ctx.notes.get("unanswered", (None, None))
    _require(result is not None, "needs the blob serving check")
    ctx.peer.status("online")
    again = ctx.peer.wait_for(_is("result", task_id=task["task_id"]), 10)
    _require(again is not None, "the unanswered result was not sent again after a live 'online'")
    _require(again.body["arrays"] == result["arrays"], "the re-offered result names other blobs")
    ctx.peer.send(message("error", code="round_closed", detail="round 1 is over", ref=task["task_id"]))
    time.sleep(0.5)
    ref = result["arrays"]["model"]["id"]
    ctx.peer.send(message("blob_request", blob=ref, indices=[0], chunk_bytes=1024))
    _expect_error(ctx, "not_offered", ref)


def check_duplicate_task(ctx: Context) -> None:
    """§17: a task delivered twice is answered; the device keeps working (a later task succeeds)."""
    task = ctx.tasks.task(ctx.peer)
    ctx.peer.send(task)
    _run_task(ctx, task)
    ctx.peer.send(message("ack", ref=task["task_id"], detail="persisted"))
    _run_task(ctx, ctx.tasks.task(ctx.peer))


CHECKS = [
    check_hello,
    check_status_request,
    check_task_round_trip,
    check_offers_withdrawn_after_ack,
    check_envelope_errors,
    check_refusals,
    check_clock_rule,
    check_chunk_loss,
    check_corrupt_chunk,
    check_wrong_sizes,
    check_blob_serving_refusals,
    check_result_reoffer,
    check_duplicate_task,
]
