"""`--plots DIR` of `report` (and of a foreign MLPerf file): a plot that cannot be drawn is a one-line error."""

from pathlib import Path

import pytest

from kv_cache.cli.report_cmd import _draw
from kv_cache.errors import UsageError
from kv_cache.render.plots import PlotsUnavailable


def test_a_plot_that_cannot_be_drawn_is_a_one_line_usage_error(tmp_path):
    def unavailable(source, plots_dir):
        raise PlotsUnavailable("matplotlib is not installed")

    def read_only(source, plots_dir):
        raise PermissionError(13, "Permission denied")

    with pytest.raises(UsageError, match=r"^--plots: matplotlib is not installed$"):
        _draw(unavailable, {}, str(tmp_path))
    with pytest.raises(UsageError, match=rf"^--plots: cannot write to {tmp_path}: Permission denied$"):
        _draw(read_only, {}, str(tmp_path))
    drawn = [tmp_path / "a.png"]
    assert _draw(lambda source, plots_dir: drawn if (source, plots_dir) == ({"k": 1}, str(tmp_path)) else [],
                 {"k": 1}, str(tmp_path)) == drawn
    assert isinstance(drawn[0], Path)
