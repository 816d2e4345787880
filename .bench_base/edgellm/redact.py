"""Secrets hidden in text meant for people (messages, logs, parameters), in one place: every URL's password and
every credential-like ``key=value``, whatever characters the secret holds.

- userinfo: ``scheme://user:secret@host`` shows ``user:***@host``; a userinfo without ``:`` is a user name
  (shown) unless it looks like a token used as one (longer than 16 characters, or holding ``/+=%@``): hidden
  whole. The userinfo runs to the *last* ``@`` of the URL, so a secret holding ``/``, ``+``, ``:`` or ``@`` (AWS
  secret keys hold ``/`` and ``+``) never shows in part. A URL ends at whitespace (a quote in the secret stays in it).
- linear in the text's length whatever it holds (messages may quote a hostile device's output).
- ``unseen``: whether a value (a URL, a path) holds a control or invisible character, which a parser may drop
  silently (``urlsplit`` drops a tab or newline) so that it names another place than it shows: refused where read.
- ``key=value`` pairs after ``?``, ``&``, ``;``, ``,``, whitespace or the start (URL queries, libpq's keyword form,
  an ``Authorization`` header's ``Credential=...``) whose key (percent-decoded) names a credential: password, pwd,
  secret, token, auth, signature, sig, credential, access key, api key (``X-Amz-Signature``, ``X-Amz-Credential``,
  ``X-Amz-Security-Token``, ``AWSAccessKeyId``, ``sslpassword``, ``PGPASSWORD``...).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

HIDDEN = "***"
# a URL is one token (no whitespace: quotes around it or in its password stay in it); its userinfo runs from the
# token's first "://" to its last '@'
_TOKEN = re.compile(r"\S+")
_PLAIN_USER = re.compile(r"[A-Za-z0-9._~-]*")
_LONGEST_USER = 16
_PLACEHOLDERS = {"PASSWORD", "SECRET"}
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|auth|signature|credential|access[_-]?key|api[_-]?key|^sig$",
                         re.IGNORECASE)
# linear on any text (a device's log line may be hostile): a key starts only after a separator, a quoted value is
# bounded
_PAIR = re.compile(r"(?:(?<=[?&;,\s])|^)(?P<key>[^=&;,?#\s'\"]+)(?P<eq>\s*=\s*)"
                   r"(?P<value>'[^']{0,256}'|\"[^\"]{0,256}\"|[^&;,#\s'\"]*)")

# control characters (newlines, tabs, escapes, C1) and the invisible format ones (bidi overrides, zero widths)
_UNSEEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


def unseen(text: str) -> bool:
    """Whether ``text`` holds a control or invisible character."""
    return _UNSEEN.search(text) is not None


def _userinfo(m: re.Match[str]) -> str:
    token = m.group()
    start, at = token.find("://") + 3, token.rfind("@")
    if start < 3 or at < start:
        return token
    user, colon, secret = token[start:at].partition(":")
    if secret in _PLACEHOLDERS:  # a message's own example (USER:PASSWORD@HOST), no secret
        return token
    if not _PLAIN_USER.fullmatch(user) or (not colon and len(user) > _LONGEST_USER):
        return f"{token[:start]}{HIDDEN}{token[at:]}"
    return f"{token[:start]}{user}{colon and ':' + HIDDEN}{token[at:]}"


def _pair(m: re.Match[str]) -> str:
    if not m["value"] or not _SECRET_KEY.search(unquote(m["key"]).replace("+", "")):
        return m.group()
    return f"{m['key']}{m['eq']}{HIDDEN}"


def redact(text: object) -> str:
    """``text`` (made a string) with the secrets of every URL and credential-like pair in it hidden."""
    return _PAIR.sub(_pair, _TOKEN.sub(_userinfo, str(text)))
