import pytest
from tool_chat import tools_tokenizer


@pytest.fixture(scope="session")
def tool_tokenizer():
    """The tiny tool task's tokenizer (tool_chat.py)."""
    return tools_tokenizer()
