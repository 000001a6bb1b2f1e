"""The `convgen` command run as a user runs it (a subprocess): exit codes 0/1/2, located messages
and never a traceback; what `build` may touch in --out (only files it wrote, never through a
link, safely when two builds run at once); where it works (the checkout around the current folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec" / "ops.lean"
NO_CHECKOUT = ("convgen build: not inside a convgen checkout (a folder holding pyproject.toml of project 'convgen', "
               "spec/ and generated/, or a folder below one): run inside a convgen checkout, or pass --spec and --out\n")


def convgen(*args: str | Path, cwd: Path = ROOT) -> tuple[int, str, str]:
    result = subprocess.run([sys.executable, "-m", "convgen.generator", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, errors="replace", timeout=120)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result.returncode, result.stdout, result.stderr


def spec_file(tmp_path: Path, text: str | bytes, name: str = "bad.lean") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# What --out may touch.


def test_foreign_files_in_out_are_kept_and_not_extra(tmp_path):
    foreign = {"thesis.tex": b"\\documentclass{article}\n", "sub/data.csv": b"1,2\n", ".git/config": b"[core]\n"}
    for name, data in foreign.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert convgen("build", "--out", tmp_path)[0] == 0
    assert convgen("build", "--out", tmp_path)[1].endswith("(0 updated, 0 added, 0 removed)\n")
    assert convgen("build", "--check", "--out", tmp_path)[0] == 0
    assert {name: (tmp_path / name).read_bytes() for name in foreign} == foreign


def test_a_foreign_file_at_a_generated_path_is_not_replaced(tmp_path):
    (tmp_path / "ops.py").write_text("my own ops\n")
    code, out, err = convgen("build", "--out", tmp_path)
    assert code == 2
    assert err == (f"convgen build: {tmp_path}: not replacing ops.py (not written by convgen); "
                   "move it away or choose another --out\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.py"]  # nothing written
    code, _, err = convgen("build", "--check", "--out", tmp_path)
    assert code == 1 and "  foreign: ops.py (not written by convgen)\n" in err


def test_no_write_through_a_symbolic_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.py").write_text("precious\n")
    out = tmp_path / "out"
    assert convgen("build", "--out", out)[0] == 0
    (out / "ops.py").unlink()
    (out / "ops.py").symlink_to(outside / "precious.py")
    shutil.rmtree(out / "cuda")
    (out / "cuda").symlink_to(outside, target_is_directory=True)
    code, _, err = convgen("build", "--out", out)
    assert code == 2
    assert err.startswith(f"convgen build: {out}: not replacing cuda/avg_pool_r1.cu (cuda is a symbolic link), ")
    assert "ops.py (ops.py is a symbolic link)" in err
    assert tree(outside) == {"precious.py": b"precious\n"}


def test_builds_into_one_folder_at_once_all_succeed(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: convgen("build", "--out", tmp_path), range(8)))
    assert [code for code, _, _ in results] == [0] * 8, [err for _, _, err in results]
    assert convgen("build", "--check", "--out", tmp_path)[0] == 0
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file left behind


# Spec problems: exit 2, a located message, no traceback (convgen() asserts that last one).


@pytest.mark.parametrize("command", ["build", "list"])
def test_a_spec_error_exits_2_with_the_located_message(tmp_path, command):
    bad = spec_file(tmp_path, "def Runtime.Autograd.Cuda.Tape.conv2d {inC : ℕ (t : Tape) : Result (Tape × ℕ)\n")
    out = ("--out", tmp_path / "out") if command == "build" else ()
    code, stdout, err = convgen(command, "--spec", bad, *out)
    assert code == 2 and stdout == ""
    assert err == ("bad.lean:1:51: error: expected ')', got ':'\n"
                   "def Runtime.Autograd.Cuda.Tape.conv2d {inC : ℕ (t : Tape) : Result (Tape × ℕ)\n"
                   + " " * 50 + "^\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "message"), [
    pytest.param(b"def T.conv2d\n  : \xc3\xa9\xff", "bad.lean:2:6: error: spec is not UTF-8 text: invalid byte 0xff",
                 id="not_utf8"),
    # The caret is at the 65th level: the declaration is the first.
    pytest.param("def T.f : " + "a × " * 1000 + "a",
                 f"bad.lean:1:{len('def T.f : ' + 'a × ' * 64) + 1}: error: expression nested too deeply "
                 "(more than 64 levels)", id="deep_products"),
    pytest.param("def T.f : " + "∀ (i : T), " * 1000 + "y",
                 f"bad.lean:1:{len('def T.f : ' + '∀ (i : T), ' * 64) + 1}: error: expression nested too deeply "
                 "(more than 64 levels)", id="deep_foralls"),
    pytest.param("def T.f : " + "9" * 100_000, "bad.lean:1:11: error: number too long (more than 20 digits)",
                 id="long_number"),
    pytest.param("def T." + "aB" * 50_000 + " : T", "bad.lean:1:5: error: name too long (more than 200 characters)",
                 id="long_name"),
    pytest.param("", "bad.lean:1:1: error: no op declared in bad.lean: a spec needs at least one 'def' "
                     "(building would leave the tape without ops)", id="empty"),
])
def test_hostile_specs_give_a_located_error(tmp_path, text, message):
    code, _, err = convgen("build", "--spec", spec_file(tmp_path, text), "--out", tmp_path / "out")
    assert code == 2
    assert err.splitlines()[0] == message
    assert len(err) < 1000  # the offending line is quoted in part
    assert not (tmp_path / "out").exists()


def test_an_empty_spec_leaves_generated_alone(tmp_path):
    out = tmp_path / "out"
    assert convgen("build", "--out", out)[0] == 0
    before = tree(out)
    assert convgen("build", "--spec", spec_file(tmp_path, "-- nothing\n"), "--out", out)[0] == 2
    assert tree(out) == before


@pytest.mark.skipif(os.name != "posix", reason="a name with a newline needs a POSIX file system")
def test_a_file_name_cannot_inject_code(tmp_path):
    name = 'x\nimport os; os.system("touch PWNED")\n#.lean'
    spec = spec_file(tmp_path, SPEC.read_text(encoding="utf-8"), name)
    out = tmp_path / "out"
    assert convgen("build", "--spec", spec, "--out", out, cwd=tmp_path)[0] == 0
    first = (out / "ops.py").read_text(encoding="utf-8").splitlines()[0]
    assert first == '# Code generated by convgen from x\\nimport os; os.system("touch PWNED")\\n#.lean; DO NOT EDIT.'
    subprocess.run([sys.executable, str(out / "ops.py")], cwd=tmp_path, capture_output=True)
    assert not (tmp_path / "PWNED").exists()


def test_doc_comments_never_break_the_generated_python(tmp_path):
    text = SPEC.read_text(encoding="utf-8").replace("(no padding). -/", '"no padding" \\ \x00 """ -/', 1)
    assert '"no padding"' in text
    out = tmp_path / "out"
    assert convgen("build", "--spec", spec_file(tmp_path, text, "ops.lean"), "--out", out)[0] == 0
    for path in out.glob("*.py"):
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)


# Exit codes and where build works.


def test_usage_errors_exit_2():
    assert convgen("build", "--no-such-flag")[0] == 2
    assert convgen("build", "--spec", "/no/such/file.lean")[0] == 2


def test_help_documents_the_exit_codes():
    help_text = convgen("build", "--help")[1]
    for line in ("0  built, or up to date (--check)", "1  out of date (--check)",
                 "2  usage error, spec error", "3  internal error"):
        assert line in help_text


def test_outside_a_checkout_build_needs_spec_and_out(tmp_path):
    assert convgen("build", cwd=tmp_path) == (2, "", NO_CHECKOUT)
    assert convgen("build", "--check", "--spec", SPEC, cwd=tmp_path) == (2, "", NO_CHECKOUT)


def test_list_outside_a_checkout_shows_the_installed_spec(tmp_path):
    code, out, _ = convgen("list", cwd=tmp_path)
    assert code == 0 and len(out.splitlines()) == 13


def test_build_works_on_the_checkout_around_the_current_folder(tmp_path):
    """A copy of the checkout is what build reads and writes from inside it (not the installed
    package): its edited spec and templates show as drift, and building fixes its generated/."""
    checkout = tmp_path / "checkout"
    for name in ("spec", "generated", "templates"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", checkout)
    (checkout / "docs").mkdir()
    assert convgen("build", "--check", cwd=checkout / "docs")[0] == 0
    init = checkout / "templates" / "python" / "init.py.j2"
    init.write_text(init.read_text() + "# edited\n")
    spec = checkout / "spec" / "ops.lean"
    spec.write_text(spec.read_text(encoding="utf-8").replace("avgPool2dPad", "avgPool2dPadded"), encoding="utf-8")
    code, _, err = convgen("build", "--check", cwd=checkout / "docs")
    assert code == 1
    assert "  stale: __init__.py" in err and "  stale: ops.py" in err and "run: convgen build\n" in err
    assert convgen("build", cwd=checkout)[0] == 0
    assert "# edited" in (checkout / "generated" / "__init__.py").read_text()
    assert "def avg_pool2d_padded(" in (checkout / "generated" / "ops.py").read_text()
    assert convgen("build", "--check")[0] == 0  # the real checkout is untouched


def test_header_label_is_relative_to_the_checkout_holding_the_spec(tmp_path):
    code, _, _ = convgen("build", "--spec", SPEC, "--out", tmp_path, cwd=tmp_path)
    assert code == 0
    assert (tmp_path / "ops.py").read_text().startswith("# Code generated by convgen from spec/ops.lean; DO NOT EDIT.\n")
