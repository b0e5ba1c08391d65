"""The static scan must never import torch: it is an optional extra, so that pre-commit and CI
installs stay light, and a linter must not run the user's stack."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import FIXTURES, run_cli

SCRIPT = "import torch\ndevice = 'cuda'\nmodel.to(device)\nfor x, y in loader:\n    total += model(x.to(device)).sum().item()\n"


def test_the_command_works_with_torch_made_unimportable(tmp_path: Path):
    poisoned = tmp_path / "poison" / "torch"
    poisoned.mkdir(parents=True)
    (poisoned / "__init__.py").write_text("raise ImportError('loopaudit scan imported torch')\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {"PYTHONPATH": str(tmp_path / "poison")}
    result = run_cli("scan", "train.py", str(FIXTURES), "--output-format", "json", cwd=tmp_path, env=env)
    assert result.returncode == 1, result.err
    assert "imported torch" not in result.err
    assert any(f["filename"] == "train.py" and f["code"] == "LA101" for f in json.loads(result.out))


def test_the_library_leaves_torch_unimported(tmp_path: Path):
    (tmp_path / "train.py").write_text(SCRIPT)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        from loopaudit.commands.cli import main
        sys.argv = ["loopaudit", "scan", {str(tmp_path / "train.py")!r}, "--output-format", "concise"]
        try:
            main()
        except SystemExit as done:
            print("exit", done.code)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip().endswith("exit 1")
    assert "LA101" in result.stdout


def test_run_without_a_usable_torch_says_so(tmp_path: Path):
    poisoned = tmp_path / "poison" / "torch"
    poisoned.mkdir(parents=True)
    (poisoned / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_cli("run", "train.py", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "poison")})
    assert result.returncode == 2
    assert result.err.startswith("loopaudit: error: the dynamic mode needs torch") and result.out == ""
