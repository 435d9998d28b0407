"""redaction.py form by form: what each rule takes (secret options, credential headers, URL userinfo
whose password holds `/`, JWTs, values of secret-named variables) and what a report must keep
(`--max-tokens 512`, `--tokenizer Qwen/Qwen3-8B`, a URL without userinfo, an `@` in a URL's path).
The variables are set in this process's real environment, after the module was imported, as the
program under `run` may set one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dflashdoctor.redaction import REDACTED, redact_argv, redact_text, redact_variables

JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ0cmFpbmVyIn0.dGhpcy1pcy1ub3QtYS1yZWFsLXNpZ25hdHVyZQ"


@contextmanager
def variables(**values: str) -> Iterator[None]:
    """`values` in os.environ for the block, and what was there before restored after it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["--wandb-key", "v1", "--lr", "3e-4"], ["--wandb-key", REDACTED, "--lr", "3e-4"]),
        (["--wandb_key=v1"], [f"--wandb_key={REDACTED}"]),
        (["--passphrase", "correct horse"], ["--passphrase", REDACTED]),
        (["--apikey", "v", "--authtoken", "v"], ["--apikey", REDACTED, "--authtoken", REDACTED]),
        (["--hf_token", "v", "--OAUTH", "v"], ["--hf_token", REDACTED, "--OAUTH", REDACTED]),
        (["--apiKey", "v", "--client-secret", "v"], ["--apiKey", REDACTED, "--client-secret", REDACTED]),
        (["--db-password=v", "--aws-credentials", "v"], [f"--db-password={REDACTED}", "--aws-credentials", REDACTED]),
        (["train.py", "--hf-token"], ["train.py", "--hf-token"]),  # the last word: no value to take
        (["--use-auth-token", "--model", "m"], ["--use-auth-token", "--model", "m"]),  # a flag, not a value
        (
            ["logger.wandb.api_key=v", "+db.password=v"],
            [f"logger.wandb.api_key={REDACTED}", f"+db.password={REDACTED}"],
        ),
    ],
)
def test_a_secret_options_value_is_taken(argv, kept):
    assert redact_argv(argv) == kept


def test_what_a_reader_needs_on_the_command_line_stays():
    argv = [
        *("train.py", "--max-tokens", "512", "--num-tokens", "64", "--tokenizer", "Qwen/Qwen3-8B"),
        *("--tokenizer-name=Qwen/Qwen3-8B", "--sort-key", "length", "--pad-token", "<pad>"),
        *("--eos-token-id", "2", "trainer.max_tokens=512", "TOKENIZERS_PARALLELISM=false"),
        *("--data", "https://huggingface.co/datasets/x", "https://host/a@b", "https://host:8080/a@b"),
    ]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        ("Authorization: Bearer opaque-9c1f", f"Authorization: Bearer {REDACTED}"),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {REDACTED}"),
        ("Proxy-Authorization: Basic dXNlcjpw", f"Proxy-Authorization: Basic {REDACTED}"),
        ("X-Api-Key: 3f9a1c7e", f"X-Api-Key: {REDACTED}"),
        ("cookie: session=abc; csrf=def", f"cookie: {REDACTED}"),
        ("authorization:token abc", f"authorization:token {REDACTED}"),
    ],
)
def test_a_credential_header_in_one_word_of_a_command_line(header, kept):
    assert redact_argv(["curl", "-H", header, "https://api.example/v1"])[2] == kept


def test_a_credential_header_inside_text():
    """In a dict's repr the value ends at its own closing quote (a cookie holds the other quote);
    unquoted, at the end of the line. Other `name: value` text stays."""
    text = (
        "401: {'Authorization': 'Bearer opaque-9c1f', 'Cookie': 'a=\"b\"; c=d', 'Accept': '*/*'}\n"
        "request was: X-Auth-Token: 7d1e2f\n"
        'Cookie: a="b"; c=d\n'
        "KeyError: 'model.layers.0' at max-tokens: 512"
    )
    assert redact_text(text) == (
        f"401: {{'Authorization': 'Bearer {REDACTED}', 'Cookie': '{REDACTED}', 'Accept': '*/*'}}\n"
        f"request was: X-Auth-Token: {REDACTED}\n"
        f"Cookie: {REDACTED}\n"
        "KeyError: 'model.layers.0' at max-tokens: 512"
    )


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("postgres://u:pa/ss+w0rd@host/db", f"postgres://{REDACTED}@host/db"),
        ("s3://AKID:abc/def@bucket/x", f"s3://{REDACTED}@bucket/x"),
        ("https://u:p@ss:w/rd@host:5432/db?x=1", f"https://{REDACTED}@host:5432/db?x=1"),
        ("https://ghtoken123@github.com/o/r.git", f"https://{REDACTED}@github.com/o/r.git"),
        ("https://h/login?next=https://a:b/c@d/e", f"https://h/login?next=https://{REDACTED}@d/e"),
        ("https://h/x?token=t0&a=1&X-Amz-Signature=s1", f"https://h/x?token={REDACTED}&a=1&X-Amz-Signature={REDACTED}"),
    ],
)
def test_a_urls_userinfo_runs_to_the_last_at_before_the_host(url, kept):
    assert redact_text(f"cannot reach {url} (refused)\n") == f"cannot reach {kept} (refused)\n"


@pytest.mark.parametrize(
    "url",
    [
        "https://huggingface.co/Qwen/Qwen3-8B",
        "https://host/a@b",  # no `user:` before the first `/`: the `@` is the path's (npm's /@scope)
        "https://host:8080/a@b",  # a port, not a password
        "git+https://github.com/o/r.git@v1.0",  # pip's ref after the path
        "file:///data/run@3/ckpt",
    ],
)
def test_a_url_without_userinfo_stays(url):
    assert redact_text(f"loading {url} failed") == f"loading {url} failed"


def test_a_jwt_anywhere_in_text():
    text = f"session={JWT}; expired\nid_{JWT} and ({JWT})"
    assert redact_text(text) == f"session={REDACTED}; expired\nid_{REDACTED} and ({REDACTED})"


def test_every_value_of_a_secret_named_variable_is_taken_wherever_it_is():
    wandb, aws = "3f9a1c7e5b2d4a6c8e0f1a3b5c7d9e1f2a4b6c8d", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzq2Ukd8"
    with variables(WANDB_API_KEY=wandb, AWS_SECRET_ACCESS_KEY=aws, DATASET_SERVICE_TOKEN="  late-set-42  "):
        text = f"wandb login {wandb} failed; s3 said {aws}/x; service late-set-42"
        assert redact_text(text) == f"wandb login {REDACTED} failed; s3 said {REDACTED}/x; service {REDACTED}"
        assert redact_argv(["train.py", f"--run=/runs/{wandb}"]) == ["train.py", f"--run=/runs/{REDACTED}"]
        assert redact_variables({"TORCH_MIRROR": f"s3://bucket/{aws}"}) == {"TORCH_MIRROR": f"s3://bucket/{REDACTED}"}


def test_a_short_or_non_secret_named_value_is_not_looked_for():
    """A switch ("1", "true", "offline") in a secret-named variable would blank those words in
    every report; a tokenizer's path is diagnostic, and TOKENIZER_PATH is not a secret name."""
    with variables(HF_HUB_DISABLE_TOKEN="1", WANDB_API_KEY="offline", TOKENIZER_PATH="/models/qwen-tokenizer"):
        text = "step 1 offline true; tokenizer /models/qwen-tokenizer"
        assert redact_text(text) == text
        assert redact_variables({"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "x"}) == {
            "TOKENIZERS_PARALLELISM": "false",
            "HF_TOKEN": REDACTED,
        }


_NAMES = st.sampled_from(["WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "MY_APIKEY"])
# no `<` or `>`: a value holding one could run into the `<redacted>` put beside it; no white space or
# control characters, which redaction strips from a value's ends (`" abcdefg"` is looked for as 7 long)
_CHARACTERS = st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="<>")
_VALUES = st.text(_CHARACTERS, min_size=8)


@given(name=_NAMES, value=_VALUES, before=st.text(), after=st.text())
def test_a_secret_variables_value_quoted_in_any_text_never_survives(name, value, before, after):
    """Set after the import, the value gives way to `<redacted>` wherever it is quoted; only the value
    "redacted" could be read again, inside `<redacted>` itself."""
    assume(value != "redacted")
    with variables(**{name: value}):
        assert value not in redact_text(f"{before}{value}{after}")
