"""Reading the files a config names (datasets, prompt templates): a missing file, bytes that are
not UTF-8 or content that does not parse stop setup with a SetupError naming the config key, the
file and, where it applies, the line."""

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nemo_opd.errors import SetupError

T = TypeVar("T")


def read_user_file(path: str, key: str, parse: Callable[[Path], T]) -> T:
    """parse(file) for the file at `path` (named by config key `key`). A missing file, or any
    error parse raises (best a ValueError that says where and what to do), becomes a
    SetupError."""
    file = Path(path)
    if not file.is_file():
        raise SetupError(f"{key}: file not found: {file.resolve()}")
    try:
        return parse(file)
    except Exception as error:  # noqa: BLE001 - any failure to parse is the user's file
        raise SetupError(f"{key}: could not read {file}: {error}") from error


def read_utf8(file: Path) -> str:
    """The text of a UTF-8 file. Raises ValueError naming the 1-based line of the first byte that
    is not UTF-8."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"line {line} is not UTF-8 text (byte 0x{data[error.start]:02x}): save the file "
            "as UTF-8"
        ) from None
