import sys
from pathlib import Path

import pytest
from tool_chat import tools_tokenizer

# The hostile tools are named as a user names their own, "tests.unit.tools.hostile_tools:Name",
# and imported by the driver (for their schemas) as well as by the tool workers (which have the
# repository root on PYTHONPATH): the driver needs the root too, however pytest was started.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


@pytest.fixture(scope="session")
def tool_tokenizer():
    """The tiny tool task's tokenizer (tool_chat.py)."""
    return tools_tokenizer()
