"""Database URLs: telling one from a directory, and the form of it that errors and logs show."""

from __future__ import annotations

import urllib.parse


def redact(url: str) -> str:
    """``url`` without its password (errors and logs never hold credentials)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "postgresql://(an address that doesn't parse)"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}"
    query = "&".join(p for p in parts.query.split("&")
                     if urllib.parse.unquote(p.partition("=")[0]).lower() != "password")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def is_postgres_url(path: object) -> bool:
    """Whether ``path`` names a PostgreSQL database (a libpq URL) rather than a directory."""
    return isinstance(path, str) and path.startswith(("postgresql://", "postgres://"))


def driver_missing(exc: ImportError) -> ImportError:
    """What opening a database URL raises when psycopg, an optional dependency, isn't installed."""
    return ImportError(f"a postgresql:// store needs psycopg: pip install 'ctxrt[postgres]' ({exc})")
