"""Secrets taken out where values enter, so that no report, observations file or event log keeps them.

Values come in three ways: environment variables the env probe reads, the command line of a program
under `run` (and dflashdoctor's own), and text a program produced (an exception's message). Each is
redacted on the side that reads it, before it is written anywhere: a variable whose name looks
secret loses its whole value; a command-line option named like a secret loses its value; anywhere
else, token-shaped words (`hf_...`, `ghp_...`, `sk-...`, `AKIA...`), a URL's `user:password@` and
secret-looking query parameters are replaced. Standard library only: the agent and the probes use it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY($|_)|AUTH", re.IGNORECASE)
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "credential", "credentials", "auth", "apikey"})
_SECRET_KEYS = frozenset({"api", "access", "secret", "private"})  # `--api-key`, not `--sort-key`
_TOKEN = re.compile(
    r"\b(hf_|ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|sk-|xox[bpas]-|glpat-)[A-Za-z0-9_\-]{8,}|\bAKIA[0-9A-Z]{16}\b"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@")
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:token|access_token|api_?key|key|secret|password|sig|signature)=)[^&;\s]+")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")


def _secret_option(word: str) -> bool:
    """`--hf-token`, `--hub_token`, `--api-key`, `--password`; not `--max-tokens` or `--sort-key`."""
    if not word.startswith("-") or len(word) > 100:
        return False
    parts = re.split(r"[-_]+", word.lstrip("-").lower())
    keyed = any(a in _SECRET_KEYS and b == "key" for a, b in itertools.pairwise(parts))
    return keyed or any(part in _SECRET_WORDS for part in parts)


def redact_text(text: str) -> str:
    """Token-shaped words, URL credentials and secret query parameters inside any text."""
    text = _TOKEN.sub(REDACTED, text)
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    return _QUERY_SECRET.sub(rf"\1{REDACTED}", text)


def redact_variables(variables: Mapping[str, str]) -> dict[str, str]:
    """Whole values of secret-looking variables; inside any other value, what `redact_text` takes."""
    return {
        name: REDACTED if _SECRET_NAME.search(name) or _TOKEN.match(value) else redact_text(value)
        for name, value in variables.items()
    }


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of secret options (`--hf-token X`, `--api-key=X`), of secret
    variables set before the command (`HF_TOKEN=X python ...`) and every token-shaped word replaced."""
    out: list[str] = []
    secret_next = False
    for word in argv:
        if secret_next:
            out.append(REDACTED)
            secret_next = False
            continue
        option, equals, _ = word.partition("=")
        assignment = _ASSIGNMENT.match(word)
        if _secret_option(option):
            out.append(f"{option}={REDACTED}" if equals else word)
            secret_next = not equals
        elif assignment and _SECRET_NAME.search(assignment.group(1)):
            out.append(f"{assignment.group(1)}={REDACTED}")
        else:
            out.append(redact_text(word))
    return out
