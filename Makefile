# deepspan: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build bench bench-agent fuzz clean ui ui-e2e jaeger java-sdk

deps:
	@scripts/install-deps.sh

# Jaeger v2 for the export test (crates/cli/tests/export_jaeger.rs), built
# from the Go module proxy once and cached under ~/.cache/deepspan; `deps`
# builds it too. Prints the binary's path.
jaeger:
	@scripts/build-jaeger.sh

# The OpenTelemetry Java agent extension (sdk/java): its unit tests, then
# sdk/java/target/deepspan-otel-extension.jar and the stock agent it is tested
# with, sdk/java/target/agent/opentelemetry-javaagent.jar (Maven Central,
# cached in ~/.m2). Then the fault extension for WireMock, the third-party
# application of crates/cli/tests/java_app.rs, and WireMock's jars in its
# target/lib.
java-sdk: deps
	cd sdk/java && mvn -B --no-transfer-progress package
	cd sdk/java/testapp/wiremock-fault && mvn -B --no-transfer-progress package

# Where cargo puts binaries (CARGO_TARGET_DIR when set).
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

build: deps ui
	$(CARGO) build --release --workspace

# The web UI (ui/, TypeScript + Vite) is built into ui/dist, which the
# ui-server crate compiles into the binary: it must exist before cargo runs.
ui: deps
	@cd ui && { [ -d node_modules ] && [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }
	cd ui && npm run --silent build

# End-to-end test of `deepspan ui` in headless Chromium on a real recording;
# screenshots in $(TARGET_DIR)/ui-e2e.
ui-e2e: ui
	$(CARGO) build --release -p deepspan
	node ui/e2e/e2e.mjs --deepspan $(TARGET_DIR)/release/deepspan --out $(TARGET_DIR)/ui-e2e

# Runs the demo shop under six injected faults (CPU quota, CPU hog, lock,
# row lock, disk flood, slow network), records and analyses each run and
# prints the diagnosis table. Needs root. `make demo DEMO_ARGS="--scenario
# lock --keep runs"` runs one scenario and keeps its run for `deepspan report`.
DEMO_ARGS ?=
demo: deps ui
	$(CARGO) build --release -p deepspan
	$(TARGET_DIR)/release/deepspan demo $(DEMO_ARGS)

# The whole test suite; kernel tests need root and tracefs, and fail instead
# of skipping when DEEPSPAN_REQUIRE_KERNEL is set (CI sets it).
test: deps ui java-sdk
	$(CARGO) build --release -p deepspan -p deepspan-workloads
	$(CARGO) test --release --workspace --no-fail-fast
	python3 -m pytest -q sdk/python/tests
	python3 -m pytest -q tests/fleet --deepspan $(TARGET_DIR)/release/deepspan
	node ui/e2e/e2e.mjs --deepspan $(TARGET_DIR)/release/deepspan --out $(TARGET_DIR)/ui-e2e

# Benchmarks are timings: run by hand, never part of `make test`.
bench: build java-sdk
	@bench/run.sh

# The live agent's benchmarks (issue 17; root and tracefs): throughput
# through `deepspan agent` on one CPU, anomaly-to-diagnosed-span latency,
# and its overhead on the demo shop against OpenTelemetry -> Jaeger alone.
bench-agent: deps ui
	$(CARGO) build --release -p deepspan
	$(CARGO) bench -p deepspan-agent --bench agent_throughput
	$(CARGO) bench -p deepspan-agent --bench agent_latency
	python3 bench/agent_overhead.py

# Runs each fuzz target (cargo-fuzz) for FUZZ_SECONDS each.
FUZZ_SECONDS ?= 600
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
