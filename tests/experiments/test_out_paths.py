"""The experiments' Python entry points resolve ``out`` like the CLI's ``--out``
(:func:`mx_proxy.training.paths.checked_path`): an unknown ``~user``, a link
loop or a file where a folder should be is a ValueError quoting the path, raised
before anything trains or is written."""

import os

import pytest

from mx_proxy.experiments import cell_rates, paper_seeds, unstable_search
from mx_proxy.training.config import Config


def bad_outs(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    return {"~nosuchuser-mxp/x": "no such user", str(file): "is a file", str(loop): "symbolic-link loop",
            str(file / "sub"): "is a file, not a folder"}


def entry_points(out):
    tiny = Config(width=8, depth=1, batch=8, steps=2)
    return {
        "cell_rates.train": lambda: cell_rates.train(tiny, ["fp32"], 1, out=out),
        "unstable_search.progress": lambda: unstable_search.progress(out),
        "unstable_search.search": lambda: unstable_search.search(out, table_path=None, settings=()),
        "paper_seeds.run": lambda: paper_seeds.run(paper_seeds.spec_of(1, arms=("fp32",)), out, committed=None),
    }


def test_every_entry_point_refuses_a_bad_out_before_writing(tmp_path):
    for out, why in bad_outs(tmp_path).items():
        before = sorted(p.name for p in tmp_path.iterdir())
        for name, call in entry_points(out).items():
            with pytest.raises(ValueError, match=why) as e:
                call()
            assert repr(out) in str(e.value) or out in str(e.value), (name, str(e.value))
        assert sorted(p.name for p in tmp_path.iterdir()) == before
