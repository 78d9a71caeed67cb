#!/usr/bin/env python3
"""Runs the test executables that `cargo test --no-run
--message-format=json` built, one after another, as `cargo test` runs them:
in the package's folder, with the package's CARGO_* variables, each under a
`Running SRC (EXE)` header, on to the next one when one fails.

    scripts/test-binaries.py ARTIFACTS.json [--package P | --except P]... [-- ARGS]

ARGS go to every executable (`--ignored`, `--include-ignored`, a filter).
Exits 0 when every executable passed, 1 when one failed, 2 when ARTIFACTS
names none.

Why not `cargo test -p P`: cargo holds the build folder's lock while it
checks what to build, so a test run started by cargo waits for any build
beside it; and a subset of packages may resolve other features than the
whole workspace, rebuilding shared crates and the binaries the running
tests use. scripts/test-suite.sh builds once and runs the executables
itself."""

import argparse
import json
import os
import subprocess
import sys


def executables(path):
    """(package name, manifest folder, source, executable) of every test
    executable in cargo's JSON messages, in build order, each once."""
    seen = set()
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
                continue
            if not msg["profile"]["test"] or msg["executable"] in seen:
                continue
            seen.add(msg["executable"])
            name = msg["package_id"].rsplit("#", 1)[-1].split("@")[0]
            # package_id "path+file:///…/crates/cli#deepspan@0.1.0": a bare
            # "#0.1.0" when the folder name is the package name.
            if not name or name[0].isdigit():
                name = os.path.basename(os.path.dirname(msg["manifest_path"]))
            yield name, os.path.dirname(msg["manifest_path"]), msg["target"]["src_path"], msg["executable"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifacts", help="the JSON messages of `cargo test --no-run --message-format=json`")
    p.add_argument("--package", action="append", default=[], help="run only this package's executables")
    p.add_argument("--except", dest="excluded", action="append", default=[], help="skip this package's")
    argv = sys.argv[1:]
    # Everything after "--" goes to the executables, as with cargo.
    split = argv.index("--") if "--" in argv else len(argv)
    opts = p.parse_args(argv[:split])
    opts.args = argv[split + 1:]

    chosen = [
        e for e in executables(opts.artifacts)
        if (not opts.package or e[0] in opts.package) and e[0] not in opts.excluded
    ]
    if not chosen:
        print(f"test-binaries: {opts.artifacts} names no test executable of the packages asked for",
              file=sys.stderr)
        return 2
    failed = []
    cwd = os.getcwd()
    for package, folder, source, exe in chosen:
        print(f"     Running {os.path.relpath(source, folder)} ({os.path.relpath(exe, cwd)})", flush=True)
        env = dict(os.environ, CARGO_MANIFEST_DIR=folder, CARGO_PKG_NAME=package)
        status = subprocess.run([exe, *opts.args], cwd=folder, env=env).returncode
        if status != 0:
            failed.append(f"{package}: {os.path.relpath(source, folder)} (exit {status})")
    if failed:
        print(f"test-binaries: {len(failed)} of {len(chosen)} test executables failed:", file=sys.stderr)
        for f in failed:
            print(f"    {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
