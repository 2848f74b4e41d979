"""The README's first example runs as written, and again and again on the same data directory."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_runner import ROOT, env_for
from tooltrail import LoopDetected

RUNS = 12
"""More than the loop detector's stop threshold (10) allows for one repeated call."""


def first_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert match is not None, "the README has no python example"
    return match.group(1)


def test_the_example_runs_as_written_twice(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(first_example(), encoding="utf-8")
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env_for(tmp_path),  # one data directory: the same SQLite file both times
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "output='hi'" in done.stdout
        assert "turn_end" in done.stdout
    assert (tmp_path / "xdg" / "tooltrail" / "tooltrail.db").is_file()


def example_main(code: str) -> Callable[[], Coroutine[Any, Any, None]]:
    """The example's ``main``, without the ``asyncio.run`` that would start it."""
    body, call = code.rstrip().rsplit("\n", 1)
    assert call == "asyncio.run(main())"
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(body, "README.md", "exec"), namespace)
    main: Callable[[], Coroutine[Any, Any, None]] = namespace["main"]
    return main


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TOOLTRAIL_DATABASE_URL", raising=False)
    return tmp_path / "xdg"


async def test_the_example_runs_more_often_than_the_loop_detector_allows(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = example_main(first_example())
    for _ in range(RUNS):
        await main()
    assert capsys.readouterr().out.count("output='hi'") == RUNS


async def test_with_a_fixed_session_the_same_example_is_stopped(data_dir: Path) -> None:
    # The control: the example as it was (session_id="s1") stops at the 11th run, because
    # the session's loop window outlives each run in the audit database.
    code = first_example()
    fixed, count = re.subn(r'session = f"readme-[^"]*"', 'session = "s1"', code)
    assert count == 1, "the example's session line changed; update this test"
    main = example_main(fixed)
    for _ in range(10):
        await main()
    with pytest.raises(LoopDetected, match=r"echo\(.*\) repeated"):
        await main()
