# deepspan: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build bench fuzz clean

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

# Runs the demo shop under six injected faults (CPU quota, CPU hog, lock,
# row lock, disk flood, slow network), records and analyses each run and
# prints the diagnosis table. Needs root. `make demo DEMO_ARGS="--scenario
# lock --keep runs"` runs one scenario and keeps its run for `deepspan report`.
DEMO_ARGS ?=
demo: deps
	$(CARGO) build --release -p deepspan
	"$${CARGO_TARGET_DIR:-target}/release/deepspan" demo $(DEMO_ARGS)

# The whole test suite; kernel tests need root and tracefs, and fail instead
# of skipping when DEEPSPAN_REQUIRE_KERNEL is set (CI sets it).
test: deps
	$(CARGO) build --release -p deepspan -p deepspan-workloads
	$(CARGO) test --release --workspace --no-fail-fast
	python3 -m pytest -q sdk/python/tests

# Benchmarks are timings: run by hand, never part of `make test`.
bench: build
	@bench/run.sh

# Runs each fuzz target (cargo-fuzz) for FUZZ_SECONDS each.
FUZZ_SECONDS ?= 600
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
