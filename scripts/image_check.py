#!/usr/bin/env python3
"""Inspects the image scripts/image built, and runs tether from it.

    scripts/image_check.py localhost/tether:<version>

Checks, each failing with what it found:
  - the config: user 65532, entrypoint ["/tether"], the chart's default cmd,
    the OCI labels;
  - the filesystem: no shell or package manager anywhere;
  - the size, reported against the 30 MB target;
  - the chart deploys it by default: values.yaml's image.repository and
    Chart.yaml's appVersion (the default tag) name this image;
  - the binary runs from the image's own filesystem, through the image's own
    dynamic loader and libraries (running containers is not permitted
    here): `--version` prints the image's version, and `validate` accepts a
    config with a remote whose CA file is the image's CA bundle.
Containers and mounts it makes are removed on the way out.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

BUILDAH = ["buildah", "--storage-driver", "vfs"]
SIZE_TARGET = 30 * 1000 * 1000
SHELLS = {"sh", "bash", "dash", "ash", "busybox", "zsh"}
PACKAGE_MANAGERS = {"apt", "apt-get", "dpkg", "apk", "yum", "dnf", "rpm", "microdnf"}


def run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs).stdout


def fail(message):
    print(f"image check: {message}", file=sys.stderr)
    sys.exit(1)


def check_config(tag, version):
    image = json.loads(run(*BUILDAH, "inspect", "--type", "image", tag))
    config = image["OCIv1"]["config"]
    want = {
        "User": "65532:65532",
        "Entrypoint": ["/tether"],
        "Cmd": ["run", "--config", "/etc/tether/config/config.yaml"],
    }
    for key, value in want.items():
        if config.get(key) != value:
            fail(f"{key} is {config.get(key)!r}, want {value!r}")
    labels = config.get("Labels") or {}
    for label, value in {
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.source": "https://github.com/tether-rs/tether",
    }.items():
        if labels.get(label) != value:
            fail(f"label {label} is {labels.get(label)!r}, want {value!r}")
    print(f"config: user {config['User']}, entrypoint {config['Entrypoint']}, cmd {config['Cmd']}")


def check_chart(tag):
    repository, version = tag.rsplit(":", 1)
    with open("helm/tether/Chart.yaml") as f:
        app_version = re.search(r'^appVersion:\s*"?([^"\s]+)"?', f.read(), re.M).group(1)
    with open("helm/tether/values.yaml") as f:
        chart_repository = re.search(r"^image:\n(?:\s+#.*\n)*\s+repository:\s*(\S+)", f.read(), re.M).group(1)
    if (chart_repository, app_version) != (repository, version):
        fail(f"the chart deploys {chart_repository}:{app_version} by default, not {tag}")
    print(f"chart: deploys {tag} by default")


def check_files(root):
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            if name in SHELLS | PACKAGE_MANAGERS:
                found.append(os.path.relpath(os.path.join(directory, name), root))
    if found:
        fail(f"the image holds a shell or package manager: {found}")
    files = sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )
    print(f"files ({len(files)}): {' '.join(files)}")
    return sum(os.path.getsize(os.path.join(root, f)) for f in files)


def check_runs(root, version):
    loader = next(
        (os.path.join(root, p) for p in ("lib64/ld-linux-x86-64.so.2", "lib/ld-linux-aarch64.so.1")
         if os.path.exists(os.path.join(root, p))),
        None,
    )
    if loader is None:
        fail("no dynamic loader in the image")
    libraries = ":".join(
        os.path.join(root, p) for p in ("lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
    )
    tether = [loader, "--inhibit-cache", "--library-path", libraries, os.path.join(root, "tether")]
    printed = run(*tether, "--version").strip()
    if printed != f"tether {version}":
        fail(f"--version printed {printed!r}")
    print(f"runs: {printed}")
    with tempfile.TemporaryDirectory() as folder:
        config = os.path.join(folder, "config.yaml")
        with open(config, "w") as f:
            f.write(
                "remotes:\n"
                "  - name: cluster-a\n"
                "    server: https://10.0.0.7:6443\n"
                f"    caFile: {os.path.join(root, 'etc/ssl/certs/ca-certificates.crt')}\n"
            )
        result = subprocess.run([*tether, "validate", "--config", config], capture_output=True, text=True)
        if result.returncode != 0:
            fail(f"validate exited {result.returncode}: {result.stderr}")
        print("runs: validate accepts a config")
    # The shipped binary links nothing from tests/: the demo's simulated
    # remotes come from the test kit, so it has no demo.
    result = subprocess.run([*tether, "demo"], capture_output=True, text=True)
    if result.returncode != 2 or "without the `demo` feature" not in result.stderr:
        fail(f"demo exited {result.returncode}, not 2 for a build without the test kit: {result.stderr}")
    print("runs: no demo, so no test kit, in the shipped binary")


def main():
    if len(sys.argv) != 2:
        fail("usage: image_check.py localhost/tether:<version>")
    tag = sys.argv[1]
    version = tag.rsplit(":", 1)[1]
    check_config(tag, version)
    check_chart(tag)
    container = run(*BUILDAH, "from", "--pull-never", tag).strip()
    try:
        root = run(*BUILDAH, "mount", container).strip()
        size = check_files(root)
        check_runs(root, version)
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True)
    verdict = "under" if size < SIZE_TARGET else "OVER"
    print(f"size: {size / 1e6:.1f} MB, {verdict} the {SIZE_TARGET / 1e6:.0f} MB target")
    if size >= SIZE_TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
