"""Where an OpenAI-compatible server is and the credentials it takes
(docs/engines.md#a-running-server-the-openai-backend).

Secrets: the API key is read from the environment variable the config names; user and password in the URL
(`http://user:pass@host/v1`) are sent as HTTP basic auth. Neither is written anywhere: every message about
the server passes through `Server.say` (`errors.redacted`), and the address clarify keeps and shows is the
base URL without its credentials (`split_credentials`).
"""

from __future__ import annotations

import base64
import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

from clarify.errors import InputError, printable, redacted

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`url` without its userinfo, and the (user, password) it held (percent-decoded), or None."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


def api_key(api_key_env: str) -> str | None:
    if not api_key_env:
        return None
    if not _ENV_NAME.match(api_key_env):  # the key itself given by mistake: never echo it
        raise InputError("takes the NAME of an environment variable (letters, digits, _) that holds the key, "
                         "never the key itself", field="model.api_key_env")
    key = os.environ.get(api_key_env)
    if not key:
        raise InputError(f"the environment variable {api_key_env} (the server's API key) is not set",
                         field="model.api_key_env")
    return key


class Server:
    """Where to talk to and how to authenticate: the base URL without credentials, the httpx client
    options that carry them, and the strings no message may show (the key, the password, and the
    basic-auth and bearer forms a server may echo)."""

    def __init__(self, base_url: str, api_key_env: str = ""):
        clean, userinfo = split_credentials(base_url.rstrip("/"))
        self.url = clean.rstrip("/")
        key = api_key(api_key_env)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.auth = None if key else userinfo  # one Authorization header: the key wins over URL credentials
        self.secrets: list[str] = []
        if key:
            self.secrets.append(key)
        if userinfo:
            user, password = userinfo
            self.secrets += [password, base64.b64encode(f"{user}:{password}".encode()).decode()]

    def say(self, text: object) -> str:
        """`text` safe to print or write: credentials redacted, control characters escaped."""
        return printable(redacted(text, self.secrets))

    def client(self, timeout_s: float, connections: int = 1):
        import httpx

        # the per-phase timeouts are a backstop; the deadline that counts is the total one
        # (openai_http.py `exchange`)
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, auth=self.auth, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=connections), follow_redirects=False)
