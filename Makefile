# The two set-up commands of the README:
#   make demo   - install the server (.[server]) into .venv and run a real federated simulation
#                 (embedded broker, digits)
#   make test   - install into .venv (+ mosquitto, shellcheck, iptables, chromium, Fashion-MNIST, an arm64 device root)
#                 and run the test suite
# Versions come from constraints.txt (torch 2.13.0 CPU etc.); override PYTHON to pick another interpreter.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fedsdk-installed

.PHONY: demo test lint bench mosquitto rabbitmq cpp-deps jdk gxx shellcheck iptables chromium fashion-mnist ort-env litert-env arm64-root clean

# Two stamps in one venv: $(DEMO_STAMP) once '.[server]' (what the demo imports) is in, $(STAMP)
# once '.[dev]' (everything: tests, lint, the arm64 root) is. '.[dev]' contains '.[server]', so
# installing it marks the demo's stamp too; `make demo` first and `make test` later installs dev
# on top. pip is not quiet: the install takes minutes and its lines are the progress.
DEMO_STAMP := $(VENV)/.fedsdk-demo-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt constraints.txt ]; then \
	    echo "$(VENV) already has fedsdk[dev], which includes the server"; \
	else \
	    echo "make demo: installing fedsdk[server] into $(VENV): torch (CPU), amqtt, scikit-learn, scipy,"; \
	    echo "  matplotlib, dp-accounting, ... (~300 MB of wheels, ~1.4 GB installed; a few minutes)"; \
	    $(BIN)/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[server]'; \
	fi
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@echo "installing fedsdk[dev] into $(VENV): the server, executorch, onnx, ONNX Runtime, LiteRT,"
	@echo "  tensorboard, mlflow, pytest, ruff (~2 GB installed; several minutes)"
	$(BIN)/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	@echo "make demo: fedsdk-server simulate (FedAvg, 8 device processes, embedded broker, digits, 20 rounds)"
	$(BIN)/fedsdk-server simulate

test: $(STAMP) mosquitto rabbitmq cpp-deps jdk shellcheck iptables chromium fashion-mnist ort-env litert-env gxx arm64-root
	$(BIN)/pytest -q -n 2 --dist loadfile  # two workers, a test file per worker (README: the suite)

mosquitto:
	@sh scripts/ensure-mosquitto.sh

rabbitmq:  # the RabbitMQ cluster test (tests/integration/test_rabbitmq_cluster.py), bench/rabbitmq_cluster.py
	@sh scripts/ensure-tool.sh rabbitmqctl rabbitmq-server /usr/lib/rabbitmq/bin/rabbitmq-server

cpp-deps:  # builds the C++ device client (device_cpp/) in the tests
	@sh scripts/ensure-cpp-deps.sh

jdk:  # the Java binding of libfedsdk_device (device_java/): javac, java and jni.h in the tests
	@sh scripts/ensure-package.sh openjdk-17-jdk-headless /usr/bin/javac

gxx:  # compiles the torch-free executorch-native runtime (fedsdk runtime build) in the tests
	@sh scripts/ensure-tool.sh g++ g++

shellcheck:  # lints firmware_scripts/install-device.sh in the tests
	@sh scripts/ensure-tool.sh shellcheck shellcheck

iptables:  # packet loss inside a test's network namespace (tests/integration/test_network_conditions.py, bench/netns.py)
	@sh scripts/ensure-tool.sh iptables iptables /usr/sbin/iptables

chromium:  # renders the runs report page (fedsdk-server report) in the tests
	@sh scripts/ensure-tool.sh chromium chromium

fashion-mnist:  # Debian's copy of Fashion-MNIST (the dataset tests load, verify and serve it)
	@sh scripts/ensure-package.sh dataset-fashion-mnist /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

ort-env:  # .venv-ort: ONNX Runtime training (its wheel replaces onnxruntime, so its own venv)
	@sh scripts/setup-ort-env.sh

litert-env:  # .venv-litert: litert-torch for .tflite export (~2 GB, optional outside tests)
	@sh scripts/setup-litert-env.sh

arm64-root: $(STAMP)  # an arm64 Debian root with the torch-free device, for tests/integration/test_arm64_device.py
	@FEDSDK_HOST_PYTHON=$(BIN)/python bash scripts/build-arm64-root.sh

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP) mosquitto
	$(BIN)/python bench/transport.py

clean:
	rm -rf $(VENV) .venv-ort .venv-litert runs .pytest_cache device_cpp/build
