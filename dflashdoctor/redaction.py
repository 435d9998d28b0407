"""Secrets taken out where values enter, so that no report, observations file or event log keeps them.

Values come in three ways: environment variables the env probe reads, the command line of a program
under `run` (and dflashdoctor's own), and text a program produced (an exception's message, its
traceback). Each is redacted on the side that reads it, before it is written anywhere.

A name is secret when one of its parts (split on `-`, `_`, `.`) is, or ends with, key, token, secret,
password, passphrase, auth, credential or cookie: `--wandb-key`, `--apikey`, `authtoken`, `HF_TOKEN`.
`tokens` and `tokenizer` are not (`--max-tokens 512`, `--tokenizer Qwen/Qwen3-8B` are what a reader
of the report needs), nor a key named for the data it sorts (`--sort-key`), nor `--pad-token`. A variable
with a secret name loses its whole value; a command-line option with one loses its value (`--x V`,
`--x=V`), as does `NAME=V` before a command or as a Hydra override. Inside any text: every value a
secret-named variable holds in this process's environment (read at each call, so a variable the
program set after its imports counts), credential headers (`Authorization: Bearer X`, `Cookie: X`,
`X-Api-Key: X`), JWTs, token-shaped words (`hf_...`, `ghp_...`, `sk-...`, `AKIA...`), a URL's userinfo
up to the last `@` before its host, and secret query parameters. Standard library only: the agent
runs it inside the user's program, the probes inside theirs.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
# A name part that is one of these or ends with one is secret (`apikey`, `authtoken`, `oauth`).
_SECRET_WORDS = (
    "key",
    "token",
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "cookie",
)
# ... except a key named for the data it sorts or looks up (`--sort-key length`, `--text-key text`)
# and a token of the vocabulary (`--pad-token "<pad>"`, `--eos-token-id 2`): the report needs those.
_NOT_SECRET_AFTER = {
    "key": frozenset({"sort", "cache", "group", "partition", "primary", "foreign", "dict", "lookup", "index"})
    | {"join", "column", "field", "text", "label", "input", "image", "prompt"},
    "token": frozenset({"pad", "eos", "bos", "unk", "mask", "cls", "sep"}),
}
# A shorter value of a secret-named variable is not looked for in text: such values are switches
# ("1", "true", "false", "offline", "enabled"), and taking them out everywhere would blank ordinary
# words all over a report. A credential is longer: API keys and tokens have 20 characters or more,
# and 8 is the shortest password NIST SP 800-63B lets a person choose.
_MIN_SECRET = 8
# An HF token is `hf_` and 34 letters and digits; `hf_` and a word followed by `_` or by a file
# suffix is a file or a flag (hf_llama_compiled.py, hf_fullgraph.py, --hf_token), which a report keeps.
_TOKEN = re.compile(
    r"\bhf_[A-Za-z0-9]{8,}(?!\w|\.\w)"
    r"|\b(ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|sk-|xox[bpas]-|glpat-)[A-Za-z0-9_\-]{8,}|\bAKIA[0-9A-Z]{16}\b"
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# `Authorization: Bearer X` in a curl -H word, a log line or a dict's repr (`'Cookie': 'a=b'`): the
# value to its closing quote, or to the end of the line; the scheme word stays, it is diagnostic.
_HEADER = re.compile(
    r"(?i)(?<![\w-])(?=[a-z0-9]++(?:-[a-z0-9]++)*+['\"]?[ \t]*:)"  # a name, then a colon: linear time
    r"(?P<head>(?:proxy-)?authorization|(?:set-)?cookie"
    rf"|(?:[a-z0-9]+-)+[a-z0-9]*(?:{'|'.join(_SECRET_WORDS)})(?![a-z0-9])(?:-[a-z0-9]+)*)"
    r"(?P<sep>['\"]?[ \t]*:[ \t]*(?P<q>['\"])?(?:(?:bearer|basic|token|digest|negotiate)[ \t]+)?)"
    r"(?(q)(?:(?!(?P=q))[^\r\n])+|[^\r\n]+)"
)
_WORD_END = re.compile(r"[\s'\"`]")
_AUTHORITY_END = re.compile(r"[/?#]")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]*\]|[^:@]*)(?::[0-9]*)?")
_QUERY = re.compile(r"([?&;]([\w.\-]+)=)([^&;#\s'\"]+)")
_ASSIGNMENT = re.compile(r"^([+~]{0,2}[A-Za-z_][\w.\-]*)=")


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    """A part of the name (`wandb-key`, `AWS_SECRET_ACCESS_KEY`, `logger.api_key`) is or ends with a
    secret word. Cached: the agent asks it of every environment variable each time it redacts."""
    parts = re.split(r"[-_.+~]+", name.lower())
    return any(
        part.endswith(_SECRET_WORDS) and before not in _NOT_SECRET_AFTER.get(part, ())
        for before, part in itertools.pairwise(["", *parts])
    )


def _secret_option(word: str) -> bool:
    """`--hf-token`, `--wandb-key`, `--passphrase`, `--apiKey`; not `--max-tokens` or `--tokenizer`."""
    return word.startswith("-") and len(word) <= 100 and _secret_name(word.lstrip("-"))


def _environment_secrets() -> list[str]:
    """The values of this process's secret-named variables, longest first (a value that holds
    another is taken whole). Read at each call: the program may have set one after importing us."""
    values = {value.strip() for name, value in os.environ.items() if _secret_name(name)}
    return sorted((value for value in values if len(value) >= _MIN_SECRET), key=len, reverse=True)


def _redact_userinfo(text: str) -> str:
    """`scheme://user:password@host` keeps `scheme://<redacted>@host`. A password may hold `/`, `:`
    and `@` unescaped (`s3://AKID:abc/def@bucket`), so after `user:` the userinfo runs to the word's
    last `@`; without a `user:` (`https://host/a@b`, `https://host:8080/a@b`) an `@` past the first
    `/` is the path's. A digits-only password holding `/` looks like a port and is missed. Found by
    each `://`, so a URL inside another's query (`?next=https://u:p@h`) is looked at too."""
    out: list[str] = []
    kept = end = 0  # text[:kept] is in out; end: where the current word ends
    start = text.find("://")
    while start >= 0:
        start += 3
        if start >= end:
            found = _WORD_END.search(text, start)
            end = found.start() if found else len(text)
        rest = text[start:end]
        authority = _AUTHORITY_END.split(rest, maxsplit=1)[0]
        password = ":" in authority and not _HOST_PORT.fullmatch(authority)
        at = (rest if password else authority).rfind("@")
        if at >= 0:
            out += [text[kept:start], REDACTED]
            kept = start + at
        start = text.find("://", max(start, kept))
    return "".join([*out, text[kept:]])


def _query(match: re.Match[str]) -> str:
    """A parameter named like a secret, or a signature (`sig`, `X-Amz-Signature`), loses its value."""
    name = match[2].lower()
    secret = _secret_name(name) or name.endswith(("sig", "signature"))
    return f"{match[1]}{REDACTED}" if secret else match[0]


def _redact(text: str, secrets: Iterable[str]) -> str:
    """The variables' values first, whole: the patterns after them could take a part of one only."""
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _HEADER.sub(rf"\g<head>\g<sep>{REDACTED}", text)
    text = _JWT.sub(REDACTED, text)
    text = _TOKEN.sub(REDACTED, text)
    text = _redact_userinfo(text)
    return _QUERY.sub(_query, text)


def redact_text(text: str) -> str:
    """Any text (an exception's message, a traceback): the values of secret-named variables,
    credential headers, JWTs, token-shaped words, URL credentials and secret query parameters."""
    return _redact(text, _environment_secrets())


def redact_variables(variables: Mapping[str, str]) -> dict[str, str]:
    """Whole values of secret-looking variables; inside any other value, what `redact_text` takes."""
    secrets = _environment_secrets()
    return {
        name: REDACTED if _secret_name(name) or _TOKEN.match(value) else _redact(value, secrets)
        for name, value in variables.items()
    }


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of secret options (`--hf-token X`, `--api-key=X`), of secret
    variables set before the command or as overrides (`HF_TOKEN=X python ...`, `logger.api_key=X`),
    and in every other word what `redact_text` takes (`-H 'Authorization: Bearer X'`, URLs)."""
    secrets = _environment_secrets()
    out: list[str] = []
    value_next = False
    for word in argv:
        if value_next and not word.startswith("--"):  # `--use-auth-token --model x`: a flag, no value
            out.append(REDACTED)
            value_next = False
            continue
        option, equals, _ = word.partition("=")
        assignment = _ASSIGNMENT.match(word)
        secret = _secret_option(option)
        value_next = secret and not equals
        if secret:
            out.append(f"{option}={REDACTED}" if equals else word)
        elif assignment and _secret_name(assignment[1]):
            out.append(f"{assignment[1]}={REDACTED}")
        else:
            out.append(_redact(word, secrets))
    return out
