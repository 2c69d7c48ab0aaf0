"""A device client written only from docs/protocol.md (used by ``test_doc_client.py``).

``DocClient`` uses nothing of this repository: paho-mqtt, json, hashlib, struct, numpy and
safetensors, and the document (section numbers in the comments). It says hello, takes tasks,
parses their config records, pulls programs and array records in windowed chunk requests,
checks the tensor names against each model's torchspec/1 program (§13.2), "trains" (every
step shrinks its model's float tensors by 2 %), offers its result records, serves the
server's chunk requests, sends ``result`` and waits for the answer.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
import uuid

import numpy as np
import paho.mqtt.client as mqtt
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from .doc_client_formats import (
    MAX_CHUNK,
    NAME,
    SCHEMA,
    TYPES,
    Refusal,
    _no_constant,
    frame,
    parse_frame,
    spec_tensors,
)


class DocClient:
    """A device of fleet ``fleet`` (§3, §4, §9), written from docs/protocol.md."""

    def __init__(self, host: str, port: int, fleet: str, device_id: str, num_samples: int = 120,
                 chunk_bytes: int = 1024) -> None:
        self.fleet, self.device_id, self.num_samples = fleet, device_id, num_samples
        self.chunk_bytes = chunk_bytes
        self.labels = np.arange(num_samples) % 10  # stands in for the local data's labels
        base = f"fedsdk/v1/{fleet}"  # §3: the topic layout is still v1 in protocol v2 (§16)
        dev = f"{base}/dev/{device_id}"
        self.t_up, self.t_down, self.t_status = f"{dev}/up", f"{dev}/down", f"{dev}/status"
        self.t_up_chunk, self.t_down_chunk = f"{dev}/up/chunk", f"{dev}/down/chunk"
        self.t_server = f"{base}/server/status"
        self.inbox: queue.Queue = queue.Queue()  # control messages and statuses, for the worker
        self.received: list[dict] = []  # every valid control message, in order
        self.frames: dict[str, queue.Queue] = {}  # blob id -> frames / holder errors of a pull
        self.serve_queue: queue.Queue = queue.Queue()
        self.offered: dict[str, bytes] = {}  # §7.1: what the server may pull
        self.awaited: str | None = None
        self.answers: dict[str, dict] = {}  # task id -> the ack or error that ended it
        self.misbehave: dict[int, str] = {}  # round -> what to do wrong (for the tests)
        self.stopping = threading.Event()
        self.subscribed = threading.Event()
        self.lock = threading.Lock()
        # §4: MQTT 3.1.1, persistent session, stable client id, will = "offline" retained
        self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"fedsdk-dev-{fleet}-{device_id}",
                                clean_session=False, protocol=mqtt.MQTTv311)
        self.mqtt.will_set(self.t_status, b"offline", qos=1, retain=True)
        self.mqtt.on_connect = self._on_connect
        self.mqtt.on_message = self._on_message
        self.mqtt.on_subscribe = lambda *args: self.subscribed.set()
        self.mqtt.reconnect_delay_set(1, 30)
        self.host, self.port = host, port

    # -- sending ------------------------------------------------------------------------------
    def send(self, type_: str, **fields) -> dict:
        """A control message (§5.1): compact JSON, no NaN, ≤ 64 KiB."""
        body = {"schema": SCHEMA, "type": type_, "msg_id": uuid.uuid4().hex, "sent_at": time.time(),
                **fields}
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        assert len(data) <= 65536
        self.mqtt.publish(self.t_up, data, qos=1)
        return body

    def send_raw(self, payload: bytes) -> None:
        self.mqtt.publish(self.t_up, payload, qos=1)

    def hello(self) -> None:
        self.send("hello", device_id=self.device_id, runtimes=["numpy"], num_samples=self.num_samples,
                  profile={"client": "docs/protocol.md"})

    # -- MQTT callbacks: parse and enqueue only (§4 "Callbacks") ------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        client.subscribe([(self.t_down, 1), (self.t_down_chunk, 1), (self.t_server, 1)])  # §3
        client.publish(self.t_status, b"online", qos=1, retain=True)

    def _on_message(self, client, userdata, msg) -> None:
        if msg.topic == self.t_down_chunk:
            f = parse_frame(msg.payload)
            with self.lock:
                waiting = self.frames.get(f["blob"]) if f else None
            if waiting is not None:  # frames of blobs not being pulled are dropped (§7.3)
                waiting.put(f)
            return
        if msg.topic == self.t_server:
            self.inbox.put(("status", msg.payload.decode("utf-8", "replace")))
            return
        if msg.topic != self.t_down:
            return
        message, code = self._validate(msg.payload)
        if message is None:
            return self._answer_invalid(msg.payload, code)
        self.received.append(message)
        if message["type"] == "blob_request":
            self.serve_queue.put(message)
            return
        if message["type"] == "error" and message.get("ref"):
            with self.lock:
                waiting = self.frames.get(message["ref"])
            if waiting is not None:  # §7.3 step 5: the holder refused a blob we pull
                waiting.put(message)
        self.inbox.put(("message", message))

    def _validate(self, payload: bytes) -> tuple[dict | None, str]:
        """§5.2, steps 1–4 (this client reads the fields it needs and trusts their types)."""
        if len(payload) > 65536:
            return None, "too_large"
        try:
            obj = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError):
            return None, "malformed"
        if not isinstance(obj, dict):
            return None, "malformed"
        if type(obj.get("schema")) is not int or obj["schema"] != SCHEMA:
            return None, "unsupported_schema"
        if obj.get("type") not in TYPES:
            return None, "unknown_type"
        return obj, ""

    def _answer_invalid(self, payload: bytes, code: str) -> None:
        try:
            if json.loads(payload).get("type") == "error":  # §16: never answer an error
                return
        except (ValueError, AttributeError, UnicodeDecodeError):
            pass
        self.send("error", code=code, detail="rejected by the doc client", ref=None)

    # -- serving blobs (§7.2), on its own thread ------------------------------------------------
    def _serve_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                req = self.serve_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            blob_id, cb = req["blob"], req["chunk_bytes"]
            data = self.offered.get(blob_id)
            if data is None:
                self.send("error", code="not_offered", detail=f"blob {blob_id[:12]} not offered", ref=blob_id)
                continue
            if not 1 <= cb <= MAX_CHUNK:
                self.send("error", code="invalid_field", detail="chunk_bytes out of range", ref=blob_id)
                continue
            count = max(1, -(-len(data) // cb))
            for index in req["indices"]:
                if not 0 <= index < count:
                    self.send("error", code="invalid_field", detail=f"no chunk {index}", ref=blob_id)
                    break
                chunk = data[index * cb:(index + 1) * cb]
                self.mqtt.publish(self.t_up_chunk, frame(blob_id, index, len(data), cb, chunk), qos=1)

    # -- pulling blobs (§7.3) -------------------------------------------------------------------
    def pull(self, ref: dict, total_s: float = 120.0, idle_s: float = 5.0, window: int = 16) -> bytes:
        size, cb = ref["size"], self.chunk_bytes
        count = max(1, -(-size // cb))
        arrivals: queue.Queue = queue.Queue()
        with self.lock:
            self.frames[ref["id"]] = arrivals
        buf = bytearray(size)
        missing, outstanding = list(range(count)), set()
        deadline, idle = time.monotonic() + total_s, 0
        try:
            while missing or outstanding:
                if missing and len(outstanding) <= window // 2:
                    batch, missing = missing[:window - len(outstanding)], missing[window - len(outstanding):]
                    outstanding.update(batch)
                    self.send("blob_request", blob=ref["id"], indices=batch, chunk_bytes=cb)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"blob {ref['id'][:12]}")
                try:
                    item = arrivals.get(timeout=min(idle_s, left))
                except queue.Empty:
                    idle += 1
                    if idle >= 5:
                        raise TimeoutError(f"blob {ref['id'][:12]}: no frame") from None
                    missing = sorted(outstanding) + missing
                    outstanding.clear()
                    continue
                if item.get("type") == "error":
                    raise Refusal(item["code"], item["detail"])
                idle = 0
                if item["index"] not in outstanding or item["size"] != size or item["chunk_bytes"] != cb:
                    continue
                outstanding.discard(item["index"])
                buf[item["index"] * cb:item["index"] * cb + len(item["data"])] = item["data"]
        finally:
            with self.lock:
                self.frames.pop(ref["id"], None)
        data = bytes(buf)
        if hashlib.sha256(data).hexdigest() != ref["id"]:  # MUST NOT use it (§7.3 step 5)
            raise Refusal("bad_task", f"blob {ref['id'][:12]} fails its sha256")
        return data

    # -- running a task (§9.2) -------------------------------------------------------------------
    def run_task(self, task: dict) -> None:
        if task["deadline"] < time.time():
            raise Refusal("deadline_passed", "the task arrived after its deadline")
        models = set(task["programs"])
        steps, returns = self.parse_config(task["config"], models)
        if self.misbehave.get(task["round"]) == "refuse":
            raise Refusal("unsupported_task", "this doc client refuses this round on purpose")
        tensors = {}
        for name in sorted(models):
            program = next((p for p in task["programs"][name] if p["format"] == "torchspec/1"), None)
            if program is None:
                raise Refusal("unsupported_task", f"no torchspec/1 program for {name}")
            try:
                spec = json.loads(self.pull(program))
                arrays = st_load(self.pull(task["arrays"][name]))
            except (TimeoutError, ValueError, Refusal) as exc:  # §9.2 step 4: any pull or load failure
                raise Refusal("bad_task", f"could not load the task: {exc}") from None
            expected = spec_tensors(spec)  # §13.3: a subset of the program's tensors, right shapes
            if any(k not in expected or tuple(v.shape) != expected[k] for k, v in arrays.items()):
                raise Refusal("bad_task", f"the tensors of {name} do not fit its program")
            tensors[name] = arrays
        for step in steps:  # "training": every float tensor shrinks by 2 % (§14 is not needed here)
            tensors[step] = {k: (v * np.float32(0.98)).astype(v.dtype) if v.dtype.kind == "f" else v
                             for k, v in tensors[step].items()}
            self.send("heartbeat", state="training", task_id=task["task_id"], progress=1.0)
        records = {name: st_save(tensors[name]) for name in returns}  # exactly the names received
        wrong = self.misbehave.get(task["round"])
        if wrong == "missing_record":
            records = {}
        elif wrong == "unexpected_record":
            records["features"] = st_save({"x": np.zeros((1, 64), np.float32), "y": np.zeros(1, np.int64)})
        refs = {}
        for name, data in records.items():
            blob_id = hashlib.sha256(data).hexdigest()
            self.offered[blob_id] = data  # offered before the result (§7.1)
            refs[name] = {"id": blob_id, "size": len(data), "kind": "weights", "format": "safetensors"}
        self.awaited = task["task_id"]
        metrics = {"samples": self.num_samples, "runtime": "doc-client"}
        if "label_counts" in self.reports:  # features: declined, so no record (§20.1)
            params = self.reports["label_counts"]
            metrics["label_counts"] = np.bincount(self.labels).tolist()
            if params:  # §20: all K counts, Laplace(1/epsilon) each, rounded, floored at 0
                counts = np.bincount(self.labels, minlength=params["classes"])[:params["classes"]]
                noisy = counts + np.random.default_rng().laplace(0.0, 1.0 / params["epsilon"], len(counts))
                metrics["label_counts"] = [int(c) for c in np.maximum(np.rint(noisy), 0)]
        self.last_result = {"task_id": task["task_id"], "round": task["round"], "arrays": refs,
                            "metrics": metrics}
        self.send("result", **self.last_result)

    def parse_config(self, config: dict, models: set[str]) -> tuple[list[str], list[str]]:
        """§5.5: the models the steps train, in order, and the models to return."""
        def bad(detail: str) -> Refusal:
            return Refusal("invalid_field", detail)

        if not isinstance(config, dict) or set(config) - {"steps", "return", "report"}:
            raise bad("config keys")
        steps = config.get("steps")
        if not isinstance(steps, list) or not 1 <= len(steps) <= 8:
            raise bad("steps")
        trained = []
        for step in steps:
            if not isinstance(step, dict) or set(step) - {"train", "recipe", "teacher"}:
                raise bad("step keys")
            name, teacher = step.get("train"), step.get("teacher")
            if not isinstance(name, str) or not NAME.match(name) or name not in models:
                raise bad(f"step trains {name!r}")
            recipe = step.get("recipe", {})
            if not isinstance(recipe, dict):
                raise bad("recipe")
            loss = recipe.get("loss", "ce")
            if loss not in ("ce", "kd", "recipfl_kt"):  # §14.1, §14.3
                raise bad(f"loss {loss!r}")
            if loss != "ce" and teacher is None:
                raise bad("a teacher loss without a teacher")
            if loss != "ce":  # a limit of this client, not of the protocol
                raise Refusal("unsupported_task", "this client trains only with ce")
            trained.append(name)
        returns = config.get("return", ["model"])
        if not isinstance(returns, list) or len(set(returns)) != len(returns) or \
                any(not isinstance(n, str) or not NAME.match(n) or n not in models for n in returns):
            raise bad("return")
        reports = config.get("report", {})
        if not isinstance(reports, dict) or len(reports) > 8:
            raise bad("report")
        for name, params in reports.items():  # §20
            if not isinstance(name, str) or not NAME.match(name) or not isinstance(params, dict):
                raise bad("report")
            if name == "label_counts":
                eps, classes = params.get("epsilon"), params.get("classes")
                if params and (set(params) != {"epsilon", "classes"} or type(classes) is not int
                               or not 1 <= classes <= 100000 or isinstance(eps, bool)
                               or not isinstance(eps, int | float) or not 0 < eps < float("inf")):
                    raise bad("label_counts parameters")
            elif name == "features":
                samples = params.get("samples")
                if set(params) - {"samples", "model"} or params.get("model", "model") not in models or \
                        type(samples) is not int or not 1 <= samples <= 4096:
                    raise bad("features parameters")
            else:
                raise Refusal("unsupported_task", f"this client cannot report {name!r}")
        self.reports = reports
        return trained, returns

    # -- main loop (§9.1) --------------------------------------------------------------------------
    def start(self) -> DocClient:
        self.mqtt.connect(self.host, self.port, keepalive=30)
        self.mqtt.loop_start()
        if not self.subscribed.wait(15):  # §4: give up without a CONNACK within 15 s
            raise TimeoutError("no connection to the broker")
        threading.Thread(target=self._serve_loop, daemon=True).start()
        return self

    def run(self) -> None:
        self.hello()
        while not self.stopping.is_set():
            try:
                kind, item = self.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "status":
                if item == "online":
                    self.hello()
            elif item["type"] == "task":
                try:
                    self.run_task(item)
                except Refusal as refusal:
                    self.send("error", code=refusal.code, detail=refusal.detail[:500], ref=item["task_id"])
            elif item["type"] in ("ack", "error") and item.get("ref") and item["ref"] == self.awaited:
                self.answers[item["ref"]] = item
                self.awaited = None
                self.offered.clear()  # withdraw (§9.1)

    def stop(self) -> None:
        self.stopping.set()
        self.mqtt.publish(self.t_status, b"offline", qos=1, retain=True).wait_for_publish(3)
        self.mqtt.disconnect()
        self.mqtt.loop_stop()
