"""What every study and benchmark script leaves behind: its figures as
OUT.json and its plot as OUT.png beside it, and a line saying so."""
from __future__ import annotations

import json
import time
from pathlib import Path

from cachepilot.models.shards import SALT_SEED


def salted_run(rate: float, salts: int, seed: int, started: float, **figures) -> dict:
    """The document of a study over hash salts: its rate, salts and salt
    seed, its figures, and the seconds since `started` (perf_counter)."""
    return {"rate": rate, "salts": salts, "salt_seed": seed, **figures,
            "seconds": time.perf_counter() - started}


def write_salted(args, started: float, draw, **figures) -> None:
    """Write a study over hash salts (args.rate, args.salts, drawn from the
    shipped SALT_SEED) to args.out: salted_run()'s document, by write()."""
    write(args.out, salted_run(args.rate, args.salts, SALT_SEED, started, **figures), draw)


def write(out, doc: dict, draw) -> None:
    """Write `doc` to OUT.json and call draw(path) to save the plot at
    OUT.png; the line says the run time too when doc has it (a study's
    doc["seconds"])."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    draw(out.with_suffix(".png"))
    took = f" ({doc['seconds']:.0f} s)" if "seconds" in doc else ""
    print(f"wrote {out.with_suffix('.json')} and .png{took}")


def save_figure(fig, ax, path, dpi: int = 120) -> None:
    """Finish a study's figure (legend, layout) and save it at `path`."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
