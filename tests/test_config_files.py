"""The settings read from a repository's YAML configuration files (config_files.py)."""

from __future__ import annotations

from loopaudit.analysis.config_files import config_file_values


def write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_values_most_files_agree_on_are_kept_and_split_ones_dropped(tmp_path):
    write(
        tmp_path,
        {
            "conf/a.yaml": "num_workers: 2\npin_memory: true\nshuffle: true\nlr: 0.001\n",
            "conf/b.yaml": "num_workers: 4  # more\npin_memory: true\nshuffle: false\n",
            "conf/c.yml": "num_workers: 2\npin_memory: true\n",
            "conf/d.yaml": "train:\n  num_workers: 0\n",
            "notes.txt": "num_workers: 7\n",
        },
    )
    values = config_file_values(str(tmp_path))
    # three of four files start workers: the smallest positive count stands
    assert values["num_workers"] == 2
    assert values["pin_memory"] is True
    assert "shuffle" not in values  # one file says true, the other false
    assert "lr" not in values  # only integers and booleans are read


def test_a_key_set_two_ways_in_one_file_is_not_read_from_that_file(tmp_path):
    write(tmp_path, {"config.yaml": "train:\n  drop_last: true\nval:\n  drop_last: false\n"})
    assert "drop_last" not in config_file_values(str(tmp_path))


def test_hidden_and_installed_folders_are_not_read(tmp_path):
    write(
        tmp_path,
        {
            ".github/workflows/ci.yml": "num_workers: 8\n",
            "venv/lib/site-packages/pkg/config.yaml": "num_workers: 8\n",
            "configs/train.yaml": "num_workers: 0\n",
        },
    )
    assert config_file_values(str(tmp_path)) == {"num_workers": 0}
