"""A user's script run on a rank (hpctrain/workload/script.py) keeps what it made until the rank
leaves, as `python script.py` keeps its globals until the interpreter's teardown: freed at the
script's end, a DDP model whose process group the script destroyed can deadlock in torch's
~Reducer (a suite run's DDP script rank hung there for 900 s)."""

from __future__ import annotations

import builtins
import gc
import sys
from pathlib import Path

import pytest

from hpctrain.workload import script as script_mod

ENDINGS = {
    "falls off its end": "",
    "sys.exit(0)": "sys.exit(0)",
    "sys.exit(3)": "sys.exit(3)",
    "raises": "raise ValueError('bad')",
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_what_the_script_made_outlives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        "import builtins, sys, weakref\n"
        "class Model:\n"
        "    pass\n"
        "model = Model()\n"
        "builtins._hpctrain_probe = weakref.ref(model)\n" + ENDINGS[ending] + "\n"
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(script_mod, "_KEPT", [])
    monkeypatch.setattr(builtins, "_hpctrain_probe", None, raising=False)
    try:
        script_mod._run_as_main(path, [], None, sys.stdout, sys.stderr)
    except (script_mod.ScriptExit, ValueError) as e:
        assert ending in ("sys.exit(3)", "raises"), e
    else:
        assert ending not in ("sys.exit(3)", "raises")
    gc.collect()
    probe = vars(builtins)["_hpctrain_probe"]
    assert probe is not None and probe() is not None  # the model is alive
