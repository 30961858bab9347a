#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes side by side: `scripts/test test`.

`cargo test` runs one binary after another, and most of tether's tests
wait on real processes (a Lease to expire, a probe to time out) with the
CPU idle: on 2 cores the run took 15 minutes with 9 minutes of CPU. Here
every binary is built first (`cargo test --no-run`), then run as cargo runs
it (from its package's folder, with the same arguments), in `LANES` lanes,
longest first by the times the last run recorded (on a clean clone, by
those scripts/test-times.json keeps). Each lane hands out its
own slice of test ports (`TETHER_TEST_PORTS`), so binaries side by side
never take the same one. A binary's output is printed whole when it ends,
so lanes never interleave; the doc tests run last, through cargo.

Usage: test_lanes.py CARGO_TEST_ARGS...   (LANES=2 by default)
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

LANES = int(os.environ.get("LANES", "2"))
# The kit's port range (tests/testkit/src/plumbing.rs), split among lanes.
PORTS = (10_000, 31_999)
TIMES = Path("target/test-times.json")
# What a run on 2 cores recorded, for a clean clone's first run.
SEED = Path("scripts/test-times.json")


def binaries(cargo_args):
    """Every test binary `cargo test ARGS` would run: (name, path, cwd)."""
    build = subprocess.run(
        ["cargo", "test", *cargo_args, "--no-run", "--message-format=json-render-diagnostics"],
        stdout=subprocess.PIPE,
        check=False,
        text=True,
    )
    if build.returncode != 0:
        sys.exit(build.returncode)
    found = []
    for line in build.stdout.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("reason") != "compiler-artifact":
            continue
        if not message.get("profile", {}).get("test") or not message.get("executable"):
            continue
        target = message["target"]
        package = Path(message["manifest_path"]).parent
        name = f"{package.name}/{target['kind'][0]}/{target['name']}"
        found.append((name, message["executable"], package))
    return found


def main():
    cargo_args = sys.argv[1:]
    tests = binaries(cargo_args)
    times = json.loads((TIMES if TIMES.exists() else SEED).read_text())
    # Longest first; one never timed counts as long.
    tests.sort(key=lambda t: -times.get(t[0], 1e9))
    queue = list(tests)
    lock = threading.Lock()
    results = {}
    span = (PORTS[1] - PORTS[0] + 1) // LANES

    def lane(index):
        first = PORTS[0] + index * span
        env = dict(os.environ, TETHER_TEST_PORTS=f"{first}-{first + span - 1}")
        while True:
            with lock:
                if not queue:
                    return
                name, path, cwd = queue.pop(0)
            started = time.monotonic()
            run = subprocess.run(
                [path],
                cwd=cwd,
                env=dict(env, CARGO_MANIFEST_DIR=str(cwd)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
            took = time.monotonic() - started
            output = run.stdout.decode(errors="replace")
            with lock:
                results[name] = (run.returncode, took)
                summary = [l for l in output.splitlines() if l.startswith("test result:")]
                print(f"     Running {name} (lane {index}, {took:.1f}s)")
                if run.returncode == 0:
                    print("\n".join(summary), flush=True)
                else:
                    print(output, flush=True)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(LANES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    doc = subprocess.run(["cargo", "test", *cargo_args, "--doc"], check=False)
    failed = sorted(name for name, (code, _) in results.items() if code != 0)
    times.update({name: took for name, (_, took) in results.items()})
    TIMES.parent.mkdir(exist_ok=True)
    TIMES.write_text(json.dumps(times, indent=1, sort_keys=True))
    busiest = sorted(results.items(), key=lambda r: -r[1][1])[:5]
    print(
        f"{len(results)} test binaries in {LANES} lanes; longest: "
        + ", ".join(f"{name} {took:.0f}s" for name, (_, took) in busiest)
    )
    if failed or doc.returncode != 0:
        print("failed: " + ", ".join(failed + (["doc tests"] if doc.returncode else [])))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
