"""Configuration in pyproject.toml / loopaudit.toml, found by walking up from each scanned file,
driven through the installed command as a user would."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .conftest import FIXTURES, run_cli

# Written for CUDA: LA101 at line 8, LA202 at line 6.
TRAIN = textwrap.dedent("""\
    import torch
    device = "cuda"
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        total = loss.item()
        loss.backward()
        optimizer.step()
""")


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def found(tmp_path: Path, *args: str) -> set[tuple[str, str]]:
    result = run_cli("scan", *args, "--output-format", "json", cwd=tmp_path)
    assert result.returncode in (0, 1), result.err
    return {(f["filename"], f["code"]) for f in json.loads(result.out)}


def test_pyproject_select_ignore_per_file_ignores_and_exclude(tmp_path):
    project(
        tmp_path,
        {
            "pyproject.toml": textwrap.dedent("""\
            [project]
            name = "demo"

            [tool.loopaudit]
            ignore = ["LA202"]
            per-file-ignores = { "tests/*.py" = ["LA1"] }
            extend-exclude = ["legacy/"]
        """),
            "train.py": TRAIN,
            "tests/test_train.py": TRAIN,
            "legacy/old.py": TRAIN,
        },
    )
    assert found(tmp_path) == {("train.py", "LA101")}
    # A file named on the command line is scanned even where a folder walk would skip it.
    assert found(tmp_path, "legacy/old.py") == {("legacy/old.py", "LA101")}
    # Command-line flags win: --select replaces the file's selection, --ignore adds to its own.
    assert found(tmp_path, "train.py", "--select", "LA202") == {("train.py", "LA202")}
    assert found(tmp_path, "train.py", "--ignore", "LA101") == set()
    # --isolated: no configuration at all.
    assert found(tmp_path, "--isolated") >= {("legacy/old.py", "LA202"), ("tests/test_train.py", "LA101")}


def test_the_closest_configuration_wins(tmp_path):
    project(
        tmp_path,
        {
            "pyproject.toml": '[tool.loopaudit]\nselect = ["LA101"]\n',
            "train.py": TRAIN,
            "sub/loopaudit.toml": 'select = ["LA202"]\n',
            "sub/train.py": TRAIN,
            # A pyproject.toml without a [tool.loopaudit] table is passed over.
            "other/pyproject.toml": '[project]\nname = "other"\n',
            "other/train.py": TRAIN,
        },
    )
    assert found(tmp_path) == {("train.py", "LA101"), ("sub/train.py", "LA202"), ("other/train.py", "LA101")}


def test_output_format_from_the_file_and_overridden(tmp_path):
    project(tmp_path, {"loopaudit.toml": 'output-format = "concise"\n', "train.py": TRAIN})
    result = run_cli("scan", cwd=tmp_path)
    assert result.out.splitlines()[0].startswith("train.py:")
    result = run_cli("scan", "--output-format", "json", cwd=tmp_path)
    assert json.loads(result.out)


def test_step_methods_periodic_names_and_device(tmp_path):
    house = textwrap.dedent("""\
        import torch
        class Trainer:
            def fit_batch(self, batch):
                loss = self.model(batch).mean()
                loss.backward()
                self.optimizer.step()
                return loss.item()
    """)
    guarded = textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(4, 2).cuda()
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            optimizer.step()
            if log_now:
                print(loss.item())
    """)
    project(tmp_path, {"house.py": house, "guarded.py": guarded})
    assert ("guarded.py", "LA101") in found(tmp_path, "guarded.py")
    (tmp_path / "loopaudit.toml").write_text(
        'periodic-names = ["log_now"]\nstep-methods = ["fit_batch"]\ndevice = "cuda"\n'
    )
    assert ("guarded.py", "LA101") not in found(tmp_path, "guarded.py")
    assert ("house.py", "LA101") in found(tmp_path, "house.py")
    (tmp_path / "loopaudit.toml").write_text('device = "cpu"\n')
    assert found(tmp_path, "guarded.py") == set()  # nothing waits for a GPU that is not there


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tool.loopaudit]\nselcet = ["LA1"]\n', "[tool.loopaudit] selcet: unknown key"),
        ('[tool.loopaudit]\nselect = "LA1"\n', "[tool.loopaudit] select: must be a list of strings"),
        ('[tool.loopaudit]\nignore = ["LA999"]\n', "[tool.loopaudit] ignore: unknown rule code: LA999"),
        ('[tool.loopaudit]\ndevice = "gpu"\n', "[tool.loopaudit] device: must be one of"),
        ('[tool.loopaudit]\nstep-methods = ["train step"]\n', "step-methods: not Python names"),
        ('[tool.loopaudit]\nper-file-ignores = { "a.py" = ["LA0O1"] }\n', "per-file-ignores.a.py: unknown rule code"),
        ("[tool.loopaudit\n", "not valid TOML"),
        ('[tool.loopaudit]\nexclude = ["\\\\"]\n', "exclude: '\\\\' is not a valid glob"),
        ('[tool.loopaudit]\nselect = [""]\n', 'select: unknown rule code: "" (an empty code)'),
        # tomllib recurses per level: an unrelated table 10,000 arrays deep was a RecursionError.
        ("[tool.other]\nx = " + "[" * 10_000 + "]" * 10_000 + "\n", "not valid TOML: it nests too deeply to read"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "unknown-code",
        "bad-device",
        "bad-name",
        "bad-per-file-code",
        "bad-toml",
        "bad-glob",
        "empty-code",
        "deep-toml",
    ],
)
def test_bad_configuration_is_an_error_with_the_file_and_key(tmp_path, text, message):
    project(tmp_path, {"pyproject.toml": text, "train.py": TRAIN})
    result = run_cli("scan", cwd=tmp_path)
    assert result.returncode == 2 and result.out == ""
    assert result.err.startswith(f"loopaudit: error: {tmp_path / 'pyproject.toml'}: ")
    assert message in result.err


def test_config_command_shows_values_and_where_they_came_from(tmp_path):
    project(tmp_path, {"pyproject.toml": '[tool.loopaudit]\nignore = ["LA202"]\n', "sub/train.py": TRAIN})
    result = run_cli("config", "sub", "--output-format", "json", cwd=tmp_path)
    document = json.loads(result.out)
    assert document["file"] == str(tmp_path / "pyproject.toml")
    assert document["settings"]["ignore"] == {
        "value": ["LA202"],
        "from": f"{tmp_path / 'pyproject.toml'} [tool.loopaudit]",
    }
    assert document["settings"]["device"] == {"value": "auto", "from": "default"}
    text = run_cli("config", cwd=tmp_path).out
    assert "ignore" in text and '["LA202"]' in text and "(default)" in text


def test_an_explicit_config_file_and_a_missing_one(tmp_path):
    project(tmp_path, {"ci.toml": 'select = ["LA202"]\n', "train.py": TRAIN})
    assert found(tmp_path, "--config", "ci.toml") == {("train.py", "LA202")}
    result = run_cli("scan", "--config", "nope.toml", cwd=tmp_path)
    assert result.returncode == 2 and "--config: no such file: nope.toml" in result.err


def test_the_project_s_own_fixtures_scan_the_same_without_configuration():
    # The repository's pyproject.toml has no [tool.loopaudit] table: defaults apply.
    with_config = run_cli("scan", str(FIXTURES), "--output-format", "json", "--exit-zero")
    isolated = run_cli("scan", str(FIXTURES), "--output-format", "json", "--exit-zero", "--isolated")
    assert json.loads(with_config.out) == json.loads(isolated.out)


@pytest.mark.slow
def test_run_and_analyze_follow_the_configuration(tmp_path):
    pytest.importorskip("torch", reason="`loopaudit run` needs torch")
    script = textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(20):
            loss = model(torch.randn(8, 4)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(loss.item())
    """)
    project(tmp_path, {"train.py": script})
    args = ("run", "train.py", "--warmup", "2", "--steps", "4", "--output-format", "json")
    measured = json.loads(run_cli(*args, cwd=tmp_path).out)
    assert [f["code"] for f in measured["findings"]] == ["LA601"]
    (tmp_path / "loopaudit.toml").write_text('ignore = ["LA601"]\n')
    measured = json.loads(run_cli(*args, cwd=tmp_path).out)
    assert measured["findings"] == [] and measured["sync_sites"]  # still measured, not reported
    (tmp_path / "loopaudit.toml").write_text('ignore = "LA601"\n')
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and "ignore: must be a list of strings" in result.err


def test_a_configuration_file_that_is_not_utf8_is_an_error(tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b'[tool.loopaudit]\nselect = ["LA1"]\n# caf\xe9\n')
    (tmp_path / "train.py").write_text(TRAIN)
    result = run_cli("scan", cwd=tmp_path)
    assert result.returncode == 2 and "not UTF-8 text" in result.err


def test_a_gitignore_line_git_would_reject_does_not_stop_the_scan(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("ignored/\n\\\n")
    project(tmp_path, {"train.py": TRAIN, "ignored/train.py": TRAIN})
    assert {name for name, _ in found(tmp_path)} == {"train.py"}


@pytest.mark.parametrize("flags", [["--ignore", ""], ["--select", "LA1,"], ["--select", " "], ["--extend-select", ","]])
def test_an_empty_rule_code_on_the_command_line_is_an_error(tmp_path, flags):
    """Dropped, `--ignore ""` passed as if it ignored something; as a prefix, "" would match every rule."""
    project(tmp_path, {"train.py": TRAIN})
    result = run_cli("scan", "train.py", *flags, cwd=tmp_path)
    assert result.returncode == 2 and result.out == ""
    assert result.err == 'loopaudit: error: unknown rule code: "" (an empty code) (see `loopaudit rules`)\n'
