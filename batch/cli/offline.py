"""The air-gapped bundle: assembled, hashed and checked (docs/getting-started.md#installing-on-an-air-gapped-server).

A bundle is one folder carried from a connected machine to the server, in a fixed layout: `wheels/`
(`make wheelhouse`), `models/NAME/` (LLM folders), `indexes/NAME/` (index folders), `readers/NAME/` (the
SQuAD 2.0 reader of Disambig-F1 and DR), `cross-encoders/NAME/` (the reranker), `encoders/NAME/` (a
query encoder), `data/ASQA.json` (the official file: its train split is the official demo pool), and
`manifest.json`: the size and sha256 of every file under the bundle and the lock the wheels were
downloaded from (its sha256 and every pinned version). `clarify offline bundle OUT --model DIR ...`
checks each piece, copies (or hard-links) it into that layout and writes the manifest; `clarify offline
manifest BUNDLE` writes only the manifest (a bundle assembled by hand). On the server, `clarify doctor
--offline BUNDLE` checks the bundle against it (a missing, truncated or altered file is named), the wheels
against the lock, each piece (a model folder, an index that opens, the reader, cross-encoder and encoder
folders, ASQA.json's splits) and the installed packages against the lock's versions. Hashing reads every
byte (a 60 GB index: minutes); it is the transfer check, done once per copy.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clarify.errors import InputError, printable
from clarify.jsonl import read_json

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


@dataclass(frozen=True)
class BundleFile:
    """One file of the bundle in its manifest: bytes and sha256, checked on the server (`check_bundle`)."""

    size: int
    sha256: str


@dataclass(frozen=True)
class BundleLock:
    """The pip lock the bundle's wheels were downloaded for: its file name, sha256 and pins."""

    name: str
    sha256: str | None = None
    pins: dict[str, str] = field(default_factory=dict)  # normalised package name -> version


@dataclass(frozen=True)
class BundleManifest:
    """`bundle/manifest.json`: `write_manifest` writes it, `read_manifest` reads it back (its schema checked)."""

    lock: BundleLock
    files: dict[str, BundleFile]  # path under the bundle (posix) -> its size and sha256
    created: str | None = None  # UTC, ISO
    format: int = FORMAT

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict:
        return asdict(self)


def write_manifest(bundle: Path, lock: Path) -> BundleManifest:
    """Hash every file of `bundle` and write `bundle/manifest.json` (returned)."""
    if not bundle.is_dir():
        raise InputError("not a folder (make wheelhouse WHEELS=BUNDLE/wheels makes one)", path=str(bundle))
    text = lock.read_text(encoding="utf-8")
    manifest = BundleManifest(
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        lock=BundleLock(lock.name, hashlib.sha256(text.encode()).hexdigest(), lock_pins(text)),
        files={rel: BundleFile(**f) for rel, f in _hash_all(bundle, _files(bundle)).items()})
    (bundle / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True), encoding="utf-8")
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest(bundle: Path) -> BundleManifest:
    """`bundle/manifest.json`, its schema checked (what `write_manifest` writes): an InputError naming the
    field that is missing or of the wrong type, names shown through `errors.printable` (a name in the
    manifest is the carrier's, and reaches the terminal)."""
    if not bundle.is_dir():
        raise InputError("not a folder: give the bundle folder (wheels/, models/, indexes/, manifest.json)",
                         path=str(bundle))
    path = bundle / MANIFEST
    if not path.is_file():
        raise InputError("no manifest.json: write it with `clarify offline manifest BUNDLE` before copying",
                         path=str(bundle))
    try:
        m = read_json(path)
    except InputError as exc:
        raise InputError(f"not a JSON manifest ({exc.reason})", path=str(path), line=exc.line) from None
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
    digest = lock.get("sha256")
    return BundleManifest(lock=BundleLock(lock["name"], digest if isinstance(digest, str) else None, dict(pins)),
                          files={rel: BundleFile(e["size"], e["sha256"]) for rel, e in m["files"].items()},
                          created=m.get("created") if isinstance(m.get("created"), str) else None)


def check_bundle(bundle: Path) -> dict:
    """The bundle against its manifest, and the installed packages against the manifest's lock:
    {"files": n, "bytes": n, "problems": [one line each]}. Every name (a file's, a package's) is shown
    through `errors.printable`: they come from the bundle."""
    m = read_manifest(bundle)
    problems = []
    present = {f.relative_to(bundle).as_posix(): f for f in _files(bundle)}
    for rel in sorted(set(m.files) - set(present)):
        problems.append(f"missing: {printable(rel)}")
    common = [present[rel] for rel in sorted(set(m.files) & set(present))]
    sized = [f for f in common if f.stat().st_size == m.files[f.relative_to(bundle).as_posix()].size]
    for f in sorted(set(common) - set(sized)):
        rel = f.relative_to(bundle).as_posix()
        problems.append(f"size differs: {printable(rel)} ({f.stat().st_size} bytes, manifest "
                        f"{m.files[rel].size}): copy it again")
    for rel, got in _hash_all(bundle, sized).items():
        if got["sha256"] != m.files[rel].sha256:
            problems.append(f"sha256 differs: {printable(rel)}: copy it again")
    for rel in sorted(set(present) - set(m.files)):
        problems.append(f"not in the manifest: {printable(rel)}")
    for name, version in sorted(m.lock.pins.items()):
        try:
            have = importlib.metadata.version(name)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            problems.append(f"not installed: {printable(name)}=={printable(version)} (make install-offline "
                            f"WHEELS={printable(bundle)}/wheels)")
            continue
        if have != version:
            problems.append(f"installed {printable(name)} {have}, the lock pins {printable(version)}")
    return {"bundle": printable(bundle), "lock": printable(m.lock.name), "files": len(m.files),
            "bytes": m.bytes, "problems": problems}


# -- the bundle's layout and its pieces -----------------------------------------------------------------
# {option: (folder in the bundle, what it is, why a full benchmark needs it)}; data/ASQA.json and wheels/
# are single places. The reasons are the ones docs/getting-started.md#what-a-full-benchmark-needs gives.
FOLDERS = {
    "model": ("models", "an LLM folder (Hugging Face layout)", "the model ToC runs"),
    "index": ("indexes", "an index folder (clarify index build, a Pyserini Lucene or FAISS index)",
              "the Wikipedia the questions are answered from"),
    "reader": ("readers", "a SQuAD 2.0 extractive reader folder",
               "without one Disambig-F1 and DR are not computed"),
    "cross_encoder": ("cross-encoders", "a sentence-transformers CrossEncoder folder",
                      "without one \"reranked\" is the dense encoder's order"),
    "encoder": ("encoders", "a query encoder folder (sentence-transformers or DPRQuestionEncoder)",
                "the query encoder of a prebuilt FAISS index (Pyserini's DPR)"),
}
ASQA = "data/ASQA.json"
WHEELS = "wheels"
LAYOUT = {WHEELS, "data", MANIFEST, *(folder for folder, _, _ in FOLDERS.values())}
_FLAG = {"model": "--model", "index": "--index", "reader": "--reader", "cross_encoder": "--cross-encoder",
         "encoder": "--encoder"}


def check_piece(kind: str, path: Path) -> str:
    """A one-line description of the folder `path` as a piece of kind `kind` (FOLDERS), or an InputError
    naming what is wrong: the checks each consumer makes before it loads anything."""
    from clarify.local_llm.models import check_model_dir

    if kind == "index":
        return _check_index(path)
    check_model_dir(path)  # config.json with a model_type, and weights (every LLM, reader and encoder loader needs them)
    if kind == "reader" and not (path / "tokenizer.json").is_file():
        # eval/reader.py: the answer spans come from a fast tokenizer's offsets
        raise InputError("the reader needs a fast tokenizer (tokenizer.json) for offsets", path=str(path))
    model_type = read_json(path / "config.json")["model_type"]
    return f"{model_type}, {_gb(_tree_bytes(path))}"


def _check_index(path: Path) -> str:
    from clarify.index.bm25 import is_lucene_dir
    from clarify.index.faiss_check import check_faiss_dir
    from clarify.index.local import open_index

    if not path.is_dir():
        raise InputError("index directory not found", path=str(path))
    if (path / "index").is_file() and (path / "docid").is_file():  # a Pyserini FAISS folder (--faiss-index)
        check_faiss_dir(path)
        return f"FAISS (--faiss-index), {_gb(_tree_bytes(path))}"
    ix = open_index(path)  # reads the manifest and checks every part it names; loads nothing heavy
    what = f"{ix.manifest.passages.count} passages" if ix.manifest is not None else "Lucene" if is_lucene_dir(path) else "index"
    return f"{what}, {_gb(_tree_bytes(path))}"


def check_asqa(path: Path) -> str:
    """'train N, dev M questions' for an ASQA file in the official layout with both splits, else an
    InputError: the train split is the official demo pool, dev the benchmark (docs/running-toc.md)."""
    from clarify.asqa_file import asqa_splits, read_asqa

    splits = asqa_splits(path)
    missing = [s for s in ("train", "dev") if s not in splits]
    if missing:
        raise InputError(f"no {' and no '.join(missing)} split: the official ASQA.json has both (train: the "
                         "official demo pool; dev: the benchmark)", path=str(path))
    return ", ".join(f"{s} {len(read_asqa(path, s))}" for s in ("train", "dev")) + " questions"


def _msg(exc: InputError) -> str:
    """The error's message without the path it starts with (the check's line names the piece)."""
    text = str(exc)
    if exc.path and text.startswith(str(exc.path)) and ": " in text[len(str(exc.path)):]:
        return text[len(str(exc.path)):].split(": ", 1)[1]
    return text


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _copy(src: Path, dst: Path, link: bool) -> None:
    """`src` (a file or folder; symbolic links followed, as in a Hugging Face cache snapshot) to `dst`,
    through a hidden temporary name renamed at the end: an interrupted copy is never taken for a piece."""
    tmp = dst.with_name(f".partial-{dst.name}")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()

    def put(a, b):
        if link:
            try:
                return os.link(os.path.realpath(a), b)
            except OSError:  # another file system, or links not allowed: copy
                pass
        return shutil.copy2(a, b)

    if src.is_dir():
        shutil.copytree(src, tmp, copy_function=put)
    else:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        put(src, tmp)
    tmp.rename(dst)


def assemble(out: Path, pieces: dict[str, list[Path]], *, asqa: Path | None, wheels: Path | None, lock: Path,
             link: bool = False) -> BundleManifest:
    """Check every piece, place it in `out`'s layout (FOLDERS) and write the manifest (returned). Every
    check runs before anything is copied: a bad piece is one InputError and `out` is left as it was."""
    if out.exists() and not out.is_dir():
        raise InputError("the bundle path exists and is not a folder", path=str(out))
    if out.is_dir():
        stray = sorted(p.name for p in out.iterdir() if p.name not in LAYOUT)
        if stray:
            raise InputError(f"not a bundle folder: it holds {printable(stray[0])!r}, outside the bundle layout "
                             f"({', '.join(sorted(LAYOUT))}); give a new or empty folder", path=str(out))
    if not lock.is_file():
        raise InputError("no such lock file", path=str(lock))
    plan: list[tuple[Path, Path]] = []
    for kind, paths in pieces.items():
        folder = FOLDERS[kind][0]
        for src in paths:
            src = Path(src).expanduser()
            try:
                check_piece(kind, src)
            except InputError as exc:
                raise InputError(f"{_FLAG[kind]} {exc}") from None
            dst = out / folder / src.resolve().name
            if dst in {d for _, d in plan} or dst.exists():
                raise InputError(f"{folder}/{printable(dst.name)} is already in the bundle (two {_FLAG[kind]} "
                                 "folders of one name, or an earlier bundle): rename one, or remove it to replace it",
                                 path=str(dst))
            plan.append((src, dst))
    if asqa is not None:
        try:
            check_asqa(asqa)
        except InputError as exc:
            raise InputError(f"--asqa {exc}") from None
        if (out / ASQA).exists():
            raise InputError(f"{ASQA} is already in the bundle: remove it to replace it", path=str(out / ASQA))
        plan.append((asqa, out / ASQA))
    if wheels is not None:
        if not wheels.is_dir():
            raise InputError("--wheels: not a folder (make wheelhouse STACK=... WHEELS=DIR makes one)", path=str(wheels))
        for w in sorted(wheels.iterdir()):
            dst = out / WHEELS / w.name
            if not w.is_file():
                continue
            if dst.exists():
                if dst.stat().st_size != w.stat().st_size:
                    raise InputError(f"{WHEELS}/{printable(w.name)} is in the bundle with another size: remove it",
                                     path=str(dst))
                continue
            plan.append((w, dst))
    out.mkdir(parents=True, exist_ok=True)
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        _copy(src, dst, link)
    return write_manifest(out, lock)


# -- the checks of `clarify doctor --offline` (each one line: ok, or what is missing and the fix) ----------
def _wheel_versions(folder: Path) -> dict[str, set[str]]:
    """{normalised name: {versions}} of the wheels and sdists in `folder`, read from their file names."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        canonicalize_name,
        parse_sdist_filename,
        parse_wheel_filename,
    )

    out: dict[str, set[str]] = {}
    for f in folder.iterdir() if folder.is_dir() else ():
        try:
            name, version = (parse_wheel_filename(f.name)[:2] if f.name.endswith(".whl")
                             else parse_sdist_filename(f.name))
        except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
            continue
        out.setdefault(canonicalize_name(name), set()).add(str(version))
    return out


def bundle_checks(bundle: Path, manifest: BundleManifest, repo_locks: Path | None = None) -> list[dict]:
    """Each piece of `bundle` (`read_manifest`) as {name, ok, detail, fix}: the wheels vs the lock
    (and vs this checkout's lock of that name, in `repo_locks`), every model, index, reader, cross-encoder
    and encoder folder, and data/ASQA.json. Nothing is loaded: the checks each consumer makes first."""
    from packaging.version import InvalidVersion, Version

    b = printable(bundle)
    add = f"clarify offline bundle {b} --lock requirements/{printable(manifest.lock.name)}"
    checks = []
    have = _wheel_versions(bundle / WHEELS)

    def same(a: str, b: str) -> bool:
        try:
            return Version(a) == Version(b)
        except InvalidVersion:
            return a == b

    pins = manifest.lock.pins
    absent = sorted(f"{printable(n)}=={printable(v)}" for n, v in pins.items()
                    if not any(same(v, got) for got in have.get(n, ())))
    wheel_fix = (f"on the connected machine: make wheelhouse STACK=... WHEELS={b}/wheels, then clarify offline "
                 f"manifest {b} --lock requirements/{printable(manifest.lock.name)}")
    if absent:
        checks.append({"name": "wheels", "ok": False, "detail": f"{len(absent)} of {len(pins)} locked packages have "
                       f"no file in wheels/ (e.g. {', '.join(absent[:3])})", "fix": wheel_fix})
    else:
        checks.append({"name": "wheels", "ok": True, "detail": f"a file for each of the {len(pins)} packages "
                       f"{printable(manifest.lock.name)} pins", "fix": ""})
    mine = (repo_locks / manifest.lock.name) if repo_locks else None
    if mine is not None and mine.is_file():
        digest = hashlib.sha256(mine.read_text(encoding="utf-8").encode()).hexdigest()
        if digest != manifest.lock.sha256:
            checks.append({"name": "lock", "ok": False, "detail": f"the wheels were downloaded for another "
                           f"{printable(mine.name)} than this checkout's requirements/{printable(mine.name)}",
                           "fix": "carry the same commit of the repository as the bundle, or " + wheel_fix})
    for kind, (folder, what, why) in FOLDERS.items():
        found = sorted(p for p in (bundle / folder).iterdir() if p.is_dir()) if (bundle / folder).is_dir() else []
        if not found:
            checks.append({"name": kind.replace("_", "-"), "ok": False, "detail": f"none in {folder}/ ({why})",
                           "fix": f"{add} {_FLAG[kind]} DIR ({what})"})
        for p in found:
            try:
                checks.append({"name": kind.replace("_", "-"), "ok": True,
                               "detail": f"{folder}/{printable(p.name)}: {check_piece(kind, p)}", "fix": ""})
            except InputError as exc:
                checks.append({"name": kind.replace("_", "-"), "ok": False,
                               "detail": f"{folder}/{printable(p.name)}: {_msg(exc)}",
                               "fix": f"copy it again from a working folder ({add} {_FLAG[kind]} DIR)"})
    asqa = bundle / ASQA
    if not asqa.is_file():
        checks.append({"name": "asqa", "ok": False, "detail": f"no {ASQA} (the official file: train split = the "
                       "official demo pool, dev = the benchmark)", "fix": f"{add} --asqa ASQA.json"})
    else:
        try:
            checks.append({"name": "asqa", "ok": True, "detail": f"{ASQA}: {check_asqa(asqa)}", "fix": ""})
        except InputError as exc:
            checks.append({"name": "asqa", "ok": False, "detail": f"{ASQA}: {_msg(exc)}",
                           "fix": "the official ASQA.json (github.com/google-research/language, asqa)"})
    return checks


EPILOG = """\
examples (docs/getting-started.md#installing-on-an-air-gapped-server):
  make wheelhouse STACK=gpu WHEELS=bundle/wheels        on a connected Linux x86_64 machine, Python 3.11
  clarify offline bundle bundle --lock requirements/gpu.txt --model /models/M --index /indexes/I --asqa ASQA.json
                                                        (with --reader, --cross-encoder, --encoder: a full benchmark)
  clarify offline manifest bundle --lock requirements/gpu.txt   (a bundle copied by hand)
  ... carry the repository and bundle/ to the server ...
  make install-offline STACK=gpu WHEELS=bundle/wheels   on the server: pip reaches no network
  clarify doctor --offline bundle                       every file, piece and installed package
"""


def register(sub) -> None:
    p = sub.add_parser("offline", help="the air-gapped bundle: assemble it, or write its manifest",
                       description=__doc__, epilog=EPILOG)
    inner = p.add_subparsers(dest="offline_command", required=True)
    b = inner.add_parser("bundle", help="check and copy models, indexes, reader, cross-encoder, encoder, ASQA.json "
                                        "and wheels into OUT's layout, then write OUT/manifest.json",
                         description=__doc__, epilog=EPILOG)
    b.add_argument("out", metavar="OUT", help="the bundle folder: new, or one made by make wheelhouse / this command")
    for kind, (folder, what, why) in FOLDERS.items():
        b.add_argument(_FLAG[kind], dest=kind, action="append", type=Path, default=[], metavar="DIR",
                       help=f"{what}, copied to OUT/{folder}/NAME ({why}); repeatable")
    b.add_argument("--asqa", type=Path, metavar="FILE",
                   help=f"the official ASQA.json (train and dev splits), copied to OUT/{ASQA}")
    b.add_argument("--wheels", type=Path, metavar="DIR",
                   help="a wheelhouse (make wheelhouse WHEELS=DIR), copied to OUT/wheels; not needed when "
                        "make wheelhouse wrote OUT/wheels")
    b.add_argument("--lock", default="requirements/cpu.txt",
                   help="the lock the wheels were downloaded from (default requirements/cpu.txt; GPU: requirements/gpu.txt)")
    b.add_argument("--link", action="store_true",
                   help="hard-link files instead of copying them (same file system; else they are copied)")
    b.set_defaults(func=cmd_bundle)
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
    print(f"{printable(Path(args.bundle) / MANIFEST)}: {len(m.files)} files, {m.bytes / 1e9:.2f} GB, lock "
          f"{printable(lock.name)} ({len(m.lock.pins)} pins); on the server: clarify doctor --offline "
          f"{printable(args.bundle)}")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    out = Path(args.out)
    m = assemble(out, {kind: getattr(args, kind) for kind in FOLDERS}, asqa=args.asqa, wheels=args.wheels,
                 lock=Path(args.lock), link=args.link)
    parts = [f"{folder}/ {len([p for p in (out / folder).iterdir() if p.is_dir()])}"
             for folder, _, _ in FOLDERS.values() if (out / folder).is_dir()]
    print(f"{printable(out)}: {', '.join(parts) or 'no folders'}"
          f"{', ' + ASQA if (out / ASQA).is_file() else ''}, {len(m.files)} files, {m.bytes / 1e9:.2f} GB, manifest "
          f"written (lock {printable(m.lock.name)}); on the server: clarify doctor --offline {printable(out)}")
    return 0
