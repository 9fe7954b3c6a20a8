"""Stage 5: check wheels and upload them with twine, one index per variant, never overwriting.

Which index, its credentials and what it holds are index_client.py's (--index URL,
$MODELWHEEL_INDEX_URL or the running local index; plain http to loopback hosts only, unless
--allow-insecure-http; no credential appears in output). Before anything is uploaded, every
wheel's chain of hashes is checked: its RECORD, its manifest, and the build's report where it
lies beside the wheel.
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AlreadyPublishedError, IndexServerError, UploadError
from ..services import proc
from ..services.manifest import read_wheel_manifest, record_only
from ..services.wording import under_make
from ..stages.package import TORCH_INDEX
from ..wheel_template.runtime import _integrity as wheel_integrity
from ..wheel_template.runtime import _targets as wheel_targets
from .index_client import UNREACHABLE_HINT, Index, on_index, one_line, published_file, published_sha256, require_secure
from .wheel_check import private_copies, read_manifest

# An index's refusal of a second upload of a file: pypiserver answers 409 (400 when the client is
# twine), PyPI 400 "File already exists". twine shows the answer's body only with --verbose, and
# 409 is matched on twine's status line alone: the digits also turn up in ports (http://host:40912/).
# (twine's own --skip-existing would judge this, but twine 6 allows it for PyPI only.)
EXISTS_RE = re.compile(r"\bHTTPError:\s+409\b|already\s+exist", re.I)  # \s+: twine wraps at 80 columns
# twine's output when the index never answered (requests' and urllib3's words for a refused, reset,
# unresolvable or silent host). Only trusted where twine shows no HTTP status: an index's own error
# page (a proxy's 502, say) may hold the same words, and is the index answering.
UNREACHABLE_RE = re.compile(
    r"ConnectionError|ConnectTimeout|Max retries exceeded|Connection refused|Connection reset|"
    r"Connection aborted|RemoteDisconnected|NewConnectionError|Name or service not known|"
    r"Temporary failure in name resolution|timed out"
)
HTTP_STATUS_RE = re.compile(r"\bHTTPError:\s+\d{3}\b")
# twine --non-interactive with no username (or password) from the environment, the URL or a keyring.
NO_CREDENTIAL_RE = re.compile(r"Credential not found for (username|password)")
NO_CREDENTIAL_HINT = (
    "set TWINE_USERNAME and TWINE_PASSWORD (the release workflow reads them from the secrets "
    "MODELWHEEL_INDEX_USERNAME and MODELWHEEL_INDEX_PASSWORD), or give them in the index URL "
    "or a ~/.pypirc --repository"
)


@dataclass(frozen=True)
class Published:
    uploaded: tuple[str, ...]
    existing: tuple[str, ...]


def _twine(*args: str, what: str, hint: str, env: dict[str, str] | None = None) -> str:
    # twine's console is forced to a terminal and ignores NO_COLOR; its output is captured here
    # and shown in an error message, never on a terminal, so colour codes would only be noise.
    return proc.run(
        [sys.executable, "-m", "twine", "--no-color", *args],
        error=UploadError,
        what=what,
        hint=hint,
        env={"NO_COLOR": "1", **(env or {})},
    )


def _unreachable_reason(output: str) -> str | None:
    """Why twine never reached the index, in one line (``[Errno 111] Connection refused``), or None
    when the index answered (an HTTP status in twine's output) or nothing says it was unreachable."""
    if HTTP_STATUS_RE.search(output) or not UNREACHABLE_RE.search(output):
        return None
    # The innermost words: an errno's text, else an exception's quoted reason, else the last line.
    last = [line for line in output.splitlines() if line.strip()][-1]
    for pattern in (r"(\[Errno -?\d+\][^\"')]*)", r"\w+\((?:-?\d+, )?'([^']+)'\)", r"(timed out)"):
        found: list[str] = re.findall(pattern, last)
        if found:
            return found[-1].strip()
    return one_line(last)[-200:]


def install_line(manifest: dict[str, Any], page: str, local: bool) -> str:
    """The pip command that installs the wheel just uploaded: the local index sends pip to
    PyTorch's index for torch itself; another index needs it named beside."""
    torch_index = "" if local else f" --extra-index-url {TORCH_INDEX}/{wheel_targets.variant(manifest)}"
    return f"pip install {manifest['dist_name']}=={manifest['version']} --index-url {page.rstrip('/')}{torch_index}"


def _destination(index: Index, target: str) -> str:
    """Where twine uploads to, for messages: the URL, or the ~/.pypirc section's name."""
    return (
        f"the repository {index.repository.format(target=target)} (~/.pypirc)"
        if index.repository
        else index.upload_url(target)
    )


def _pypirc_url(name: str) -> str | None:
    """The URL twine uploads to for ``--repository name``, read as twine reads it (None when twine
    will refuse the configuration itself, before any connection)."""
    from twine import exceptions, utils  # only here: publish without --repository never needs it

    try:
        return utils.get_repository_from_config("~/.pypirc", name, os.environ.get("TWINE_REPOSITORY_URL"))["repository"]
    except (exceptions.TwineException, KeyError, OSError):
        return None


def check_transport(index: Index, targets: set[str]) -> None:
    """Plain http to a remote host is refused for the repositories of ~/.pypirc too, before any
    connection (the URLs given on the command line were checked by resolve_index)."""
    if not index.repository:
        return
    for target in sorted(targets):
        name = index.repository.format(target=target)
        url = _pypirc_url(name)
        if url:
            require_secure(url, f"the repository {name} in ~/.pypirc,", index.allow_insecure_http)


def _upload(index: Index, wheel: Path, target: str) -> bool:
    """Upload one wheel; False when the index says it already has it."""
    where = (
        ["--repository", index.repository.format(target=target)]
        if index.repository
        else ["--repository-url", index.upload_url(target)]
    )
    credentials = index.credentials  # the local index's: its own upload password (index_auth)
    env = {"TWINE_USERNAME": credentials.username, "TWINE_PASSWORD": credentials.password} if credentials else None
    try:
        _twine(
            "upload",
            "--non-interactive",
            "--disable-progress-bar",
            "--verbose",
            *where,
            str(wheel),
            what=f"uploading {wheel.name}",
            hint="the output above is the index's answer: check its URL and the credentials",
            env=env,
        )
    except UploadError as exc:
        if EXISTS_RE.search(exc.message):
            return False
        reason = _unreachable_reason(exc.message)
        if reason is not None:  # twine's traceback says no more than this, and blames nothing else
            raise IndexServerError(
                f"cannot reach {proc.redact(_destination(index, target))}: {reason}", UNREACHABLE_HINT
            ) from None
        if missing := NO_CREDENTIAL_RE.search(exc.message):  # twine never contacted the index
            raise UploadError(
                f"no {missing[1]} to upload to {proc.redact(_destination(index, target))} with: nothing uploaded",
                NO_CREDENTIAL_HINT,
            ) from None
        raise
    return True


def publish(
    wheels: list[Path],
    index: Index,
    say: Callable[[str], None],
    *,
    skip_existing: bool = False,
    require_report: bool = True,
) -> Published:
    """``skip_existing``: a wheel the index holds byte for byte counts as published (a re-run
    release); one it holds under the same name with other bytes is refused all the same. Each
    wheel is checked and uploaded from one private copy: what was checked is what is sent.
    ``require_report``: each wheel needs the build's report beside it (--without-report: not)."""
    with private_copies(wheels) as copies:
        checked = [(copy, read_manifest(copy, wheel, require_report=require_report)) for wheel, copy in copies]
        return _publish(checked, index, say, skip_existing)


def _publish(
    manifests: list[tuple[Path, dict[str, Any]]], index: Index, say: Callable[[str], None], skip_existing: bool
) -> Published:
    """Every wheel was checked (read_manifest) before any upload."""
    check_transport(index, {wheel_targets.variant(manifest) for _, manifest in manifests})
    for wheel, _ in manifests:
        _twine(
            "check",
            "--strict",
            str(wheel),
            what=f"twine check of {wheel.name}",
            hint="the wheel's metadata is incomplete: rebuild it with this pipeline",
        )
    uploaded: list[str] = []
    held: dict[str, _Held] = {}  # the wheels the index holds already, by name
    for wheel, manifest in manifests:
        target = wheel_targets.variant(manifest)
        page = index.simple_url(target)
        known = on_index(index, target, manifest["dist_name"])  # None where there is no page
        if known is not None and page is not None and wheel.name in known:
            held[wheel.name] = _held(index, known[wheel.name], page, wheel, manifest, skip_existing)
            say(f"    {wheel.name}: already on the index ({target}){held[wheel.name].said}, left as it is")
        elif not _upload(index, wheel, target):
            say(f"    {wheel.name}: already on the index ({target}), left as it is")
            held[wheel.name] = _Held(same=False, alike=False, said="")
        else:
            say(f"    {wheel.name}: uploaded to the {target} index")
            if page is not None:  # what to type next, where the index's pages are known
                say(f"      install it: {install_line(manifest, page, index.local)}")
            uploaded.append(wheel.name)
    passed = [name for name, found in held.items() if found.same and skip_existing]
    refused = {name: found for name, found in held.items() if name not in passed}
    if refused and (skip_existing or not uploaded):
        raise _refusal(refused, uploaded, skip_existing)
    return Published(tuple(uploaded), tuple([*refused, *passed]))


def _their_sha256(file_url: str, fetch: Callable[[], bytes], needed: bool) -> str | None:
    """The index's file's sha256, to say whether it is this wheel; where only said (not --skip-existing),
    an index that cannot tell leaves it unsaid (H53: "already on the index" after dist/'s wheel had
    changed, with no word that the index held another build)."""
    try:
        return published_sha256(file_url, fetch)
    except IndexServerError:
        if needed:
            raise
        return None


@dataclass(frozen=True)
class _Held:
    """What the index holds under a wheel's file name, against the wheel."""

    same: bool  # the same bytes
    alike: bool  # another build of the same model and options (manifests other only in the search's record)
    said: str  # ', the same file', ', another build of it (…)', or '' where the index's sha256 is unknown


def _held(index: Index, file_url: str, page: str, wheel: Path, manifest: dict[str, Any], needed: bool) -> _Held:
    ours = wheel_integrity.sha256_file(wheel)
    # the index's file, downloaded at most once: for its sha256 (where its link has none), then its manifest
    fetch = functools.cache(functools.partial(published_file, index, file_url, page))
    theirs = _their_sha256(file_url, fetch, needed)
    if theirs is None:
        return _Held(False, False, "")
    if theirs == ours:
        return _Held(True, False, ", the same file")
    hashes = f"its sha256 {theirs[:16]}…, this wheel's {ours[:16]}…"
    if _same_model_and_options(fetch, manifest):
        return _Held(
            False,
            True,
            f", another build of the same model and options ({hashes}; they differ only in the search's record)",
        )
    return _Held(False, False, f", another build of it ({hashes})")


def _same_model_and_options(fetch: Callable[[], bytes], manifest: dict[str, Any]) -> bool:
    """Whether the index's file is another build of this wheel's model with the same options chosen,
    the two manifests other only in the search's record: nothing to publish, so no "bump the version"
    (H54: a rebuild whose search timed other candidates). False where the file cannot be read."""
    try:
        theirs = read_wheel_manifest(io.BytesIO(fetch()))
    except IndexServerError:
        return False
    return theirs is not None and record_only(theirs, manifest)


def _refusal(refused: dict[str, _Held], uploaded: list[str], skip_existing: bool) -> AlreadyPublishedError:
    names = ", ".join(refused)
    hint = "an index never replaces a published version: bump model.version in the spec to publish a change"
    if any(found.alike for found in refused.values()) and all(f.same or f.alike for f in refused.values()):
        hint = (  # nothing to publish, but not byte for byte
            "the index's wheel is the same model compiled with the same options and serves as well: nothing needs "
            "publishing (bump model.version only for a changed model)"
        )
    if not skip_existing:
        if all(found.same for found in refused.values()):  # nothing to publish: say how a re-run ends 0
            return AlreadyPublishedError(
                f"{names} already on the index, the same file; nothing uploaded",
                f"--skip-existing{' (make publish ARGS=--skip-existing)' if under_make() else ''} passes a wheel "
                "the index holds byte for byte",
            )
        return AlreadyPublishedError(f"{names} already on the index; nothing uploaded", hint)
    done = f" ({len(uploaded)} other wheel(s) uploaded)" if uploaded else ""
    if not any(found.alike for found in refused.values()):
        hint += "; if the index has no simple page, give its URL in MODELWHEEL_SIMPLE_URL so the files can be compared"
    return AlreadyPublishedError(
        f"{names} already on the index, but not as the same file: --skip-existing passes only a file "
        f"the index holds byte for byte (same sha256, read from its simple page){done}",
        hint,
    )
