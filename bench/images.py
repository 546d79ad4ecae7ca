"""Container images side by side: bytes by package, distributions, start-up and idle RSS.

``python bench/images.py NAME=IMAGE ...`` (as root, with podman; the images built beforehand,
e.g. by tests/test_image.py or ``podman build``). For each image:

* **bytes by package**: the image mounted (``podman image mount``), every file of its
  virtualenv's site-packages counted (apparent size) to the distribution whose ``RECORD`` names
  its top-level entry; ``podman image inspect``'s size beside it;
* **distributions**: ``name==version`` of every distribution the image's Python sees (what an
  advisory scanner matches against);
* **start-up** on the OTLP/HTTP route: ``t0`` right before ``podman run`` is spawned (read-only
  root, host network, a fresh anonymous state volume), to the first Scheduled Events GET the
  in-process simulator logs (imports, configuration and the first IMDS round done); a real
  rotel collector receives. **Baseline**, spawned just before each run of the same image:
  ``podman run --entrypoint python IMAGE -c "import urllib3"``, spawn to exit (the container
  and the interpreter: what any Python process in that image pays). Runs go round-robin over
  the images, so a neighbour's load falls on all of them alike;
* **idle RSS**: ``VmRSS`` of every process of the container (the init and the exporter), read
  ``--idle`` seconds after the first poll with nothing changing.

Medians of ``--runs`` runs (quick mode: 3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchlib import (
    SCHEDULED_EVENTS,
    SummaryRow,
    median,
    print_table,
    save_results,
)

from scheduled_events_exporter.simulator import Simulator
from tests.containers import Podman, namespace_processes
from tests.exporter_process import free_port
from tests.peers.rotel import RotelReceiver

VENV = "opt/scheduled-events-exporter"
_DISTRIBUTIONS = ("import importlib.metadata, json; print(json.dumps(sorted("
                  "f\"{d.metadata['Name']}=={d.version}\" "
                  "for d in importlib.metadata.distributions())))")


def package_bytes(podman: Podman, image: str) -> dict[str, int]:
    """Bytes of site-packages by distribution. A file belongs to the distribution whose
    ``RECORD`` names it, or names its source (bytecode beside it or in ``__pycache__``), or
    else owns every file of its deepest directory (``(other)``: none does)."""
    root = Path(podman("image", "mount", image).stdout.strip())
    try:
        (site,) = (root / VENV).glob("lib/python3*/site-packages")
        owner: dict[str, str] = {}
        directories: dict[str, set[str]] = defaultdict(set)
        for record in site.glob("*.dist-info/RECORD"):
            name = record.parent.name.split("-")[0].replace("_", "-").lower()
            for line in record.read_text().splitlines():
                path = line.split(",", 1)[0]
                if not path or path.startswith(".."):
                    continue
                owner[path] = name
                parts = path.split("/")
                for depth in range(1, len(parts)):
                    directories["/".join(parts[:depth])].add(name)
        sizes: dict[str, int] = defaultdict(int)
        for path in (p for p in site.rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(site).as_posix()
            head, _, leaf = rel.rpartition("/")
            source = (f"{head.removesuffix('__pycache__')}{leaf.split('.', 1)[0]}.py"
                      if head.endswith("__pycache__") else rel.removesuffix("c"))
            name = owner.get(rel) or (owner.get(source) if rel.endswith(".pyc") else None)
            while name is None and head:
                single = directories.get(head, set())
                name = next(iter(single)) if len(single) == 1 else None
                head = head.rpartition("/")[0]
            sizes[name or "(other)"] += path.lstat().st_size
        return dict(sizes)
    finally:
        podman("image", "unmount", image, check=False)


def baseline(podman: Podman, image: str) -> float:
    """Spawn-to-exit seconds of the image's interpreter importing urllib3."""
    t0 = time.monotonic()
    podman("run", "--rm", "--no-healthcheck", "--network", "host", "--entrypoint", "python",
           image, "-c", "import urllib3")
    return time.monotonic() - t0


def one_run(podman: Podman, image: str, sim: Simulator, rotel: RotelReceiver,
            idle: float) -> dict[str, float]:
    """Start the exporter's container once: seconds to its first poll, idle RSS (MiB)."""
    name = f"see-bench-images-{os.getpid()}-{time.monotonic_ns()}"
    sim.clear_requests()
    command = podman.command(
        "run", "--rm", "--read-only", "--read-only-tmpfs=false", "--no-healthcheck",
        "--network", "host", "--name", name, "-e", f"SEE_IMDS_ENDPOINT={sim.url}",
        "-e", "SEE_SINKS=otlp", "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT={rotel.http_endpoint}",
        "-e", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
        "-e", f"SEE_HEALTH_ADDR=127.0.0.1:{free_port()}", "-e", "SEE_LOG_LEVEL=warning", image)
    t0 = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = t0 + 60
        first = None
        while first is None and time.monotonic() < deadline:
            first = next((r.monotonic for r in sim.requests if r.method == "GET"
                          and r.path.startswith(SCHEDULED_EVENTS)), None)
            time.sleep(0.005)
        if first is None:
            raise RuntimeError(f"{image}: no poll within 60 s")
        time.sleep(idle)
        pid = int(podman.inspect(name, "{{.State.Pid}}"))
        rss = 0
        for process in namespace_processes(pid):
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{process.pid}/status").read_text()
                rss += next(int(line.split()[1]) for line in status.splitlines()
                            if line.startswith("VmRSS:"))
        return {"first_poll": first - t0, "idle_rss_mib": rss / 1024}
    finally:
        podman("stop", "-t", "10", name, check=False)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("images", nargs="+", help="NAME=IMAGE, e.g. default=localhost/x:test")
    parser.add_argument("--quick", action="store_true", help="3 runs instead of --runs")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before the RSS")
    args = parser.parse_args()
    images = dict(item.split("=", 1) for item in args.images)
    runs = 3 if args.quick else args.runs
    podman = Podman(Path(tempfile.mkdtemp(prefix="see-bench-podman-")))

    sizes = {n: int(json.loads(podman("image", "inspect", i).stdout)[0]["Size"])
             for n, i in images.items()}
    packages = {n: package_bytes(podman, i) for n, i in images.items()}
    distributions = {n: json.loads(podman("run", "--rm", "--no-healthcheck", "--entrypoint",
                                          "python", i, "-c", _DISTRIBUTIONS).stdout)
                     for n, i in images.items()}
    measured: dict[str, list[dict[str, float]]] = {n: [] for n in images}
    with Simulator(vm_name="vm-bench") as sim, RotelReceiver() as rotel:
        for _ in range(runs):
            for name, image in images.items():
                spawn = baseline(podman, image)
                measured[name].append({"baseline": spawn,
                                       **one_run(podman, image, sim, rotel, args.idle)})

    names = list(images)
    everything = sorted({p for sizes_of in packages.values() for p in sizes_of},
                        key=lambda p: -max(packages[n].get(p, 0) for n in names))
    print_table("site-packages, MB by distribution",
                ["distribution", *names],
                [[p, *(round(packages[n].get(p, 0) / 1e6, 2) for n in names)]
                 for p in everything]
                + [["(site-packages)", *(round(sum(packages[n].values()) / 1e6, 2)
                                         for n in names)],
                   ["(image, podman)", *(round(sizes[n] / 1e6, 1) for n in names)],
                   ["(distributions)", *(len(distributions[n]) for n in names)]])
    rows = []
    summary = []
    for name in names:
        first = median([r["first_poll"] for r in measured[name]])
        base = median([r["baseline"] for r in measured[name]])
        rss = median([r["idle_rss_mib"] for r in measured[name]])
        rows.append([name, round(first, 3), round(max(r["first_poll"] for r in measured[name]),
                                                  3), round(base, 3), round(first - base, 3),
                     round(rss, 1)])
        summary.append(SummaryRow("images", f"{name}: spawn → first poll, OTLP http", "–",
                                  f"{first:.3f} s", f"{base:.3f} s", f"{first / base:.2f}", None))
    print_table(f"start-up on the OTLP/HTTP route, {runs} runs each (medians)",
                ["image", "first poll", "max", "baseline", "minus baseline", "idle RSS MiB"],
                rows)
    save_results("images", {"quick": args.quick, "images": images, "sizes": sizes,
                            "packages": packages, "distributions": distributions,
                            "runs": measured}, summary)


if __name__ == "__main__":
    main()
