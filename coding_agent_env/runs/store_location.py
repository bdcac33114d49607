"""Where a results store lives: a SQLite file (a path) or a PostgreSQL database (a libpq URL).

A PostgreSQL URL may carry a password (`postgresql://user:PASSWORD@host/db`, or `?password=`): the location
keeps it for connecting and shows only a redacted form (`str`, `repr`, error messages), so a location can be
printed or logged anywhere. Parsing needs no driver: a URL is checked here, the driver is loaded only when a
store is opened (`runs.store_postgres`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from coding_agent_env.runs.store_errors import StoreLocationError

__all__ = ["POSTGRES_SCHEMES", "Location", "PostgresLocation", "location_argument", "parse_location", "redact"]

POSTGRES_SCHEMES = ("postgresql", "postgres")
"""The URL schemes libpq accepts."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&]*", re.IGNORECASE)
_HIDDEN = "***"


def redact(url: str) -> str:
    """`url` with its password (in the user info and in a `password=` parameter) replaced by `***`; a text that
    is not `scheme://...` shows its scheme only (where a password would be cannot be told)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.partition(":")[0] + ":" + _HIDDEN
    rest, hash_sep, fragment = rest.partition("#")
    rest, query_sep, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = userinfo.partition(":")[0] + ":" + _HIDDEN + "@" + hosts
    query = _QUERY_PASSWORD.sub(lambda m: m.group(1) + m.group(2) + _HIDDEN, query)
    return f"{scheme}://{netloc}{slash}{path}{query_sep}{query}{hash_sep}{fragment}"


@dataclass(frozen=True)
class PostgresLocation:
    """A PostgreSQL database holding a results store. `url` (the whole libpq URL, password included) is for
    the driver only; `str()` and `repr()` are redacted."""

    url: str = field(repr=False)

    def __post_init__(self) -> None:
        _check_url(self.url)

    def __str__(self) -> str:
        return redact(self.url)

    def __repr__(self) -> str:
        return f"PostgresLocation({redact(self.url)!r})"

    def exists(self) -> bool:
        """Always true: a database server's store is made on first open (a file store may simply not be there
        yet; this one is asked, and a failure to reach it is `StoreUnavailableError` then)."""
        return True

    def secrets(self) -> tuple[str, ...]:
        """The password as written in the URL (raw and decoded): what error texts must never show."""
        found = []
        netloc = urlsplit(self.url).netloc
        userinfo, at, _ = netloc.rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
        found += [value for key, _, value in (pair.partition("=") for pair in urlsplit(self.url).query.split("&"))
                  if key.lower() == "password"]
        return tuple({text for raw in found for text in (raw, unquote(raw)) if text})


Location = Path | PostgresLocation
"""A results store's place: a SQLite file or a PostgreSQL database."""


def parse_location(value: str | Path | PostgresLocation) -> Location:
    """A path (any text without a URL scheme) or a `postgresql://` / `postgres://` URL; `StoreLocationError`
    (redacted) for another scheme or a malformed URL, so `postgresql:...` never becomes a directory."""
    if isinstance(value, (Path, PostgresLocation)):
        return value
    text = value.strip()
    if not text:
        raise StoreLocationError("the results store location is empty")
    match = _SCHEME.match(text)
    if match is None or _WINDOWS_DRIVE.match(text):
        return Path(text)
    if match.group(1).lower() in POSTGRES_SCHEMES:
        return PostgresLocation(text)
    raise StoreLocationError(f"results store {match.group(1)!r}: not a path nor a postgresql:// URL "
                             "(a results store is a SQLite file path or a PostgreSQL URL)")


def location_argument(text: str) -> Location:
    """`parse_location` as an argparse `type=`: its error is argparse's (which would otherwise echo the value,
    password and all)."""
    try:
        return parse_location(text)
    except StoreLocationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_url(url: str) -> None:
    """Raise `StoreLocationError` (naming only the redacted URL) unless `url` is a well-formed libpq URL."""
    shown = redact(url)
    scheme, sep, _ = url.partition("://")
    if scheme.lower() not in POSTGRES_SCHEMES or not sep:
        raise StoreLocationError(f"results store {shown!r}: a PostgreSQL URL starts postgresql:// or postgres://")
    if any(char.isspace() for char in url):
        raise StoreLocationError(f"results store {shown!r}: a URL has no spaces (percent-encode them)")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    for host in filter(None, hosts.split(",")):
        port = host.rpartition("]")[2].rpartition(":")
        if port[1] and not port[2].isdigit():
            raise StoreLocationError(f"results store {shown!r}: the port must be a number")
    try:
        params = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise StoreLocationError(f"results store {shown!r}: its query must be key=value pairs joined by &") from None
    if any(not key for key, _ in params):
        raise StoreLocationError(f"results store {shown!r}: a query parameter has no name")
