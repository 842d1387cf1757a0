"""Passwords out of messages: :func:`redact`, the one function every message that shows a
store URL, a libpq conninfo or a driver's text about a connection goes through.

At the bottom of the package (it imports nothing of it), so the stores use it as well as
``open_store`` and the command line (``harel_store._open.redact`` is this function).
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["SECRET_PARAMETERS", "redact"]

SECRET_PARAMETERS = frozenset({"password", "sslpassword"})  # libpq's secrets
HIDDEN = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']+")
_KEYWORD = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")
_SETTING_IN_TEXT = re.compile(r"(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&\"']+)")
_QUOTED = re.compile(r'"([^"]*)"')
_ENCODED = re.compile(r"[^\s\"']*%[0-9A-Fa-f]{2}[^\s\"']*")
_SHORTEST = 4  # a secret this long is hidden wherever it is; a shorter one in quotes only


def redact(text: str, conninfo: str | None = None) -> str:
    """``text`` as a message may show it, with every password replaced by ``***``.

    ``text`` may be a URL (the password of ``user:password@host``, and the value of a
    ``password`` or ``sslpassword`` query parameter, are hidden), a libpq key=value
    conninfo (the values of ``password`` and ``sslpassword``, quoted or not), or any
    other message: the URLs and ``password=`` settings in it are redacted. With
    ``conninfo``, the URL or key=value string the message may quote (a driver's message
    about a connection made with it), every form of its passwords (as written, and
    percent-decoded or encoded) is hidden too: what libpq quotes is in double quotes, so
    a quoted part holding one is hidden whole, and a password of four characters or
    more wherever it is."""
    if _SCHEME.match(text):
        shown = _redact_url(text)
    elif _KEYWORD.match(text):
        shown = _redact_keywords(text)
    else:
        shown = _SETTING_IN_TEXT.sub(
            rf"\1{HIDDEN}", _URL_IN_TEXT.sub(lambda m: _redact_url(m.group()), text)
        )
    if conninfo:
        forms = _secrets(conninfo)
        if forms:
            shown = _hide(shown, conninfo, forms)
    return shown


def _redact_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    # libpq reads the credentials up to an '@' before the first '/', so a password may
    # hold '?' or '#': hide everything up to the last such '@'. An '@' after a '/' (and
    # before any '?') ends a password that held a '/' libpq never read as one: hidden too.
    userinfo, hosts = _userinfo(rest)
    if userinfo is not None:
        user, colon, _ = userinfo.partition(":")
        if colon:
            rest = f"{user}:{HIDDEN}@{hosts}"
    base, question, query = rest.partition("?")
    if question:
        query = "&".join(_redacted_parameter(p) for p in query.split("&"))
    return f"{scheme}://{base}{question}{query}"


def _userinfo(rest: str) -> tuple[str | None, str]:
    """The credentials of a URL (after ``scheme://``), and what follows their ``@``;
    ``None`` when it has none."""
    head = rest.partition("/")[0]
    if "@" not in head:
        if not head:  # no host: a path (sqlite:////a:b@c.db) or a socket's
            return None, rest
        head = rest.partition("?")[0]
        if "@" not in head:
            return None, rest
    userinfo, _, _ = head.rpartition("@")
    return userinfo, rest[len(userinfo) + 1 :]


def _redacted_parameter(parameter: str) -> str:
    key, equals, _ = parameter.partition("=")
    if equals and urllib.parse.unquote(key).lower() in SECRET_PARAMETERS:
        return f"{key}={HIDDEN}"
    return parameter


def _keywords(text: str) -> list[tuple[str, str, int, int]]:
    """The settings of a key=value conninfo as libpq reads them, leniently: ``(key,
    value, start, end)``, the value as written (quotes included) at ``text[start:end]``.
    The value of a secret key runs on, unquoted, to the next ``key=`` (``password=a b``
    may mean ``a b``); a secret key without ``=`` after it takes all the rest as its
    value (``password secret``)."""
    found: list[tuple[str, str, int, int]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return found
        start = i
        while i < n and not text[i].isspace() and text[i] != "=":
            i += 1
        key = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        if i >= n or text[i] != "=":
            if key.lower() in SECRET_PARAMETERS:
                found.append((key, text[i:], i, n))
                return found
            continue  # libpq refuses the string; read on for a password
        i += 1
        while i < n and text[i].isspace():
            i += 1
        start = i
        if i < n and text[i] == "'":
            i += 1
            while i < n and text[i] != "'":
                i += 2 if text[i] == "\\" else 1
            i = min(i + 1, n)
        else:
            while i < n and not text[i].isspace():
                i += 2 if text[i] == "\\" else 1
            i = min(i, n)
            if key.lower() in SECRET_PARAMETERS:
                # Words without '=' after it: more of the password, as its writer meant it.
                while True:
                    word = re.match(r"\s+([^\s=]+)(?=\s|$)", text[i:])
                    if word is None:
                        break
                    i += word.end()
        found.append((key, text[start:i], start, i))


def _redact_keywords(text: str) -> str:
    shown, last = [], 0
    for key, _, start, end in _keywords(text):
        if key.lower() in SECRET_PARAMETERS:
            shown.append(text[last:start])
            shown.append(HIDDEN if start < end else "")
            last = end
    shown.append(text[last:])
    return "".join(shown)


def _secrets(conninfo: str) -> set[str]:
    """Every form a password of ``conninfo`` may take in a message about it."""
    values: list[str] = []
    if _SCHEME.match(conninfo):
        rest = conninfo.partition("://")[2]
        userinfo, hosts = _userinfo(rest)
        if userinfo is not None and ":" in userinfo:
            password = userinfo.partition(":")[2]
            values.append(password)
            values.append(password.partition("@")[0])  # as libpq reads it: to the first '@'
        query = (hosts if userinfo is not None else rest).partition("?")[2]
        for parameter in query.split("&"):
            key, equals, value = parameter.partition("=")
            if equals and urllib.parse.unquote(key).lower() in SECRET_PARAMETERS:
                values.append(value)
    else:
        for key, value, _, _ in _keywords(conninfo):
            if key.lower() in SECRET_PARAMETERS:
                values.append(value)
                if value.startswith("'"):
                    value = value[1:-1] if value.endswith("'") and len(value) > 1 else value[1:]
                values.append(re.sub(r"\\(.)", r"\1", value))
                values.extend(value.split())  # libpq's reading of password=a b: a, then b
    forms: set[str] = set()
    for value in values:
        decoded = urllib.parse.unquote(value)
        forms.update((value, decoded, urllib.parse.quote(decoded, safe="")))
        # Where libpq may cut a password it misread (a '/' ends the host and port).
        forms.update(re.split(r"[/?#@:,]", value))
    forms.discard("")
    return forms


def _hide(text: str, conninfo: str, forms: set[str]) -> str:
    """``text`` with the conninfo it quotes redacted, each quoted part holding a password
    hidden, and each password of :data:`_SHORTEST` characters or more hidden anywhere."""
    text = text.replace(conninfo, redact(conninfo))

    def quoted(match: re.Match[str]) -> str:
        inside = match.group(1)
        if inside == HIDDEN or not any(form in inside for form in forms):
            return match.group()
        return f'"{HIDDEN}"'

    text = _QUOTED.sub(quoted, text)
    long = sorted((form for form in forms if len(form) >= _SHORTEST), key=len, reverse=True)

    def encoded(match: re.Match[str]) -> str:  # a password percent-encoded another way
        decoded = urllib.parse.unquote(match.group())
        return HIDDEN if any(form in decoded for form in long) else match.group()

    text = _ENCODED.sub(encoded, text)
    for form in long:
        text = text.replace(form, HIDDEN)
    return text
