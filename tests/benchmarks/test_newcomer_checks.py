"""The newcomer benchmark's layout check counts cut cells, not ranges in prose."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from newcomer import layout_checks


def test_a_cut_cell_counts_and_a_range_does_not():
    text = ("  fp32  off  1×1  allo…  12.3…  yes\n"
            "  · error band (single-full): … came at most 9% under (errors -13% … +10%)\n")
    assert layout_checks(text, None)["cut_cells"] == 2
