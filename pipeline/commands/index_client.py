"""The index publish uploads to, and what it holds. Which index, in order: --index URL,
$MODELWHEEL_INDEX_URL, the running local index (`make index`). Wheels go to one index per variant,
as PyTorch lays out its own: `cpu`, and `cu130` (the CUDA version torch was built with) for CUDA
wheels. A URL may hold `{target}`, which becomes the variant; otherwise `/<variant>/` is appended.
Credentials come from the environment (TWINE_USERNAME / TWINE_PASSWORD, taken verbatim), the URL's
userinfo (everything up to its last @, percent-decoded once: see Credentials.from_userinfo) or
~/.pypirc (--repository NAME). A URL's userinfo is taken off before the URL is used and handed to
twine in its environment; no credential appears in output. Plain http goes to loopback hosts only,
unless --allow-insecure-http. Its simple pages say which files it holds (on_index), and their sha256.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import ipaddress
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import IndexServerError, UsageError
from ..services import index_auth, proc
from ..services.index import STATE_DIR, read_state

INDEX_ENV = "MODELWHEEL_INDEX_URL"
SIMPLE_ENV = "MODELWHEEL_SIMPLE_URL"
HREF_RE = re.compile(r'href="([^"#]+)(?:#sha256=([0-9a-f]{64}))?')
INSECURE_HINT = "use https, or pass --allow-insecure-http if this network is trusted"
UNREACHABLE_HINT = "is the index running? (`modelwheel index start`, or `make index` in a checkout) / check the URL"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    @classmethod
    def from_userinfo(cls, userinfo: str | None, url: str = "") -> Credentials | None:
        """The user and password of a URL's userinfo (split at its first ``:``), each percent-decoded
        exactly once, as RFC 3986 says and as pip and requests read the same URL: ``%41`` is ``A``,
        a literal ``%`` is written ``%25``. So one URL means the same password here as in
        ``pip install --index-url``. A ``%`` that starts no ``%XX`` escape cannot be one, and is
        kept as typed; escapes that spell no UTF-8 text are refused rather than guessed at."""
        if userinfo is None:
            return None
        user, _, password = userinfo.partition(":")
        return cls(_decoded(user, url), _decoded(password, url))

    @classmethod
    def from_environment(cls) -> Credentials | None:
        user, password = os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD")
        return cls(user, password) if user and password else None


def _decoded(part: str, url: str) -> str:
    try:
        return urllib.parse.unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise UsageError(
            f"the user info of {proc.redact(url)} holds %XX escapes that are not UTF-8 text",
            "user info is percent-decoded once: write each byte of a non-ASCII character as %XX of its UTF-8, "
            "and a literal % as %25",
        ) from None


@dataclass(frozen=True)
class Index:
    upload: str  # may contain {target}; never userinfo (see credentials)
    simple: str | None  # base of the simple API (may contain {target}), for the existence check
    repository: str | None = None  # a ~/.pypirc section instead of a URL
    local: bool = False
    credentials: Credentials | None = field(default=None, repr=False)  # from the upload URL's userinfo
    simple_credentials: Credentials | None = field(default=None, repr=False)  # from the simple URL's userinfo
    allow_insecure_http: bool = False  # --allow-insecure-http: plain http to hosts outside loopback

    def upload_url(self, target: str) -> str:
        return _per_target(self.upload, target)

    def simple_url(self, target: str) -> str | None:
        return None if self.simple is None else _per_target(self.simple, target)


def _per_target(url: str, target: str) -> str:
    return url.format(target=target) if "{target}" in url else url.rstrip("/") + f"/{target}/"


def _without_userinfo(url: str | None) -> tuple[str | None, Credentials | None]:
    if not url:
        return None, None
    proc.add_url_secrets(url)  # a --index URL is in no environment variable redact() reads
    bare, userinfo = proc.split_userinfo(url)
    return bare, Credentials.from_userinfo(userinfo, url)


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 and localhost: traffic that never leaves this machine."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: it may resolve anywhere
        return False


def require_secure(url: str, what: str, allow_insecure_http: bool) -> None:
    """Refuse plain http to a host outside loopback, before any connection: on the way, anyone can
    read the credentials sent with every request and swap the wheels or pages (pip's --trusted-host
    is the same kind of word). The check runs on the URL as given (``{target}`` included): a host
    that is not plainly loopback is treated as remote."""
    parts = urllib.parse.urlsplit(url)
    try:
        host = parts.hostname
    except ValueError:
        host = None
    if parts.scheme.lower() != "http" or allow_insecure_http or is_loopback(host):
        return
    raise UsageError(
        f"{what} {proc.redact(url)} is plain http to a host outside this machine: "
        "credentials and wheels would cross the network unencrypted",
        INSECURE_HINT,
    )


def resolve_index(
    url: str | None, repository: str | None, environ: dict[str, str], *, allow_insecure_http: bool = False
) -> Index:
    simple, simple_credentials = _without_userinfo(environ.get(SIMPLE_ENV))
    if simple:
        require_secure(simple, f"the simple URL (${SIMPLE_ENV})", allow_insecure_http)
    if repository:
        return Index(
            upload="",
            simple=simple,
            repository=repository,
            simple_credentials=simple_credentials,
            allow_insecure_http=allow_insecure_http,
        )
    url, credentials = _without_userinfo(url or environ.get(INDEX_ENV))
    local = _own_local_index(url, simple) if url and not credentials else None
    if local:
        return local
    if url:
        require_secure(url, "the index URL", allow_insecure_http)
        if simple is None and "{target}" not in url:
            simple = url.rstrip("/") + "/{target}/simple/"
        return Index(
            upload=url,
            simple=simple,
            credentials=credentials,
            simple_credentials=simple_credentials or credentials,
            allow_insecure_http=allow_insecure_http,
        )
    state = read_state()
    if state is None:
        raise IndexServerError(
            f"no package index: none given, and no local index started from this folder ({STATE_DIR.resolve()})",
            "start the local one here with `modelwheel index start` (`make index` in a checkout), give its URL with "
            f"--index, or set {INDEX_ENV} (and TWINE_USERNAME/TWINE_PASSWORD) for another",
        )
    local = _own_local_index(state["url"], None)
    if local is None:
        raise IndexServerError(
            f"the local index at {state['url']} is not a process of this user's: its password is not sent there",
            "stop it and start it again: `modelwheel index stop`, `index start`",
        )
    return local


def _own_local_index(url: str, simple: str | None) -> Index | None:
    """``url`` on 127.0.0.1 with a port this user's local index listens on (the kernel says so,
    whatever folder this runs from): that index, with its upload password; else None."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or not port:
        return None  # the password goes to 127.0.0.1 alone, over plain http on this machine
    state_dir = index_auth.index_on_port(port)
    if state_dir is None:
        return None
    password = index_auth.read_secret(state_dir)
    if simple is None and "{target}" not in url:
        simple = url.rstrip("/") + "/{target}/simple/"
    return Index(upload=url, simple=simple, local=True, credentials=Credentials(index_auth.USERNAME, password))


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
        raise IndexServerError(
            f"{proc.redact(url)} answered {exc.code}", "check the index URL and credentials"
        ) from exc
    return {
        href.rsplit("/", 1)[-1]: urllib.parse.urljoin(url, href) + (f"#sha256={digest}" if digest else "")
        for href, digest in HREF_RE.findall(page)
    }


def _get(url: str, index: Index, *, foreign: bool = False) -> bytes:
    """GET ``url`` from the index (its simple page, or a file); errors the user can act on.
    ``foreign``: a URL off the index's own scheme, host and port, fetched without credentials."""
    try:
        with _NO_REDIRECTS.open(
            _authorized_request(url, index.simple_credentials, anonymous=index.local or foreign), timeout=30
        ) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError:
        raise
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, unresolvable, silent, or no HTTP at all
        raise IndexServerError(
            f"cannot reach {proc.redact(url)}: {one_line(str(exc) or type(exc).__name__)}", UNREACHABLE_HINT
        ) from exc
    except ValueError as exc:  # http.client.InvalidURL and urllib's own checks
        raise IndexServerError(
            f"{proc.redact(url)} is not a usable URL: {proc.redact(str(exc))}",
            "check the index URL (a password may hold any character; the host follows its last @)",
        ) from exc


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def published_sha256(file_url: str, fetch: Callable[[], bytes]) -> str:
    """The sha256 of a file on the index: from its link's ``#sha256=``, else of its bytes, as
    ``fetch`` downloads them (published_file)."""
    fragment = file_url.partition("#")[2]
    if fragment.startswith("sha256="):
        return fragment.removeprefix("sha256=")
    return hashlib.sha256(fetch()).hexdigest()


def published_file(index: Index, file_url: str, page_url: str) -> bytes:
    """A file on the index, its bytes. The index's credentials go only to its own scheme, host and
    port (``page_url``'s): a page may link a file anywhere, and a host it names is no one the user
    gave a password to."""
    url = file_url.partition("#")[0]
    foreign = _origin(url) != _origin(page_url)
    if foreign:
        require_secure(url, "the file the index's page links,", index.allow_insecure_http)
    try:
        return _get(url, index, foreign=foreign)
    except urllib.error.HTTPError as exc:
        raise IndexServerError(
            f"{proc.redact(url)} answered {exc.code}", "check the index URL and credentials"
        ) from exc


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # surfaces the 3xx as an HTTPError instead of following it


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


def _authorized_request(url: str, credentials: Credentials | None, anonymous: bool = False) -> urllib.request.Request:
    """A GET for ``url`` (no userinfo) with Basic auth from the URL's credentials, else
    TWINE_USERNAME/TWINE_PASSWORD; ``anonymous`` (the local index, which asks for none to read): neither."""
    request = urllib.request.Request(url)
    if anonymous:
        return request
    credentials = credentials or Credentials.from_environment()
    if credentials is not None:
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def one_line(text: str) -> str:
    return " ".join(text.split())
