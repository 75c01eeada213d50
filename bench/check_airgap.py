"""Walk the air-gapped install as docs/getting-started.md#installing-on-an-air-gapped-server writes it.

`make check-airgap` (not part of the test suite: it downloads the whole wheelhouse, 1.6 GB for the CPU
stack, and installs twice; tens of minutes on 2 cores). The commands are not in this file: it reads the
page's two shell blocks marked `<!-- airgap-walk: connected -->` and `<!-- airgap-walk: server -->`,
replaces the values of each block's first lines (NAME=value: the files a user names) with this machine's,
and runs the rest as written (tests/test_offline.py checks that every name set here is one the page sets):

1. connected side: a fresh clone of this repository's HEAD (commit first: the walk runs what is
   committed), the connected block (`make setup`, `make wheelhouse`, `clarify offline bundle`) with the
   embedded SmolLM2 folder as the model, the embedded index as the index, stand-ins for the reader,
   cross-encoder and encoder (the SmolLM2 folder: `clarify doctor --offline` checks their layout, the
   walk loads none of them) and for ASQA.json (the shipped dev split, also as the train split: the
   official file cannot be downloaded here);
2. the carry: a second fresh clone, the bundle hard-linked beside it;
3. server side: the server block inside a network namespace whose only interface is loopback
   (`unshare -n`, then `ip link set lo up`), with its own empty $CLARIFY_HOME and no PIP_FIND_LINKS:
   `make install-offline`, `clarify doctor --offline` (exit 0: every check ok), `make demo` and a
   3-question `clarify run` on the bundle's index.

Needs root (unshare -n), `ip`, git, python3.11 and network to PyPI (torch 2.13.0+cpu from PIP_FIND_LINKS
or PyTorch's CPU index, as `make wheelhouse` takes it). Logs and timings: AIRGAP_DIR (default
/tmp/clarify-airgap)/logs; the last line says which step failed, or that every step passed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "getting-started.md"
_BLOCK = re.compile(r"<!-- airgap-walk: (\w+) -->\n```sh\n(.*?)```", re.S)
_CHOICE = re.compile(r"^([A-Z_]+)=(\S+)(\s+#.*)?$")


def blocks(text: str) -> dict[str, str]:
    """{side: shell text} of the page's marked blocks."""
    return {side: body for side, body in _BLOCK.findall(text)}


def split_choices(block: str) -> tuple[dict[str, str], list[str]]:
    """A block's leading NAME=value lines (comments before them skipped) and the lines after them."""
    lines = block.rstrip("\n").split("\n")
    choices: dict[str, str] = {}
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or _CHOICE.match(lines[i])):
        if m := _CHOICE.match(lines[i]):
            choices[m.group(1)] = m.group(2)
        i += 1
    return choices, lines[i:]


def script(block: str, values: dict[str, str]) -> str:
    """The block with its choices set to `values` (every choice the page makes, and no other)."""
    choices, rest = split_choices(block)
    if set(choices) != set(values):
        raise SystemExit(f"the page's choices {sorted(choices)} are not the walk's {sorted(values)}: update "
                         f"bench/check_airgap.py with docs/getting-started.md")
    return "".join(f"{k}={v}\n" for k, v in values.items()) + "\n".join(rest) + "\n"


def walk_values(work: Path, home: Path) -> dict[str, dict[str, str]]:
    """The values this machine gives each block's choices."""
    model = home / "models" / "smollm2-135m-instruct"
    stand_in = str(model)  # layout stand-in for the reader, cross-encoder and encoder (never loaded here)
    return {
        "connected": {"STACK": "cpu", "MODEL": str(model), "INDEX": str(home / "index" / "wiki-default"),
                      "READER": stand_in, "CROSS_ENCODER": stand_in, "ENCODER": stand_in,
                      "ASQA": str(work / "ASQA.json")},
        "server": {"STACK": "cpu", "MODEL": "smollm2-135m-instruct", "INDEX": "wiki-default",
                   "CONFIG": os.environ.get("AIRGAP_CONFIG", "data/examples/asqa-cpu.toml"), "LIMIT": "3"},
    }


def run(cmd: list[str] | str, log: Path, *, cwd: Path, env: dict, step: str, timings: dict) -> None:
    t0 = time.time()
    print(f"== {step} (log {log})", flush=True)
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                            shell=isinstance(cmd, str)).returncode
    timings[step] = round(time.time() - t0, 1)
    print(f"   {step}: exit {rc}, {timings[step]} s", flush=True)
    if rc != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise SystemExit(f"FAILED at {step} after {timings[step]} s (exit {rc}); log {log}")


def main() -> int:
    work = Path(os.environ.get("AIRGAP_DIR", "/tmp/clarify-airgap"))
    home = Path(os.environ.get("CLARIFY_HOME", Path.home() / ".cache" / "clarify"))
    if work.exists():
        shutil.rmtree(work)
    logs = work / "logs"
    logs.mkdir(parents=True)
    text = DOC.read_text(encoding="utf-8")
    found = blocks(text)
    values = walk_values(work, home)
    scripts = {side: script(found[side], values[side]) for side in ("connected", "server")}
    # the ASQA stand-in: the official layout with both splits, from the shipped dev split
    dev = json.loads((ROOT / "data" / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    (work / "ASQA.json").write_text(json.dumps({"train": dev, "dev": dev}), encoding="utf-8")
    timings: dict[str, float] = {}
    env = dict(os.environ, CLARIFY_HOME=str(home))
    connected, server = work / "connected", work / "server"
    run(["git", "clone", "-q", str(ROOT), str(connected)], logs / "clone.log", cwd=work, env=env,
        step="clone (connected)", timings=timings)
    (logs / "connected.sh").write_text(scripts["connected"])
    run(["bash", "-euxo", "pipefail", str(logs / "connected.sh")], logs / "connected.log", cwd=connected, env=env,
        step="connected block", timings=timings)
    run(["git", "clone", "-q", str(ROOT), str(server)], logs / "clone2.log", cwd=work, env=env,
        step="carry: clone", timings=timings)
    run(["cp", "-al", str(connected / "bundle"), str(server / "bundle")], logs / "carry.log", cwd=work, env=env,
        step="carry: bundle", timings=timings)
    (logs / "server.sh").write_text(scripts["server"])
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_DEFAULT_TIMEOUT"}
    server_env["CLARIFY_HOME"] = str(work / "server-home")
    inner = f"ip link set lo up && ip -brief link && exec bash -euxo pipefail {logs / 'server.sh'}"
    run(["unshare", "-n", "sh", "-c", inner], logs / "server.log", cwd=server, env=server_env,
        step="server block (unshare -n, loopback only)", timings=timings)
    (logs / "timings.json").write_text(json.dumps(timings, indent=1))
    print(f"every step passed: {json.dumps(timings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
