"""Redaction: URL user-info and registered secrets, in text and in plain data."""

import pytest

from nemo_opd.config.secrets import redact, redact_text, register_secret


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("http://user:pw@host:8000/v1", "http://***@host:8000/v1"),
        ("https://token@api.example.org/v1/models", "https://***@api.example.org/v1/models"),
        ("at HTTP://a:b@h/x, and again ftp://c@d/", "at HTTP://***@h/x, and again ftp://***@d/"),
        ("http://host:8000/v1", "http://host:8000/v1"),  # nothing to hide
        ("mail someone@example.org", "mail someone@example.org"),  # not a URL's user-info
        ("http://host/path?q=a@b", "http://host/path?q=a@b"),  # an @ after the host
    ],
)
def test_url_user_info(text, redacted):
    assert redact_text(text) == redacted


def test_registered_secrets_are_redacted_wherever_they_appear():
    register_secret("sk-test-0123456789")
    register_secret("ab")  # too short to be told from ordinary text: not registered
    assert redact_text("key sk-test-0123456789 in a message") == "key *** in a message"
    assert redact_text("ab stays") == "ab stays"
    data = {"a": ["x sk-test-0123456789", 3, None], "b": {"url": "http://u:p@h/"}}
    assert redact(data) == {"a": ["x ***", 3, None], "b": {"url": "http://***@h/"}}
