"""`cellsched admin files DIR`: writes the admin files (one copy each,
package data in slurm_ext/admin/), refuses to overwrite without --force,
and fails in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from support import ADMIN

from slurm_ext.cli import main
from slurm_ext.cli.admin_cmd import AdminError, admin_files, data_root, write_admin_files

ERROR = "cellsched admin files: error: "


def run(*args: str):
    return CliRunner().invoke(main, ["admin", "files", *args], prog_name="cellsched")


def test_the_package_data_is_the_data_root():
    assert Path(str(data_root())) == ADMIN  # the checkout's, in this editable install
    assert admin_files()[:4] == [
        Path("cellsched.toml"),
        Path("cellsched-controller.service"),
        Path("sim-cluster.toml"),
        Path("job_submit.lua"),
    ]


def test_writes_every_file_and_says_so(tmp_path):
    res = run(str(tmp_path / "new" / "dir"))
    assert res.exit_code == 0, res.output
    files = admin_files()
    assert res.stdout.splitlines() == [f"wrote {tmp_path / 'new' / 'dir' / f}" for f in files]
    for f in files:
        assert (tmp_path / "new" / "dir" / f).read_bytes() == (ADMIN / f).read_bytes()


def test_refuses_to_overwrite_without_force(tmp_path):
    assert run(str(tmp_path)).exit_code == 0
    mine = tmp_path / "cellsched.toml"
    mine.write_text("# my edited config\n")
    (tmp_path / "job_submit.lua").unlink()
    res = run(str(tmp_path))
    assert (res.exit_code, res.stdout) == (2, "")
    assert res.stderr == f"{ERROR}{mine} and {len(admin_files()) - 2} more exist already; --force overwrites them\n"
    assert mine.read_text() == "# my edited config\n" and not (tmp_path / "job_submit.lua").exists()
    res = run("--force", str(tmp_path))
    assert res.exit_code == 0 and mine.read_bytes() == (ADMIN / "cellsched.toml").read_bytes()


def test_one_file_in_the_way(tmp_path):
    (tmp_path / "sim-cluster.toml").write_text("")
    res = run(str(tmp_path))
    assert res.stderr == f"{ERROR}{tmp_path / 'sim-cluster.toml'} exists already; --force overwrites it\n"


def test_force_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.toml"
    outside.write_text("keep me\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "cellsched.toml").symlink_to(outside)
    assert run(str(dest)).exit_code == 2  # a link counts as a file in the way
    assert run("--force", str(dest)).exit_code == 0
    assert outside.read_text() == "keep me\n" and not (dest / "cellsched.toml").is_symlink()


@pytest.mark.parametrize("where", ["d", "d/sub"])
def test_a_destination_that_cannot_be_a_directory_is_one_line(tmp_path, where):
    (tmp_path / "d").write_text("")  # a file: neither it nor anything under it can be the directory
    res = run(str(tmp_path / where))
    assert (res.exit_code, res.stdout) == (2, ""), res.output
    assert res.stderr.startswith(f"{ERROR}{tmp_path / where}") and len(res.stderr.splitlines()) == 1, res.stderr


def test_globs_pick_up_dashboards_and_a_missing_file_is_named(tmp_path):
    for f in (
        "cellsched.toml",
        "cellsched-controller.service",
        "sim-cluster.toml",
        "job_submit.lua",
        "cellsched-failsafe.service",
        "cellsched-failsafe.timer",
    ):
        (tmp_path / f).write_text(f)
    (tmp_path / "grafana").mkdir()
    for name in ("b.json", "a.json", "notes.txt"):
        (tmp_path / "grafana" / name).write_text("{}")
    assert admin_files(tmp_path)[4:] == [
        Path("grafana/a.json"),
        Path("grafana/b.json"),
        Path("cellsched-failsafe.service"),
        Path("cellsched-failsafe.timer"),
    ]
    written = write_admin_files(tmp_path / "out", root=tmp_path)
    assert [p.relative_to(tmp_path / "out") for p in written] == admin_files(tmp_path)
    (tmp_path / "sim-cluster.toml").unlink()
    with pytest.raises(AdminError, match=r"^sim-cluster.toml is missing from "):
        admin_files(tmp_path)
