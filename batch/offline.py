"""The air-gapped bundle's manifest (docs/getting-started.md#installing-on-an-air-gapped-server).

A bundle is one folder carried from a connected machine to the server: `wheels/` (`make wheelhouse`),
`models/` (model folders) and `indexes/` (index folders), and `manifest.json`, written here by
`clarify offline manifest BUNDLE`: the size and sha256 of every file under the bundle, the lock the
wheels were downloaded from (its sha256 and every pinned version). On the server, `clarify doctor
--offline BUNDLE` checks the bundle against it (a missing, truncated or altered file is named) and the
installed packages against the lock's versions. Hashing reads every byte (a 60 GB index: minutes); it is
the transfer check, done once per copy.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import sys
import time
from pathlib import Path

from clarify.errors import InputError, printable

MANIFEST = "manifest.json"
FORMAT = 1
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.M)


def lock_pins(lock_text: str) -> dict[str, str]:
    """{normalised name: version} of every `name==version` line of a pip lock (requirements/*.txt)."""
    from packaging.utils import canonicalize_name

    return {canonicalize_name(n): v for n, v in _PIN.findall(lock_text)}


def _files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file() and p.relative_to(bundle).as_posix() != MANIFEST)


def _sha256(path: Path, bar=None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return h.hexdigest()


def _hash_all(bundle: Path, files: list[Path]) -> dict[str, dict]:
    from tqdm import tqdm

    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"sha256 {bundle.name}", disable=total < 1 << 28,
              file=sys.stderr) as bar:
        return {f.relative_to(bundle).as_posix(): {"size": f.stat().st_size, "sha256": _sha256(f, bar)} for f in files}


def write_manifest(bundle: Path, lock: Path) -> dict:
    """Hash every file of `bundle` and write `bundle/manifest.json` (returned)."""
    if not bundle.is_dir():
        raise InputError("not a folder (make wheelhouse WHEELS=BUNDLE/wheels makes one)", path=str(bundle))
    text = lock.read_text(encoding="utf-8")
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "lock": {"name": lock.name, "sha256": hashlib.sha256(text.encode()).hexdigest(), "pins": lock_pins(text)},
                "files": _hash_all(bundle, _files(bundle))}
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest(bundle: Path) -> dict:
    """`bundle/manifest.json`, its schema checked (what `write_manifest` writes): an InputError naming the
    field that is missing or of the wrong type, names shown through `errors.printable` (a name in the
    manifest is the carrier's, and reaches the terminal)."""
    if not bundle.is_dir():
        raise InputError("not a folder: give the bundle folder (wheels/, models/, indexes/, manifest.json)",
                         path=str(bundle))
    path = bundle / MANIFEST
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no manifest.json: write it with `clarify offline manifest BUNDLE` before copying",
                         path=str(bundle)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a JSON manifest ({exc})", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read the manifest: {exc.strerror or exc}", path=str(path)) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), dict):
        raise InputError(f"not a clarify bundle manifest (format {FORMAT})", path=str(path))

    def bad(field: str, want: str) -> InputError:
        return InputError(f"not a clarify bundle manifest: {want}", path=str(path), field=printable(field))

    for rel, entry in m["files"].items():
        if not isinstance(entry, dict):
            raise bad(f"files.{rel}", "each file entry is an object with size and sha256")
        size, digest = entry.get("size"), entry.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"files.{rel}.size", f"a file's size is a number of bytes, got {size!r}")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise bad(f"files.{rel}.sha256", "a file's sha256 is 64 lower-case hex digits")
    lock = m.get("lock")
    if not isinstance(lock, dict):
        raise bad("lock", "the lock the wheels came from (name, sha256, pins) is missing")
    if not isinstance(lock.get("name"), str):
        raise bad("lock.name", "the lock's file name is missing")
    pins = lock.get("pins")
    if not isinstance(pins, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pins.items()):
        raise bad("lock.pins", "the lock's pins are an object of package name -> version strings")
    return m


def check_bundle(bundle: Path) -> dict:
    """The bundle against its manifest, and the installed packages against the manifest's lock:
    {"files": n, "bytes": n, "problems": [one line each]}. Every name (a file's, a package's) is shown
    through `errors.printable`: they come from the bundle."""
    m = read_manifest(bundle)
    problems = []
    present = {f.relative_to(bundle).as_posix(): f for f in _files(bundle)}
    for rel in sorted(set(m["files"]) - set(present)):
        problems.append(f"missing: {printable(rel)}")
    common = [present[rel] for rel in sorted(set(m["files"]) & set(present))]
    sized = [f for f in common if f.stat().st_size == m["files"][f.relative_to(bundle).as_posix()]["size"]]
    for f in sorted(set(common) - set(sized)):
        rel = f.relative_to(bundle).as_posix()
        problems.append(f"size differs: {printable(rel)} ({f.stat().st_size} bytes, manifest "
                        f"{m['files'][rel]['size']}): copy it again")
    for rel, got in _hash_all(bundle, sized).items():
        if got["sha256"] != m["files"][rel]["sha256"]:
            problems.append(f"sha256 differs: {printable(rel)}: copy it again")
    for rel in sorted(set(present) - set(m["files"])):
        problems.append(f"not in the manifest: {printable(rel)}")
    for name, version in sorted(m["lock"]["pins"].items()):
        try:
            have = importlib.metadata.version(name)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            problems.append(f"not installed: {printable(name)}=={printable(version)} (make install-offline "
                            f"WHEELS={printable(bundle)}/wheels)")
            continue
        if have != version:
            problems.append(f"installed {printable(name)} {have}, the lock pins {printable(version)}")
    return {"bundle": printable(bundle), "lock": printable(m["lock"]["name"]), "files": len(m["files"]),
            "bytes": sum(f["size"] for f in m["files"].values()), "problems": problems}


EPILOG = """\
examples (docs/getting-started.md#installing-on-an-air-gapped-server):
  make wheelhouse STACK=gpu WHEELS=bundle/wheels        on a connected Linux x86_64 machine, Python 3.11
  cp -r MODEL_DIR bundle/models/; cp -r INDEX_DIR bundle/indexes/
  clarify offline manifest bundle --lock requirements/gpu.txt
  ... carry the repository and bundle/ to the server ...
  make install-offline STACK=gpu WHEELS=bundle/wheels   on the server: pip reaches no network
  clarify doctor --offline bundle                       every file and installed package vs the manifest
"""


def register(sub) -> None:
    p = sub.add_parser("offline", help="the air-gapped bundle: write its manifest (wheels, models, indexes)",
                       description=__doc__, epilog=EPILOG)
    inner = p.add_subparsers(dest="offline_command", required=True)
    m = inner.add_parser("manifest", help="hash every file of BUNDLE into BUNDLE/manifest.json",
                         description=__doc__, epilog=EPILOG)
    m.add_argument("bundle", help="the bundle folder (wheels/, models/, indexes/)")
    m.add_argument("--lock", default="requirements/cpu.txt",
                   help="the lock the wheels were downloaded from (default requirements/cpu.txt; GPU: requirements/gpu.txt)")
    m.set_defaults(func=cmd_manifest)


def cmd_manifest(args: argparse.Namespace) -> int:
    lock = Path(args.lock)
    if not lock.is_file():
        raise InputError("no such lock file", path=str(lock))
    m = write_manifest(Path(args.bundle), lock)
    size = sum(f["size"] for f in m["files"].values())
    print(f"{printable(Path(args.bundle) / MANIFEST)}: {len(m['files'])} files, {size / 1e9:.2f} GB, lock "
          f"{printable(lock.name)} ({len(m['lock']['pins'])} pins); on the server: clarify doctor --offline "
          f"{printable(args.bundle)}")
    return 0
