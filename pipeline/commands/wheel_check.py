"""What publish checks in a wheel before anything is uploaded: its manifest records a passed
verification; the manifest's hashes match its artifacts; its RECORD matches every member; and
where the build's report is beside it (the CI hand-off uploads it), the report's hashes match
too. Any difference is an UnverifiedWheelError (exit 15) naming the file."""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..errors import OutputDirError, UnverifiedWheelError
from ..services.wording import as_run
from ..wheel_template.runtime import _integrity as wheel_integrity


def hashed_files(package: str, manifest: dict) -> dict[str, dict]:
    """Every file the manifest records a sha256 and size for, by its path in the wheel (the same
    records the installed wheel checks itself against)."""
    return {f"{package}/{path}": record for path, record in wheel_integrity.packaged_files(manifest).items()}


def _member_sha256(archive: zipfile.ZipFile, name: str) -> tuple[int, bytes]:
    """Size and sha256 of a wheel member, read in blocks (external weights can be several GB)."""
    digest, size = hashlib.sha256(), 0
    with archive.open(name) as member:
        for block in iter(lambda: member.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.digest()


REPORT_HINT = (
    "the wheel or its report was changed after the build: rebuild, or publish the wheel with the "
    "report its build wrote (a report left from another build of the same version does not fit)"
)
ALTERED_HINT = "the wheel was altered after its build: rebuild it"


def built_by(spec: str | None = None) -> str:
    """The build command a hint names, as this run was started (make's, or the tool's own), for the
    model of ``spec`` where it is one of a checkout's (H66: `make publish MODEL=unet` was told `MODEL=<name>`)."""
    path = Path(spec) if spec else None
    model = path.parent.name if path and path.name == "spec.toml" and path.parent.parent.name == "models" else "<name>"
    # the tool's with its --spec: a bare `modelwheel build` is refused (H67, from /)
    return as_run(f"`make build MODEL={model}`", f"`modelwheel build --spec {spec or '<its spec.toml>'}`")


def wheels_there(wheel: Path) -> str:
    """The wheels in the folder of ``wheel`` (a path that is not one), for the hint: a name copied
    from the docs has another machine's tag, or a version typed without its local label; "" where
    the folder holds none."""
    near = sorted(wheel.parent.glob("*.whl")) if wheel.parent.is_dir() else []
    return f"the wheels in {wheel.parent}: {', '.join(p.name for p in near)}" if near else ""


@contextlib.contextmanager
def private_copies(wheels: list[Path]) -> Iterator[list[tuple[Path, Path]]]:
    """(wheel, its copy) for each wheel, copied with the build's report beside it (where there)
    into a folder only this user can read or write (0700), removed afterwards. publish checks
    and uploads the copy: a wheel in a folder another user can write could be swapped between
    the check and the upload, but not its private copy."""
    with tempfile.TemporaryDirectory(prefix="modelwheel-publish-") as folder:
        pairs = []
        for number, wheel in enumerate(wheels):
            place = Path(folder) / str(number)
            report = wheel.parent / ("-".join(wheel.name.split("-")[:2]) + ".report.json")  # <import>-<version>
            try:
                place.mkdir(mode=0o700)
                shutil.copyfile(wheel, place / wheel.name)
                if report.is_file():
                    shutil.copyfile(report, place / report.name)
            except OSError as exc:
                raise OutputDirError(
                    f"cannot copy {exc.filename or wheel} to a private folder ({place}): {exc.strerror}",
                    "free space there, or set TMPDIR to a folder of yours with room",
                ) from None
            pairs.append((wheel, place / wheel.name))
        yield pairs


def read_manifest(path: Path, shown: Path | None = None, *, require_report: bool = False) -> dict:
    """The wheel's manifest, after checking the chain of hashes that ties it to its build: verification
    passed, every file matches the manifest, every member matches the wheel's RECORD (so the manifest
    itself is the one built), and the build's report beside the wheel, if any, matches both.
    ``path`` is read (a private copy); messages name ``shown`` (the wheel the user gave).
    ``require_report``: a wheel without its report beside it is refused (publish's default)."""
    wheel = shown or path
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnverifiedWheelError(f"{wheel}: not a readable wheel: {exc}", "rebuild it") from exc
    with archive:
        names = [n for n in archive.namelist() if n.endswith("/manifest.json") and n.count("/") == 1]
        if not names:
            raise UnverifiedWheelError(
                f"{wheel}: no manifest.json: not a wheel built by this pipeline", f"build it with {built_by()}"
            )
        package = names[0].split("/")[0]
        manifest = _parsed_manifest(wheel, archive, names[0])
        if manifest["verification"].get("passed") is not True:
            raise UnverifiedWheelError(
                f"{wheel}: its manifest does not record a passed verification",
                f"build it with {built_by()}, which verifies",
            )
        # Every member hashed once: the manifest and RECORD checks both read these.
        digests = {
            info.filename: _member_sha256(archive, info.filename) for info in archive.infolist() if not info.is_dir()
        }
        try:
            _check_manifest_hashes(wheel, package, manifest, digests)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # a record of the wrong shape
            raise UnverifiedWheelError(f"{wheel}: {names[0]} is damaged: {exc!r}", ALTERED_HINT) from None
        _check_record(wheel, archive, digests)
        _check_names(wheel, archive, manifest)
    _check_report(path, manifest, wheel, require_report)
    return manifest


# What publish and the checks read from a manifest, and their JSON types.
MANIFEST_KEYS = {
    "import_name": str,
    "dist_name": str,
    "full_version": str,
    "artifacts": dict,
    "golden": dict,
    "verification": dict,
}


def _parsed_manifest(wheel: Path, archive: zipfile.ZipFile, name: str) -> dict:
    """The manifest as JSON with the keys publish reads, or exit 15 naming it (never a traceback)."""
    try:
        manifest = json.loads(archive.read(name))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnverifiedWheelError(f"{wheel}: {name} is not valid JSON: {exc}", ALTERED_HINT) from None
    if not isinstance(manifest, dict):
        raise UnverifiedWheelError(f"{wheel}: {name} is a JSON {type(manifest).__name__}, not a manifest", ALTERED_HINT)
    wrong = [key for key, kind in MANIFEST_KEYS.items() if not isinstance(manifest.get(key), kind)]
    if wrong:
        raise UnverifiedWheelError(
            f"{wheel}: {name} is not a manifest of this pipeline: {', '.join(wrong)} missing or of the wrong type",
            ALTERED_HINT,
        )
    return manifest


def _version(text: str | None) -> object:
    try:
        return Version(text or "")
    except InvalidVersion:
        return text


def _check_names(wheel: Path, archive: zipfile.ZipFile, manifest: dict) -> None:
    """The file's name and version are the ones inside: METADATA's and the manifest's. A renamed
    copy (model_other-..., model_tiny-0.9-...) would take that name and version on the index for
    good, though pip refuses to install it."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UnverifiedWheelError(
            f"{wheel}: not a wheel's file name: {exc}", "publish the file as its build named it"
        ) from None
    metadata = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    if len(metadata) != 1:
        raise UnverifiedWheelError(
            f"{wheel}: {'no' if not metadata else 'more than one'} *.dist-info/METADATA", ALTERED_HINT
        )
    headers = HeaderParser().parsestr(archive.read(metadata[0]).decode("utf-8", "replace"))
    said = {
        "its file name": (name, _version(str(version))),
        f"its METADATA ({metadata[0]})": (canonicalize_name(headers["Name"] or ""), _version(headers["Version"])),
        "its manifest": (canonicalize_name(manifest["dist_name"]), _version(manifest["full_version"])),
    }
    if len(set(said.values())) > 1:
        words = ", ".join(f"{where} says {dist} {ver}" for where, (dist, ver) in said.items())
        raise UnverifiedWheelError(
            f"{wheel}: a renamed wheel: {words}",
            f"publish the file under the name its build gave it ({manifest['import_name']}-"
            f"{manifest['full_version']}-...whl), or rebuild",
        )


def _check_manifest_hashes(wheel: Path, package: str, manifest: dict, digests: dict[str, tuple[int, bytes]]) -> None:
    for name, record in sorted(hashed_files(package, manifest).items()):
        if name not in digests:
            raise UnverifiedWheelError(f"{wheel}: {name} is missing", "rebuild the wheel")
        size, digest = digests[name]
        if size != record["size"] or digest.hex() != record["sha256"]:
            raise UnverifiedWheelError(f"{wheel}: {name} does not match the sha256 in its manifest", ALTERED_HINT)


def _record_hash(digest: bytes) -> str:
    """The wheel spec's form of a hash in RECORD: sha256=, urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _check_record(wheel: Path, archive: zipfile.ZipFile, digests: dict[str, tuple[int, bytes]]) -> None:
    """Every member but RECORD (and its signatures) is listed in RECORD with its own sha256 and
    size, and RECORD lists nothing the wheel lacks. The manifest's hashes alone prove nothing
    when the manifest was rewritten too; the build wrote RECORD over every file, manifest included."""
    records = [name for name in digests if re.fullmatch(r"[^/]+\.dist-info/RECORD", name)]
    if len(records) != 1:
        raise UnverifiedWheelError(
            f"{wheel}: {'no' if not records else 'more than one'} *.dist-info/RECORD",
            f"not a wheel as pip builds them: rebuild it with {built_by()}",
        )
    record = records[0]
    try:
        rows = [row for row in csv.reader(archive.read(record).decode().splitlines()) if row]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UnverifiedWheelError(f"{wheel}: its RECORD ({record}) is unreadable: {exc}", ALTERED_HINT) from exc
    listed = {row[0]: tuple(row[1:3]) for row in rows}
    unlisted_allowed = {record, record + ".jws", record + ".p7s"}  # RECORD's signatures, as the spec allows
    wrong, unlisted = [], []
    for name, (size, digest) in sorted(digests.items()):
        if name in unlisted_allowed:
            continue
        if name not in listed:
            unlisted.append(name)
        elif listed[name] != (_record_hash(digest), str(size)):
            wrong.append(name)
    missing = sorted(set(listed) - set(digests) - unlisted_allowed)
    for names, says in (
        (wrong, "does not match its RECORD entry"),
        (unlisted, "is not listed in its RECORD"),
        (missing, "is listed in its RECORD but not in the wheel"),
    ):
        if names:
            others = f" (and {len(names) - 1} other file(s): {', '.join(names[1:])})" if len(names) > 1 else ""
            raise UnverifiedWheelError(f"{wheel}: {names[0]} {says} ({record}){others}", ALTERED_HINT)


def _check_report(read: Path, manifest: dict, wheel: Path, required: bool) -> None:
    """Where the build's report lies beside the wheel (as `make build` and the CI hand-off leave
    them), the wheel must be the file it describes: its sha256 and size, and the same artifacts.
    ``read`` is the wheel as read (with its report beside it), ``wheel`` as messages name it."""
    name = f"{manifest['import_name']}-{manifest['full_version']}.report.json"
    path = read.parent / name
    if not path.is_file():
        if required:  # without it, a wheel rewritten whole (.so, manifest, RECORD) is consistent
            raise UnverifiedWheelError(
                f"{wheel}: no build report beside it ({wheel.parent / name}): nothing ties this wheel to a build "
                "that verified it",
                "publish the wheel with the report its build wrote beside it (a build leaves "
                "both in dist/; the release workflow carries both), or pass --without-report to publish a wheel built "
                "elsewhere, checked by its RECORD and manifest alone",
            )
        return
    beside = f"{wheel}: the report beside it ({wheel.parent / name})"
    try:
        report = json.loads(path.read_text())
        recorded, artifacts = report["wheel"], report["artifacts"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnverifiedWheelError(f"{beside} cannot be read as a build report: {exc!r}", REPORT_HINT) from exc
    if recorded.get("name") != wheel.name:
        raise UnverifiedWheelError(f"{beside} is for {recorded.get('name')}, not this wheel", REPORT_HINT)
    actual = {"sha256": wheel_integrity.sha256_file(read), "size": read.stat().st_size}
    for key, value in actual.items():
        if recorded.get(key) != value:
            raise UnverifiedWheelError(
                f"{beside} records {key} {recorded.get(key)} for the wheel, the file has {value}", REPORT_HINT
            )
    built = manifest["artifacts"]
    for name in sorted(set(built) | set(artifacts)):
        mine, theirs = built.get(name) or {}, artifacts.get(name) or {}
        for key in ("sha256", "size"):
            if mine.get(key) != theirs.get(key):
                raise UnverifiedWheelError(
                    f"{beside} records {key} {theirs.get(key)} for artifacts/{name}, "
                    f"the wheel's manifest {mine.get(key)}",
                    REPORT_HINT,
                )
