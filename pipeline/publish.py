"""Stage 5: check wheels and upload them with twine, one index per variant, never overwriting.

The index is, in order: --index URL, $MODELWHEEL_INDEX_URL, the running local index
(`make index`). Wheels go to one index per variant, as PyTorch lays out its own: `cpu`, and
`cu130` (the CUDA version torch was built with) for CUDA wheels. A URL may hold `{target}`, which
becomes the variant; otherwise `/<variant>/` is appended. Credentials come from the environment
(TWINE_USERNAME / TWINE_PASSWORD), the URL's userinfo (everything up to its last @, typed as
it is or percent-encoded) or ~/.pypirc (--repository NAME). A URL's userinfo is taken off before
the URL is used and handed to twine in its environment; no credential appears in output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import proc
from .errors import AlreadyPublishedError, IndexServerError, UnverifiedWheelError, UploadError
from .index import read_state
from .templates import wheel_integrity

INDEX_ENV = "MODELWHEEL_INDEX_URL"
SIMPLE_ENV = "MODELWHEEL_SIMPLE_URL"
# An index's refusal of a second upload of a file: pypiserver answers 409 (400 when the client is
# twine), PyPI 400 "File already exists". twine shows the answer's body only with --verbose, and
# 409 is matched on twine's status line alone: the digits also turn up in ports (http://host:40912/).
# (twine's own --skip-existing would judge this, but twine 6 allows it for PyPI only.)
EXISTS_RE = re.compile(r"\bHTTPError:\s+409\b|already\s+exist", re.I)  # \s+: twine wraps at 80 columns
HREF_RE = re.compile(r'href="([^"#]+)(?:#sha256=([0-9a-f]{64}))?')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    @classmethod
    def from_userinfo(cls, userinfo: str | None) -> Credentials | None:
        if userinfo is None:
            return None
        user, _, password = userinfo.partition(":")
        return cls(urllib.parse.unquote(user), urllib.parse.unquote(password))

    @classmethod
    def from_environment(cls) -> Credentials | None:
        user, password = os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD")
        return cls(user, password) if user and password else None


@dataclass(frozen=True)
class Index:
    upload: str  # may contain {target}; never userinfo (see credentials)
    simple: str | None  # base of the simple API (may contain {target}), for the existence check
    repository: str | None = None  # a ~/.pypirc section instead of a URL
    local: bool = False
    credentials: Credentials | None = field(default=None, repr=False)  # from the upload URL's userinfo
    simple_credentials: Credentials | None = field(default=None, repr=False)  # from the simple URL's userinfo

    def upload_url(self, target: str) -> str:
        return _per_target(self.upload, target)

    def simple_url(self, target: str) -> str | None:
        return None if self.simple is None else _per_target(self.simple, target)


@dataclass(frozen=True)
class Published:
    uploaded: tuple[str, ...]
    existing: tuple[str, ...]


def _per_target(url: str, target: str) -> str:
    return url.format(target=target) if "{target}" in url else url.rstrip("/") + f"/{target}/"


def _without_userinfo(url: str | None) -> tuple[str | None, Credentials | None]:
    if not url:
        return None, None
    proc.add_url_secrets(url)  # a --index URL is in no environment variable redact() reads
    bare, userinfo = proc.split_userinfo(url)
    return bare, Credentials.from_userinfo(userinfo)


def resolve_index(url: str | None, repository: str | None, environ: dict[str, str]) -> Index:
    simple, simple_credentials = _without_userinfo(environ.get(SIMPLE_ENV))
    if repository:
        return Index(upload="", simple=simple, repository=repository, simple_credentials=simple_credentials)
    url, credentials = _without_userinfo(url or environ.get(INDEX_ENV))
    if url:
        if simple is None and "{target}" not in url:
            simple = url.rstrip("/") + "/{target}/simple/"
        return Index(upload=url, simple=simple, credentials=credentials, simple_credentials=simple_credentials or credentials)
    state = read_state()
    if state is None:
        raise IndexServerError(
            "no package index: none given and no local index running",
            f"start the local one with `make index`, or set {INDEX_ENV} (and TWINE_USERNAME/TWINE_PASSWORD) for another",
        )
    return Index(upload=state["url"], simple=state["url"] + "{target}/simple/", local=True)


def hashed_files(package: str, manifest: dict) -> dict[str, dict]:
    """Every file the manifest records a sha256 and size for, by its path in the wheel (the same
    records the installed wheel checks itself against)."""
    return {f"{package}/{path}": record for path, record in wheel_integrity.packaged_files(manifest).items()}


def _member_sha256(archive: zipfile.ZipFile, name: str) -> tuple[int, str]:
    """Size and sha256 of a wheel member, read in blocks (external weights can be several GB)."""
    digest, size = hashlib.sha256(), 0
    with archive.open(name) as member:
        for block in iter(lambda: member.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def read_manifest(wheel: Path) -> dict:
    """The wheel's manifest, after checking that verification passed and every file matches its hash."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnverifiedWheelError(f"{wheel}: not a readable wheel: {exc}", "rebuild it") from exc
    with archive:
        names = [n for n in archive.namelist() if n.endswith("/manifest.json") and n.count("/") == 1]
        if not names:
            raise UnverifiedWheelError(f"{wheel}: no manifest.json: not a wheel built by this pipeline", "build it with `make build`")
        package = names[0].split("/")[0]
        manifest = json.loads(archive.read(names[0]))
        verification = manifest.get("verification") or {}
        if verification.get("passed") is not True:
            raise UnverifiedWheelError(
                f"{wheel}: its manifest does not record a passed verification", "build it with `make build`, which verifies"
            )
        for name, record in sorted(hashed_files(package, manifest).items()):
            try:
                size, digest = _member_sha256(archive, name)
            except KeyError:
                raise UnverifiedWheelError(f"{wheel}: {name} is missing", "rebuild the wheel") from None
            if size != record["size"] or digest != record["sha256"]:
                raise UnverifiedWheelError(
                    f"{wheel}: {name} does not match the sha256 in its manifest", "the wheel was altered after its build: rebuild it"
                )
    return manifest


def on_index(index: Index, target: str, dist_name: str) -> dict[str, str] | None:
    """The files the index has for dist_name, by name -> their URL (with the ``#sha256=`` the
    index gives, if any); None when the index gives no simple page to check."""
    base = index.simple_url(target)
    if base is None:
        return None
    url = base.rstrip("/") + f"/{re.sub(r'[-_.]+', '-', dist_name).lower()}/"
    try:
        page = _get(url, index).decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 or 300 <= exc.code < 400:  # a redirect is the index's fallback: not held here
            return {}
        raise IndexServerError(f"{proc.redact(url)} answered {exc.code}", "check the index URL and credentials") from exc
    return {href.rsplit("/", 1)[-1]: urllib.parse.urljoin(url, href) + (f"#sha256={digest}" if digest else "")
            for href, digest in HREF_RE.findall(page)}


def _get(url: str, index: Index) -> bytes:
    """GET ``url`` from the index (its simple page, or a file); errors the user can act on."""
    try:
        with _NO_REDIRECTS.open(_authorized_request(url, index.simple_credentials), timeout=30) as response:
            return response.read()
    except urllib.error.HTTPError:
        raise
    except OSError as exc:
        raise IndexServerError(f"cannot reach {proc.redact(url)}: {exc}", "is the index running? (`make index`)") from exc
    except ValueError as exc:  # http.client.InvalidURL and urllib's own checks
        raise IndexServerError(f"{proc.redact(url)} is not a usable URL: {proc.redact(str(exc))}",
                               "check the index URL (a password may hold any character; the host follows its last @)") from exc


def published_sha256(index: Index, file_url: str) -> str:
    """The sha256 of a file on the index: from its link's ``#sha256=``, else by downloading it."""
    url, _, fragment = file_url.partition("#")
    if fragment.startswith("sha256="):
        return fragment.removeprefix("sha256=")
    try:
        return hashlib.sha256(_get(url, index)).hexdigest()
    except urllib.error.HTTPError as exc:
        raise IndexServerError(f"{proc.redact(url)} answered {exc.code}", "check the index URL and credentials") from exc


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # surfaces the 3xx as an HTTPError instead of following it


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


def _authorized_request(url: str, credentials: Credentials | None) -> urllib.request.Request:
    """A GET for ``url`` (no userinfo) with Basic auth from the URL's credentials, else TWINE_USERNAME/TWINE_PASSWORD."""
    request = urllib.request.Request(url)
    credentials = credentials or Credentials.from_environment()
    if credentials is not None:
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def _twine(*args: str, what: str, hint: str, env: dict[str, str] | None = None) -> str:
    # twine's console is forced to a terminal and ignores NO_COLOR; its output is captured here
    # and shown in an error message, never on a terminal, so colour codes would only be noise.
    return proc.run([sys.executable, "-m", "twine", "--no-color", *args], error=UploadError, what=what, hint=hint,
                    env={"NO_COLOR": "1", **(env or {})})


def _upload(index: Index, wheel: Path, target: str) -> bool:
    """Upload one wheel; False when the index says it already has it."""
    where = ["--repository", index.repository.format(target=target)] if index.repository else ["--repository-url", index.upload_url(target)]
    # The local index takes anonymous uploads; twine still wants some credentials to send.
    credentials = Credentials("local", "no-auth") if index.local else index.credentials
    env = {"TWINE_USERNAME": credentials.username, "TWINE_PASSWORD": credentials.password} if credentials else None
    try:
        _twine("upload", "--non-interactive", "--disable-progress-bar", "--verbose", *where, str(wheel),
               what=f"uploading {wheel.name}",
               hint="the output above is the index's answer: check its URL and the credentials", env=env)
    except UploadError as exc:
        if EXISTS_RE.search(exc.message):
            return False
        raise
    return True


def index_variant(manifest: dict[str, Any]) -> str:
    """The per-build index a wheel goes to, as PyTorch's are: ``cpu``, ``cu130``: the variant the
    manifest records (earlier wheels: the first part of the version's local label)."""
    return manifest.get("variant") or manifest["full_version"].partition("+")[2].split(".")[0]


def publish(wheels: list[Path], index: Index, say, *, skip_existing: bool = False) -> Published:
    """``skip_existing``: a wheel the index holds byte for byte counts as published (a re-run
    release); one it holds under the same name with other bytes is refused all the same."""
    manifests = [(wheel, read_manifest(wheel)) for wheel in wheels]
    for wheel, _ in manifests:
        _twine("check", "--strict", str(wheel), what=f"twine check of {wheel.name}",
               hint="the wheel's metadata is incomplete: rebuild it with this pipeline")
    uploaded, existing, identical = [], [], []
    for wheel, manifest in manifests:
        target = index_variant(manifest)
        known = on_index(index, target, manifest["dist_name"])
        if known is not None and wheel.name in known:
            same = skip_existing and published_sha256(index, known[wheel.name]) == wheel_integrity.sha256_file(wheel)
            say(f"    {wheel.name}: already on the index ({target}){', the same file' if same else ''}, left as it is")
            (identical if same else existing).append(wheel.name)
        elif not _upload(index, wheel, target):
            say(f"    {wheel.name}: already on the index ({target}), left as it is")
            existing.append(wheel.name)
        else:
            say(f"    {wheel.name}: uploaded to the {target} index")
            uploaded.append(wheel.name)
    if existing and (skip_existing or not uploaded):
        raise _refusal(existing, uploaded, skip_existing)
    return Published(tuple(uploaded), tuple(existing + identical))


def _refusal(existing: list[str], uploaded: list[str], skip_existing: bool) -> AlreadyPublishedError:
    hint = "an index never replaces a published version: bump model.version in the spec to publish a change"
    if not skip_existing:
        return AlreadyPublishedError(f"{', '.join(existing)} already on the index; nothing uploaded", hint)
    done = f" ({len(uploaded)} other wheel(s) uploaded)" if uploaded else ""
    return AlreadyPublishedError(
        f"{', '.join(existing)} already on the index, but not as the same file: --skip-existing passes only a file "
        f"the index holds byte for byte (same sha256, read from its simple page){done}",
        hint + "; if the index has no simple page, give its URL in MODELWHEEL_SIMPLE_URL so the files can be compared",
    )
