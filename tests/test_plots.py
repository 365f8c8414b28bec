"""Plots a person can read (issue 46, item 5): every curve of a
many-policy plot its own colour and dash, identical curves drawn once
with a note naming both, bands and reference lines in the legend."""
import numpy as np

from cachepilot.models.mrc import MRC
from cachepilot.models.plot import plot_curves, same_groups, style


def curve(policy, ys):
    return MRC(np.array([10, 100, 1000]), np.array(ys, dtype=float), policy, "minisim", 0.01)


def test_eleven_curves_get_eleven_looks():
    looks = {(style(i)["color"], style(i)["linestyle"]) for i in range(11)}
    colours = {style(i)["color"] for i in range(11)}
    assert len(looks) == 11 and len(colours) == 11


def test_identical_curves_are_drawn_once_and_named_together(tmp_path):
    cs = [curve("lfu", [0.9, 0.5, 0.1]), curve("get_scan", [0.9, 0.5, 0.1]),
          curve("lru", [0.9, 0.6, 0.2])]
    groups = same_groups(cs)
    assert [names for _, names in groups] == [["lfu", "get_scan"], ["lru"]]
    import matplotlib.pyplot as plt
    shown = {}
    real = plt.Figure.savefig

    def spy(fig, *a, **k):
        ax = fig.axes[0]
        shown["labels"] = [ln.get_label() for ln in ax.get_lines()]
        shown["texts"] = [t.get_text() for t in fig.texts]
        return real(fig, *a, **k)
    plt.Figure.savefig = spy
    try:
        plot_curves(cs, tmp_path / "c.png", unique=1000)
    finally:
        plt.Figure.savefig = real
    assert shown["labels"][:2] == ["lfu (minisim, R=0.01) = get_scan (minisim, R=0.01)",
                                   "lru (minisim, R=0.01)"]
    assert "unique pages (1,000)" in shown["labels"]
    assert shown["texts"] == ["identical, drawn once: lfu (minisim, R=0.01) and "
                              "get_scan (minisim, R=0.01)"]
    assert (tmp_path / "c.png").stat().st_size > 1000
