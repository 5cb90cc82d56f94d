"""Redaction: URL user-info and registered secrets, in text and in plain data, and in the
error lines that export and convert print."""

from pathlib import Path

import httpx
import pytest

from nemo_opd.secrets import redact, redact_text, redact_user_info, register_secret


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("http://user:pw@host:8000/v1", "http://***@host:8000/v1"),
        ("https://token@api.example.org/v1/models", "https://***@api.example.org/v1/models"),
        ("at HTTP://a:b@h/x, and again ftp://c@d/", "at HTTP://***@h/x, and again ftp://***@d/"),
        ("http://host:8000/v1", "http://host:8000/v1"),  # nothing to hide
        ("mail someone@example.org", "mail someone@example.org"),  # not a URL's user-info
        ("http://host/path?q=a@b", "http://host/path?q=a@b"),  # an @ after the host
        # an @ in the password: the user-info ends at the last @ before the path, as httpx reads it
        ("http://alice:p@ss-s3cr3t@host/v1", "http://***@host/v1"),
        ("at https://a:b@c@d@host:8000 and", "at https://***@host:8000 and"),
        ("'http://alice:pa?ss@host/v1'", "'http://***@host/v1'"),  # a ? or # in it too
        # a path library's reading of a URL: the // after the scheme folded into one /
        ("no such folder: http:/alice:s3cr3t@host/tok", "no such folder: http:/***@host/tok"),
    ],
)
def test_url_user_info(text, redacted):
    assert redact_text(text) == redacted


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:p@ss-s3cr3t@host/v1",
        "http://alice:p%40ss@host:8000/v1",
        "https://tok@en@api.example.org/v1/models?x=y@z",
        "http://a:b@c@[::1]:8000/v1",
    ],
)
def test_what_httpx_sends_as_user_info_is_redacted(url):
    sent = httpx.URL(url)
    shown = redact_text(url)
    assert sent.username and sent.username not in shown
    assert not sent.password or sent.password not in shown
    assert shown.startswith(f"{sent.scheme}://***@") and httpx.URL(shown).host == sent.host


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("alice:s3cr3t@host/v1", "***@host/v1"),  # no scheme
        ("http://alice:s3 cr3t@host/v1", "http://***@host/v1"),  # a space in the password
        ("tok3n@host", "***@host"),
        ("host:8000/v1", "host:8000/v1"),
        ("http://alice:pa/ss@host/v1", "http://***@host/v1"),  # a / in the password
    ],
)
def test_a_value_that_may_be_a_url_is_echoed_without_its_user_info(value, shown):
    assert redact_user_info(value) == shown


def test_registered_secrets_are_redacted_wherever_they_appear():
    register_secret("sk-test-0123456789")
    register_secret("ab")  # too short to be told from ordinary text: not registered
    assert redact_text("key sk-test-0123456789 in a message") == "key *** in a message"
    assert redact_text("ab stays") == "ab stays"
    data = {"a": ["x sk-test-0123456789", 3, None], "b": {"url": "http://u:p@h/"}}
    assert redact(data) == {"a": ["x ***", 3, None], "b": {"url": "http://***@h/"}}


TINY = Path(__file__).resolve().parents[2] / "examples" / "configs" / "distillation_tiny.yaml"
URL = "http://alice:s3cr3t@127.0.0.1:9"


def test_export_prints_its_errors_redacted(tmp_path, capsys):
    """A tokenizer named by a URL with user-info that cannot be loaded: the error names it
    without the password."""
    from nemo_opd.export import main

    argv = ["--config", str(TINY), "--checkpoint", str(tmp_path), "-o", str(tmp_path / "out")]
    assert main([*argv, f"policy.tokenizer.name={URL}/tokenizer"]) == 2
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and "http://***@127.0.0.1:9/tokenizer" in err


def test_convert_prints_its_errors_redacted(tmp_path, capsys):
    """A NeMo-RL config whose interpolation inside a URL with user-info cannot resolve."""
    from nemo_opd.convert.__main__ import main

    source = tmp_path / "nemo_rl.yaml"
    source.write_text(f'policy:\n  model_name: "{URL}/${{nothing.here}}"\n')
    assert main(["nemo-rl", str(source), "-o", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and "http://***@127.0.0.1:9/" in err
