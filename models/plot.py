"""PNG plots of miss-ratio curves (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

from cachepilot.models.mrc import PAGE_SIZE


def _pyplot():
    """pyplot on the headless backend, chosen when a plot is drawn rather
    than when this module is imported (the choice is process-wide)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def curve_label(curve) -> str:
    label = f"{curve.policy} ({curve.method}"
    if curve.rate < 1.0:
        label += f", R={curve.rate:.3g}"
    return label + ")"


DASHES = ("-", "--", "-.", ":")


def style(i: int) -> dict:
    """The i-th curve's colour and dash: tab20's twenty colours, each with
    a dash of its own among its neighbours, so no two curves of a plot
    look alike (tab10 gave eleven policies ten colours)."""
    import matplotlib
    return {"color": matplotlib.colormaps["tab20"](i % 20),
            "linestyle": DASHES[(i + i // 20) % len(DASHES)]}


def same_groups(curves, key=lambda c: c.policy):
    """Curves with identical points, grouped: [(first curve, [names of all
    of them])], in the order first seen.  Two policies that behave alike
    on a stream (get_scan without thread rules is lfu) are drawn once."""
    groups: dict = {}
    for c in curves:
        pts = (tuple(map(float, c.sizes)), tuple(map(float, c.miss_ratio)))
        groups.setdefault(pts, (c, []))[1].append(key(c))
    return list(groups.values())


def plot_curves(curves, out, title: str = "", unique: int | None = None) -> Path:
    """One line per curve (policy, method), each its own colour and dash;
    curves with identical points drawn once, named together, with a note;
    x = cache size in pages (log axis when the sizes span more than two
    decades), top axis in MiB."""
    out = Path(out)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    lo, hi = None, None
    groups = same_groups(curves, curve_label)
    for i, (curve, names) in enumerate(groups):
        ax.plot(curve.sizes, curve.miss_ratio, marker="." if len(curve.sizes) < 60 else None,
                linewidth=1.4, label=" = ".join(names), **style(i))
        lo = curve.sizes.min() if lo is None else min(lo, curve.sizes.min())
        hi = curve.sizes.max() if hi is None else max(hi, curve.sizes.max())
    if lo is not None and lo > 0 and hi / lo > 100:
        ax.set_xscale("log")
    if unique:
        ax.axvline(unique, color="grey", linestyle=":", linewidth=1,
                   label=f"unique pages ({unique:,})")
    same = [" and ".join(n) for _, n in groups if len(n) > 1]
    if same:
        fig.text(0.01, 0.01, "identical, drawn once: " + "; ".join(same), fontsize=7)
    ax.set_xlabel("cache size (4 KiB pages)")
    ax.set_ylabel("miss ratio")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    sec = ax.secondary_xaxis("top", functions=(lambda p: p * PAGE_SIZE / 2**20,
                                               lambda m: m * 2**20 / PAGE_SIZE))
    sec.set_xlabel("MiB")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
