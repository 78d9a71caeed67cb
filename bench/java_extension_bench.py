#!/usr/bin/env python3
"""The Java agent extension's added cost per span (sdk/java), against the
stock OpenTelemetry Java agent alone, as ratios measured in one run,
interleaved.

The load is bench/java/SpanLoop.java: spans made through the OpenTelemetry
API (bridged by the agent to its SDK), each request span made current once
(one deepspan.on/off pair) with one child span. Three configurations, N runs
each, interleaved:
- agent: the stock agent alone;
- processor: the extension with its span processor only (deepspan.tid,
  mono start/end), no context storage wrapper;
- extension: the extension as shipped (processor + activation events).
Traces exporter `none`: no export cost in any of them, so the ratio is the
extension's cost against the agent's own span making, the least favourable
baseline (a real exporter adds to the baseline, not to the extension).

Timings only: this is never a test. Needs `make java-sdk`.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDK = ROOT / "sdk" / "java"
TARGET = SDK / "target"


def api_classpath(tmp: Path) -> str:
    """The OpenTelemetry API jars the extension compiles against (Maven's cache)."""
    out = tmp / "cp.txt"
    subprocess.run(
        ["mvn", "-B", "-q", "dependency:build-classpath", "-Dmdep.includeScope=provided", f"-Dmdep.outputFile={out}"],
        cwd=SDK,
        check=True,
    )
    return out.read_text().strip()


def processor_only_jar(tmp: Path) -> Path:
    """The extension without its context storage wrapper: the same classes,
    with a customizer that adds only the processor."""
    src = tmp / "src" / "dev" / "deepspan" / "bench"
    src.mkdir(parents=True)
    (src / "ProcessorOnly.java").write_text(
        """package dev.deepspan.bench;
public final class ProcessorOnly implements io.opentelemetry.sdk.autoconfigure.spi.AutoConfigurationCustomizerProvider {
  @Override
  public void customize(io.opentelemetry.sdk.autoconfigure.spi.AutoConfigurationCustomizer c) {
    c.addTracerProviderCustomizer((b, config) -> b.addSpanProcessor(new dev.deepspan.otel.DeepspanSpanProcessor()));
  }
}
"""
    )
    classes = tmp / "processor-only"
    shutil.copytree(TARGET / "classes", classes)
    cp = api_classpath(tmp)
    subprocess.run(["javac", "-d", str(classes), "-cp", f"{classes}:{cp}", str(src / "ProcessorOnly.java")], check=True)
    (classes / "META-INF" / "services" / "io.opentelemetry.sdk.autoconfigure.spi.AutoConfigurationCustomizerProvider").write_text(
        "dev.deepspan.bench.ProcessorOnly\n"
    )
    jar = tmp / "processor-only.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def run(classes: Path, cp: str, extension, spans: int, rounds: int) -> dict:
    args = ["java", f"-javaagent:{TARGET / 'agent' / 'opentelemetry-javaagent.jar'}", "-Dotel.javaagent.logging=none"]
    if extension is not None:
        args.append(f"-Dotel.javaagent.extensions={extension}")
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    out = subprocess.run(
        args + ["-cp", f"{classes}:{cp}", "SpanLoop", str(spans), str(rounds)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="JVM runs per configuration (interleaved)")
    parser.add_argument("--spans", type=int, default=100_000, help="request spans per round")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per JVM run (the best is kept)")
    a = parser.parse_args()
    extension = TARGET / "deepspan-otel-extension.jar"
    if not extension.is_file() or not (TARGET / "agent" / "opentelemetry-javaagent.jar").is_file():
        sys.exit("run `make java-sdk` first")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cp = api_classpath(tmp)
        classes = tmp / "bench"
        subprocess.run(["javac", "-d", str(classes), "-cp", cp, str(ROOT / "bench" / "java" / "SpanLoop.java")], check=True)
        configs = {"agent": None, "processor": processor_only_jar(tmp), "extension": extension}
        results = {name: [] for name in configs}
        for _ in range(a.runs):
            for name, jar in configs.items():
                results[name].append(run(classes, cp, jar, a.spans, a.rounds))
    print(f"per span, median of {a.runs} JVM runs (best of {a.rounds} rounds of {a.spans} request spans + children each):")
    base = {k: statistics.median(r[k] for r in results["agent"]) for k in ("cpu_ns_per_span", "wall_ns_per_span")}
    for name, rs in results.items():
        cpu = statistics.median(r["cpu_ns_per_span"] for r in rs)
        wall = statistics.median(r["wall_ns_per_span"] for r in rs)
        print(
            f"  {name:10} CPU {cpu:7.1f} ns ({cpu / base['cpu_ns_per_span']:.2f}x agent, +{cpu - base['cpu_ns_per_span']:.0f} ns)"
            f"   wall {wall:7.1f} ns ({wall / base['wall_ns_per_span']:.2f}x)"
        )


if __name__ == "__main__":
    main()
