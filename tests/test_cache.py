"""The persistent cache (cache.py): a cached scan reports exactly what a fresh one does, an edit
anywhere is seen, and a broken or unwritable cache never breaks a scan."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loopaudit.analysis.layout import ProjectLayout
from loopaudit.scan import cache as cache_module
from loopaudit.scan import project_scan
from loopaudit.scan.cache import FOLDER_NAME, ResultCache
from loopaudit.scan.project_scan import analyze_many

from .conftest import loopaudit_command, run_cli
from .test_project import CUDA_TRAINING, OPTIONS, PROJECTS, write_project


def scan(root: Path, cache: ResultCache | None = None, jobs: int = 1) -> list[dict]:
    items = [(str(p), p.relative_to(root).as_posix(), False, OPTIONS) for p in sorted(root.rglob("*.py"))]
    result = analyze_many(items, jobs, cache=cache)
    assert not result.problems
    return [f.to_json() for f in result.findings]


def new_cache(folder: Path) -> ResultCache:
    cache = ResultCache(folder)
    assert cache.prepare() is None
    return cache


def _entries(cache_folder: Path) -> list[Path]:
    """The entry files of a cache folder (below its version folder), not its markers."""
    return [p for p in cache_folder.glob("*/*/*") if p.is_file()]


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_cold_and_warm_scans_report_what_a_scan_without_cache_does(tmp_path, name):
    project = tmp_path / "project"
    write_project(project, PROJECTS[name])
    fresh = scan(project)
    cold = new_cache(tmp_path / "cache")
    assert scan(project, cold) == fresh
    warm = new_cache(tmp_path / "cache")
    assert scan(project, warm) == fresh
    assert warm.hits == 1 and warm.misses == 0  # the whole scan read back as one entry


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_after_an_edit_the_untouched_files_are_read_back_and_the_result_is_fresh(tmp_path, name):
    project = tmp_path / "project"
    write_project(project, PROJECTS[name])
    scan(project, new_cache(tmp_path / "cache"))
    edited = sorted(project.rglob("*.py"))[-1]
    edited.write_text(edited.read_text() + "\nimport torch\nfor x in loader:\n    x.cuda().item()\n")
    cache = new_cache(tmp_path / "cache")
    assert scan(project, cache) == scan(project)
    assert cache.hits >= 1 or len(list(project.rglob("*.py"))) == 1


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_a_comment_added_to_a_module_leaves_the_project_facts_to_be_read_back(tmp_path, name, monkeypatch):
    """The summaries do not change, so neither do the facts derived from them: no round derives them again."""
    project = tmp_path / "project"
    write_project(project, PROJECTS[name])
    scan(project, new_cache(tmp_path / "cache"))
    edited = sorted(project.rglob("*.py"))[-1]
    edited.write_text(edited.read_text() + "\n# a comment\n")
    fresh = scan(project)
    derived = []
    monkeypatch.setattr(
        project_scan, "derive_facts", lambda *args, real=project_scan.derive_facts: derived.append(1) or real(*args)
    )
    cache = new_cache(tmp_path / "cache")
    assert scan(project, cache) == fresh
    assert derived == [] and cache.hits >= 1


def test_facts_read_back_are_checked_against_the_text_of_files_without_a_summary(tmp_path, monkeypatch):
    """A file the prefilter skipped has no summary; what the facts take from it (its imports, its
    classes' methods) is read from its text. Changing that text must not read back the old facts."""
    write_project(
        tmp_path / "p",
        {
            "train.py": "from engine import step\nfor x in loader:\n    step(x)\n",
            "engine.py": "import torch\ndef step(x):\n    x.item()\n",
            "skipped.py": "from engine import step\n",
        },
    )
    paths = sorted(str(p) for p in (tmp_path / "p").glob("*.py"))
    outcomes = {path: ([], [], None, None) for path in paths}  # no summaries: every file's facts come from its text
    derived = []
    monkeypatch.setattr(
        project_scan, "derive_facts", lambda *args, real=project_scan.derive_facts: derived.append(1) or real(*args)
    )

    def facts():
        layout = ProjectLayout(paths)  # a new scan's
        return project_scan._derived_facts(layout, outcomes, new_cache(tmp_path / "cache"))

    first = facts()
    assert facts() == first and len(derived) == 1  # read back
    skipped = tmp_path / "p" / "skipped.py"
    skipped.write_text("from elsewhere import step\nclass A:\n    def forward(self):\n        pass\n")
    assert facts() == project_scan.derive_facts(ProjectLayout(paths), {}) and len(derived) == 3  # derived again


def test_an_edit_in_the_caller_changes_the_findings_of_an_unchanged_callee(tmp_path):
    """metrics.py never changes, but whether its `.item()` runs per step is said by train.py."""
    write_project(
        tmp_path / "p",
        {
            "train.py": """
            import torch
            from metrics import log
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                log(loss)
            """,
            "metrics.py": """
            def log(loss):
                print(loss.item())
            """,
        },
    )
    cache_dir = tmp_path / "cache"
    before = run_cli("scan", str(tmp_path / "p"), "--output-format", "json", "--cache-dir", str(cache_dir))
    assert [(f["filename"].rsplit("/", 1)[-1], f["code"]) for f in json.loads(before.out)] == [("metrics.py", "LA101")]
    train = tmp_path / "p" / "train.py"
    train.write_text(train.read_text().replace("    log(loss)\n", "") + "log(loss)\n")  # once, after training
    after = run_cli("scan", str(tmp_path / "p"), "--output-format", "json", "--cache-dir", str(cache_dir))
    assert json.loads(after.out) == []
    again = run_cli("scan", str(tmp_path / "p"), "--output-format", "json", "--no-cache")
    assert json.loads(again.out) == []


def test_a_repository_marker_added_beside_the_files_changes_the_result(tmp_path):
    """No Python file changes, but a new pyproject.toml splits the scan in two repositories (project.py):
    the whole scan's entry must not be read back."""
    write_project(
        tmp_path / "p",
        {
            "trainer/train.py": CUDA_TRAINING,
            "vision/matcher.py": """
            import torch

            class Matcher(torch.nn.Module):
                def forward(self, x):
                    return x.sum().item()
            """,
        },
    )
    assert [f["code"] for f in scan(tmp_path / "p", new_cache(tmp_path / "cache"))] == ["LA101"]
    (tmp_path / "p" / "vision" / "pyproject.toml").write_text("[project]\nname = 'vision'\n")
    assert scan(tmp_path / "p", new_cache(tmp_path / "cache")) == scan(tmp_path / "p") == []


def test_corrupt_and_truncated_entries_are_misses_never_crashes(tmp_path):
    project = tmp_path / "project"
    write_project(project, PROJECTS["two projects in one scan: each utils.py is the one beside its caller"])
    fresh = scan(project)
    scan(project, new_cache(tmp_path / "cache"))
    entries = _entries(tmp_path / "cache")
    assert entries
    for number, entry in enumerate(entries):
        entry.write_bytes(b"" if number % 2 else b"\x80\x05not json")
    cache = new_cache(tmp_path / "cache")
    assert scan(project, cache) == fresh
    # Every entry was asked for and missed (hits are of what this scan wrote again: the facts of a
    # round whose summaries are those of the round before).
    assert cache.misses >= len(entries)
    assert scan(project, new_cache(tmp_path / "cache")) == fresh  # and the entries were written again


def test_results_are_the_same_across_workers_with_a_cache(tmp_path):
    files = dict(PROJECTS["two projects in one scan: each utils.py is the one beside its caller"])
    files.update({f"filler/m{i}.py": f"import torch\nx{i} = torch.zeros({i})\n" for i in range(14)})
    write_project(tmp_path / "project", files)
    fresh = scan(tmp_path / "project", jobs=1)
    assert scan(tmp_path / "project", new_cache(tmp_path / "a"), jobs=2) == fresh
    assert scan(tmp_path / "project", new_cache(tmp_path / "a"), jobs=1) == fresh


def test_the_default_cache_lives_at_the_project_root_and_ignores_itself(tmp_path):
    write_project(tmp_path, {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"})
    (tmp_path / "pyproject.toml").write_text("[tool.loopaudit]\nselect = ['LA1']\n")
    (tmp_path / "sub").mkdir()
    result = run_cli("scan", "..", cwd=tmp_path / "sub", env={"LOOPAUDIT_CACHE_DIR": ""})
    assert result.returncode == 1, result.err
    folder = tmp_path / FOLDER_NAME
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (folder / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert not (tmp_path / "sub" / FOLDER_NAME).exists()


def test_no_cache_writes_nothing_and_the_environment_variable_moves_it(tmp_path):
    write_project(
        tmp_path / "p", {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"}
    )
    run_cli("scan", "p", "--no-cache", cwd=tmp_path, env={"LOOPAUDIT_CACHE_DIR": ""})
    assert not (tmp_path / FOLDER_NAME).exists()
    run_cli("scan", "p", cwd=tmp_path, env={"LOOPAUDIT_CACHE_DIR": str(tmp_path / "elsewhere")})
    assert not (tmp_path / FOLDER_NAME).exists()
    assert any(p.is_file() for p in (tmp_path / "elsewhere").rglob("*") if p.name not in (".gitignore", "CACHEDIR.TAG"))


def test_an_unusable_cache_folder_is_reported_and_the_scan_goes_on(tmp_path):
    write_project(tmp_path, {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"})
    (tmp_path / "a_file").write_text("not a folder")
    result = run_cli("scan", "train.py", "--output-format", "concise", "--cache-dir", "a_file/cache", cwd=tmp_path)
    assert result.returncode == 1
    assert "train.py:4" in result.out
    assert "cannot use the cache folder" in result.err and "scanning without a cache" in result.err


def test_concurrent_runs_share_a_cache_safely(tmp_path):
    files = dict(PROJECTS["two projects in one scan: each utils.py is the one beside its caller"])
    files.update({f"filler/m{i}.py": f"import torch\nx{i} = torch.zeros({i})\n" for i in range(20)})
    write_project(tmp_path / "p", files)
    command = [*loopaudit_command(), "scan", "p", "--output-format", "json", "--cache-dir", "cache", "--exit-zero"]
    runs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err for _, err in outputs]
    expected = run_cli("scan", "p", "--output-format", "json", "--no-cache", "--exit-zero", cwd=tmp_path).out
    assert all(out.decode() == expected for out, _ in outputs)
    assert not [p for p in (tmp_path / "cache").rglob(".*") if p.name not in (".gitignore",)]  # no temporary files left


def test_entries_of_other_loopaudit_versions_are_removed(tmp_path):
    write_project(
        tmp_path / "p", {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"}
    )
    old = tmp_path / "cache" / "0.0.9-0123456789abcdef" / "ab"
    old.mkdir(parents=True)
    (old / "cdef").write_bytes(b"an entry of an older loopaudit")
    kept = tmp_path / "cache" / "notes"  # not a version folder: not ours to remove
    kept.mkdir()
    cache = new_cache(tmp_path / "cache")
    assert scan(tmp_path / "p", cache) == scan(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == sorted([cache.folder.name, "notes"])


def test_a_crafted_pickle_entry_committed_to_the_repository_runs_no_code(tmp_path):
    """The attack the cache once allowed: a pull request commits `.loopaudit_cache/...` entries that
    unpickle into code. Entries are JSON read into declared types now, so the payload is inert."""
    write_project(tmp_path, {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"})
    fresh = run_cli("scan", ".", "--output-format", "json", "--no-cache", cwd=tmp_path, env={"LOOPAUDIT_CACHE_DIR": ""})
    run_cli("scan", ".", cwd=tmp_path, env={"LOOPAUDIT_CACHE_DIR": ""})
    entries = _entries(tmp_path / FOLDER_NAME)
    assert entries
    marker = tmp_path / "payload-ran"
    payload = f"cos\nsystem\n(Vtouch {marker}\ntR.".encode()  # pickle.loads() of it runs `touch`
    for entry in entries:
        entry.write_bytes(payload)
    again = run_cli("scan", ".", "--output-format", "json", cwd=tmp_path, env={"LOOPAUDIT_CACHE_DIR": ""})
    assert not marker.exists()
    assert (again.returncode, again.out) == (fresh.returncode, fresh.out)


def test_entries_written_with_another_users_key_or_edited_since_are_misses(tmp_path, monkeypatch):
    """An entry is signed with a key kept outside the project: one made elsewhere (a committed cache
    folder) or edited after it was written never stands in for an analysis."""
    project = tmp_path / "project"
    write_project(project, PROJECTS["two projects in one scan: each utils.py is the one beside its caller"])
    fresh = scan(project)
    assert fresh
    monkeypatch.setattr(cache_module, "_SIGNING_KEY", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-user"))
    scan(project, new_cache(tmp_path / "cache"))
    written = {entry: entry.read_bytes() for entry in _entries(tmp_path / "cache")}
    monkeypatch.setattr(cache_module, "_SIGNING_KEY", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "this-user"))
    cache = new_cache(tmp_path / "cache")
    assert scan(project, cache) == fresh
    assert cache.misses >= len(written)
    # Every entry was analysed again and stored under this user's key (a hit may still come from an
    # entry this scan wrote itself: the facts of a round whose summaries are those of the round before).
    assert all(entry.read_bytes() != old for entry, old in written.items())
    # Entries this user signed, then edited to change every finding: the signature no longer fits.
    edited = [entry for entry in _entries(tmp_path / "cache") if b'"LA1' in entry.read_bytes()]
    assert edited
    for entry in edited:
        signature, _, body = entry.read_bytes().partition(b"\n")
        entry.write_bytes(signature + b"\n" + body.replace(b'"LA1', b'"XX1'))
    cache = new_cache(tmp_path / "cache")
    assert scan(project, cache) == fresh
    assert cache.misses >= len(edited)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'["KEY"]',
        b'["another key", [[], [], null, null]]',
        b'["KEY", 7]',
        b'["KEY", [[], [], null]]',
        b'["KEY", [[7], [], null, null]]',
        b'["KEY", [[], ["a problem", 3], null, null]]',
        b'["KEY", [[], [], NaN, null]]',
        b'["KEY", [[], [], null, 1' + b"0" * 5000 + b"]]",
        b'["KEY", ' + b"[" * 100_000 + b"]" * 100_000 + b"]",
        b'["KEY", [[["LA101", "m", "f.py", [1, 1], [1, "one"], "warning", null, null, null, null, null, null, null]], [], null, null]]',
    ],
)
def test_signed_entries_that_do_not_fit_their_type_are_misses(tmp_path, body):
    """Even an entry this user's key signed is read only into the type asked for: anything else
    (wrong shapes, non-finite numbers, huge numbers, deep nesting) is a miss, never a crash."""
    cache = new_cache(tmp_path / "cache")
    key = "ab" + "0" * 38
    entry = cache.folder / key[:2] / key[2:]
    entry.parent.mkdir(parents=True)
    body = body.replace(b"KEY", key.encode())
    entry.write_bytes(cache._sign(body) + b"\n" + body)
    assert cache.get(key, project_scan.Outcome) is None
    assert (cache.hits, cache.misses) == (0, 1)


def test_an_entry_reads_back_as_the_value_that_was_stored(tmp_path):
    cache = new_cache(tmp_path / "cache")
    key = "cd" + "1" * 38
    outcome = ([], ["f.py: ValueError: x"], '{"summary": "as text"}', "digest")
    cache.put(key, outcome, project_scan.Outcome)
    assert cache.get(key, project_scan.Outcome) == outcome
    assert cache.hits == 1


def test_a_missing_or_broken_signing_key_is_reported_and_the_scan_goes_on(tmp_path):
    write_project(tmp_path, {"train.py": "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"})
    (tmp_path / "home-cache").write_text("a file where the key's folder would be")
    env = {"LOOPAUDIT_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path / "home-cache")}
    result = run_cli("scan", "train.py", "--output-format", "concise", cwd=tmp_path, env=env)
    assert result.returncode == 1 and "train.py:4" in result.out
    assert "cannot keep the cache's signing key" in result.err and "scanning without a cache" in result.err
    assert not _entries(tmp_path / FOLDER_NAME)
    (tmp_path / "home-cache").unlink()
    (tmp_path / "home-cache" / "loopaudit").mkdir(parents=True)
    (tmp_path / "home-cache" / "loopaudit" / "cache-key").write_bytes(b"short")
    result = run_cli("scan", "train.py", "--output-format", "concise", cwd=tmp_path, env=env)
    assert result.returncode == 1 and "not a loopaudit key" in result.err
