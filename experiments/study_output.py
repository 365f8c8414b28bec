"""What every study script leaves behind: its figures as OUT.json and its
plot as OUT.png beside it, and a line saying so."""
from __future__ import annotations

import json
from pathlib import Path


def write(out, doc: dict, draw) -> None:
    """Write `doc` (with its run time in doc["seconds"]) to OUT.json and
    call draw(path) to save the plot at OUT.png."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    draw(out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and .png ({doc['seconds']:.0f} s)")
