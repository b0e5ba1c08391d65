"""Discovery takes any tree the file system allows: FIFOs, link loops, dangling links and folders it
may not read are passed over and named once; the other files are scanned as usual."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from loopaudit.configuration.discovery import discover

from .conftest import run_cli

TRAINING = "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"


def odd_tree(root: Path) -> None:
    (root / "train.py").write_text(TRAINING)
    (root / "sub").mkdir()
    (root / "sub" / "t2.py").write_text(TRAINING)
    os.mkfifo(root / "fifo.py")
    (root / "a.py").symlink_to("b.py")
    (root / "b.py").symlink_to("a.py")
    (root / "dangling.py").symlink_to("nowhere.py")
    (root / "sub" / "up").symlink_to("..")  # a folder link back up: never followed
    (root / "loop_dir.py").symlink_to("loop_dir.py")


def test_what_is_not_a_readable_file_is_skipped_and_named(tmp_path):
    odd_tree(tmp_path)
    skipped: list[tuple[str, str]] = []
    found = discover([str(tmp_path)], cwd=tmp_path, skipped=skipped)
    assert [f.display for f in found] == ["sub/t2.py", "train.py"]
    why = {Path(path).name: reason for path, reason in skipped}
    assert why["fifo.py"] == "not a regular file: a FIFO"
    assert why["a.py"] == why["b.py"] == why["loop_dir.py"] == os.strerror(errno.ELOOP)
    assert why["dangling.py"] == os.strerror(errno.ENOENT)


def test_a_folder_it_may_not_read_is_skipped_and_named(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(TRAINING)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "t.py").write_text(TRAINING)
    if os.geteuid() == 0:  # root reads any folder: make this one refuse as it would anyone else
        real_scandir, real_stat = os.scandir, os.stat

        def refusing(call):
            def refuse(path, *args, **kwargs):
                if str(path).startswith(str(locked)):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                return call(path, *args, **kwargs)

            return refuse

        monkeypatch.setattr(os, "scandir", refusing(real_scandir))
        monkeypatch.setattr(os, "stat", refusing(real_stat))
    else:
        locked.chmod(0)
    try:
        skipped: list[tuple[str, str]] = []
        found = discover([str(tmp_path)], cwd=tmp_path, skipped=skipped)
    finally:
        locked.chmod(0o755)
    assert [f.display for f in found] == ["train.py"]
    assert skipped == [(str(locked), os.strerror(errno.EACCES))]


def test_the_command_scans_the_rest_and_says_once_what_it_skipped(tmp_path):
    odd_tree(tmp_path)
    result = run_cli("scan", ".", "--output-format", "concise", "--no-cache", cwd=tmp_path)
    assert result.returncode == 1
    assert [line.split(":")[0] for line in result.out.splitlines() if ": LA" in line] == ["sub/t2.py"] * 2 + [
        "train.py"
    ] * 2
    (warning,) = [line for line in result.err.splitlines() if line]
    assert warning.startswith("loopaudit: warning: skipped what cannot be read as a file: ")
    assert f"a.py ({os.strerror(errno.ELOOP)})" in warning and warning.endswith(" and 2 more")  # 5 in all


@pytest.mark.parametrize("name", ["a.py", "dangling.py"])
def test_a_link_loop_or_dangling_link_named_on_the_command_line_is_a_missing_path(tmp_path, name):
    odd_tree(tmp_path)
    result = run_cli("scan", name, "--no-cache", cwd=tmp_path)
    assert result.returncode == 2
    assert f"no such file or folder: {name}" in result.err
