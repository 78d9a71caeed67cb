# deepspan: the two commands a newcomer needs are `make demo` and `make test`;
# a developer's loop after each change is `make check`.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo check test bench bench-agent fuzz clean build ui ui-e2e jaeger java-sdk \
	setup-build setup-demo setup-check setup-test

# What each purpose needs, and nothing more (scripts/setup.sh says what and
# why): each step prints its wall time.
setup-build setup-demo setup-check setup-test:
	@scripts/setup.sh $(@:setup-%=%)

# Jaeger v2 for the export and agent tests, built from the Go module proxy
# once and cached under ~/.cache/deepspan. Prints the binary's path.
jaeger:
	@scripts/build-jaeger.sh

# The OpenTelemetry Java agent extension (sdk/java): its unit tests, then
# sdk/java/target/deepspan-otel-extension.jar and the stock agent it is tested
# with, sdk/java/target/agent/opentelemetry-javaagent.jar (Maven Central,
# cached in ~/.m2). Then the fault extension for WireMock, the third-party
# application of the CLI's java_app tests, and WireMock's jars in its
# target/lib.
java-sdk:
	cd sdk/java && mvn -B -q --no-transfer-progress package
	cd sdk/java/testapp/wiremock-fault && mvn -B -q --no-transfer-progress package

# Where cargo puts binaries (CARGO_TARGET_DIR when set).
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
DEEPSPAN_BIN := $(TARGET_DIR)/release/deepspan
TIMED := scripts/timed.sh

build: setup-build ui
	$(CARGO) build --release --workspace

# The web UI (ui/, TypeScript + Vite) is built into ui/dist, which the
# ui-server crate compiles into the binary: it must exist before cargo runs.
# Built again only when its sources change: a new ui/dist makes cargo
# rebuild ui-server and the binary.
UI_SOURCES := $(wildcard ui/src/*) ui/index.html ui/package.json ui/package-lock.json \
	ui/tsconfig.json ui/vite.config.ts
ui: ui/dist/index.html
ui/dist/index.html: $(UI_SOURCES)
	cd ui && npm run --silent build

# End-to-end test of `deepspan ui` in headless Chromium on a real recording;
# screenshots in $(TARGET_DIR)/ui-e2e.
ui-e2e: setup-test ui
	$(CARGO) build --release -p deepspan
	node ui/e2e/e2e.mjs --deepspan $(DEEPSPAN_BIN) --out $(TARGET_DIR)/ui-e2e

# Runs the demo shop under six injected faults (CPU quota, CPU hog, lock,
# row lock, disk flood, slow network), records and analyses each run and
# prints the diagnosis table. Needs root. `make demo DEMO_ARGS="--scenario
# lock --keep runs"` runs one scenario and keeps its run for `deepspan report`.
# The demo's own set-up (PostgreSQL, the shop's Python packages: a minute on
# a fresh machine) runs while cargo builds, which needs only the build's.
DEMO_ARGS ?=
demo: setup-build
	@$(TIMED) "web UI" $(MAKE) --no-print-directory -s ui
	@scripts/setup.sh demo & setup=$$!; \
	  $(TIMED) "build deepspan" $(CARGO) build --release -p deepspan; built=$$?; \
	  wait $$setup && [ $$built -eq 0 ]
	$(DEEPSPAN_BIN) demo $(DEMO_ARGS)

# The fast loop, after each change: format, clippy, and every test that
# needs no root, no tracefs and no service (tests that do are marked
# `#[ignore = "system: …"]`, which `make test` lifts), the Python and
# Node.js SDKs' own tests, and the web UI's number formats against
# docs/format-vectors.json. Shares the release build with `make demo` and
# `make test`: `cargo test` without --workspace takes the default members,
# which leave out the criterion benchmarks (crates/bench says why).
check: setup-check ui
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) test --release
	python3 -m pytest -q -p no:cacheprovider sdk/python/tests
	node --test sdk/node/test/
	node ui/test/units.test.mjs
	node ui/test/queue.test.mjs

# The whole suite; system tests need root and tracefs, and fail instead of
# skipping when DEEPSPAN_REQUIRE_KERNEL is set (.ci/run sets it). Each stage
# prints its wall time (and appends it to $$DEEPSPAN_STAGE_LOG);
# scripts/test-suite.sh says which stages run beside the CLI's system tests.
test:
	@$(TIMED) "set-up" scripts/setup.sh test
	@$(TIMED) "Java extension (Maven)" $(MAKE) --no-print-directory -s java-sdk
	@$(MAKE) --no-print-directory -s ui
	@env CARGO=$(CARGO) TARGET_DIR=$(TARGET_DIR) scripts/test-suite.sh

# Benchmarks are timings: run by hand, never part of `make test`.
bench: setup-test build java-sdk
	@bench/run.sh

# The live agent's benchmarks (root and tracefs): throughput through
# `deepspan agent` on one CPU, anomaly-to-diagnosed-span latency, and its
# overhead on the demo shop against OpenTelemetry -> Jaeger alone.
bench-agent: setup-test ui
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
