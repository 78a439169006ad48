"""Can readers with a colour-vision deficiency tell the token statuses apart?  A palette check.

The statuses (accepted, rejected, correction, bonus, discarded, pending) are read off the CSS
variables in ``assets/style.css`` (light values on ``:root``, dark values under ``.dark``), simulated
as a protanope, deuteranope and tritanope would see them (Machado, Oliveira & Fernandes 2009,
severity 1.0, applied in linear sRGB), and compared pairwise with CIEDE2000 (ΔE00; about 2 is a
just-noticeable difference, 10+ tells two swatches apart at a glance).  Two swatch sets:

- ``solid``: the border colours (``--sv-<status>-bd``), which are also the plots' bar colours;
- ``fill``: each chip as it is painted: its background (alpha-composited over the panel) blended
  with its border's colour, weighted as a chip's pixels are (mostly fill).

    python -m specviz.views.cvd              # the table for the shipped palette
    python -m specviz.views.cvd --css FILE   # another style sheet

Pure Python, no dependencies beyond the standard library.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from pathlib import Path

STATUSES = ("accepted", "rejected", "correction", "bonus", "discarded", "pending")
VISIONS = ("normal", "protanopia", "deuteranopia", "tritanopia")
PANEL = {"light": "#ffffff", "dark": "#0b0f19"}  # what a chip sits on (Gradio Soft's panels)

# Machado et al. 2009, severity 1.0, for linear RGB.
MACHADO: dict[str, tuple[tuple[float, float, float], ...]] = {
    "normal": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}

RGB = tuple[float, float, float]  # sRGB components in 0..1


# ---- parsing the style sheet -----------------------------------------------------------------


def parse_color(text: str, over: RGB | None = None) -> RGB:
    """'#rrggbb', '#rgb' or 'rgba(r, g, b, a)' as sRGB 0..1 (rgba composited over ``over``)."""
    s = text.strip().lower()
    if s.startswith("#"):
        h = s[1:]
        if len(h) == 3:
            h = "".join(c * 2 for c in h)
        return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]
    m = re.fullmatch(r"rgba?\(([^)]*)\)", s)
    if not m:
        raise ValueError(f"not a colour: {text!r}")
    parts = [p.strip() for p in m.group(1).split(",")]
    rgb = [float(p) / 255 for p in parts[:3]]
    a = float(parts[3]) if len(parts) > 3 else 1.0
    base = over if over is not None else (1.0, 1.0, 1.0)
    return tuple(a * c + (1 - a) * b for c, b in zip(rgb, base))  # type: ignore[return-value]


def _block(css: str, selector: str) -> str:
    """The body of the first rule whose selector list starts with ``selector``."""
    m = re.search(r"(^|\n)" + re.escape(selector) + r"[^{]*\{([^}]*)\}", css)
    if not m:
        raise ValueError(f"no rule for {selector!r} in the style sheet")
    return m.group(2)


def palette(css: str, mode: str = "light") -> dict[str, dict[str, RGB]]:
    """{status: {"bg", "fg", "bd"}} for ``mode`` ("light": ``:root``; "dark": ``.dark``)."""
    body = re.sub(r"/\*.*?\*/", "", _block(css, ":root" if mode == "light" else ".dark"), flags=re.S)
    values = dict(re.findall(r"--sv-([\w-]+)\s*:\s*([^;]+);", body))
    panel = parse_color(PANEL[mode])
    out: dict[str, dict[str, RGB]] = {}
    for status in STATUSES:
        out[status] = {k: parse_color(values[f"{status}-{k}"], panel) for k in ("bg", "fg", "bd")}
    return out


# ---- colour science --------------------------------------------------------------------------


def _to_linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _to_srgb(c: float) -> float:
    c = min(max(c, 0.0), 1.0)
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def simulate(rgb: RGB, vision: str) -> RGB:
    """``rgb`` as seen with ``vision`` (Machado 2009 in linear RGB; the result clipped to the gamut)."""
    m = MACHADO[vision]
    lin = [_to_linear(c) for c in rgb]
    return tuple(_to_srgb(sum(m[i][j] * lin[j] for j in range(3))) for i in range(3))  # type: ignore[return-value]


def to_lab(rgb: RGB) -> tuple[float, float, float]:
    """sRGB (D65) to CIE L*a*b*."""
    r, g, b = (_to_linear(c) for c in rgb)
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29
    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e00(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """CIEDE2000 colour difference (Sharma, Wu & Dalal 2005)."""
    L1, a1, b1 = lab1
    L2, a2, b2 = lab2
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    cm = (c1 + c2) / 2
    g = 0.5 * (1 - math.sqrt(cm ** 7 / (cm ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360
    h2p = math.degrees(math.atan2(b2, a2p)) % 360
    dl, dc = L2 - L1, c2p - c1p
    if c1p * c2p == 0:
        dhp = 0.0
    elif abs(h2p - h1p) <= 180:
        dhp = h2p - h1p
    else:
        dhp = h2p - h1p - 360 if h2p > h1p else h2p - h1p + 360
    dh = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dhp / 2))
    lm, cmp_ = (L1 + L2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        hm = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hm = (h1p + h2p) / 2
    else:
        hm = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hm - 30)) + 0.24 * math.cos(math.radians(2 * hm))
         + 0.32 * math.cos(math.radians(3 * hm + 6)) - 0.20 * math.cos(math.radians(4 * hm - 63)))
    d_theta = 30 * math.exp(-(((hm - 275) / 25) ** 2))
    rc = 2 * math.sqrt(cmp_ ** 7 / (cmp_ ** 7 + 25 ** 7))
    sl = 1 + 0.015 * (lm - 50) ** 2 / math.sqrt(20 + (lm - 50) ** 2)
    sc = 1 + 0.045 * cmp_
    sh = 1 + 0.015 * cmp_ * t
    rt = -math.sin(math.radians(2 * d_theta)) * rc
    return math.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dh / sh) ** 2 + rt * (dc / sc) * (dh / sh))


# ---- the check ---------------------------------------------------------------------------------

FILL_SHARE = 0.7  # a chip's pixels: mostly its fill, then its 1.5 px border and glyphs


def swatches(css: str, mode: str, kind: str) -> dict[str, RGB]:
    """The colour a reader takes for each status: its border ("solid") or its chip as painted ("fill")."""
    pal = palette(css, mode)
    if kind == "solid":
        return {s: pal[s]["bd"] for s in STATUSES}
    return {s: tuple(FILL_SHARE * b + (1 - FILL_SHARE) * d for b, d in zip(pal[s]["bg"], pal[s]["bd"]))  # type: ignore[misc]
            for s in STATUSES}


def pairwise(colors: dict[str, RGB], vision: str) -> dict[tuple[str, str], float]:
    """ΔE00 between every two statuses as seen with ``vision``."""
    lab = {s: to_lab(simulate(c, vision)) for s, c in colors.items()}
    return {(a, b): delta_e00(lab[a], lab[b]) for a, b in itertools.combinations(colors, 2)}


def worst(colors: dict[str, RGB], vision: str) -> tuple[float, tuple[str, str]]:
    """(the smallest pairwise ΔE00, the pair) as seen with ``vision``."""
    d = pairwise(colors, vision)
    pair = min(d, key=d.get)
    return d[pair], pair


def report(css: str) -> list[dict]:
    """One row per (mode, swatch kind, vision): the minimum pairwise ΔE00 and its pair."""
    rows = []
    for mode in ("light", "dark"):
        for kind in ("solid", "fill"):
            colors = swatches(css, mode, kind)
            for vision in VISIONS:
                de, pair = worst(colors, vision)
                rows.append({"mode": mode, "kind": kind, "vision": vision, "min_de00": round(de, 1), "pair": pair})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--css", default=str(Path(__file__).resolve().parents[2] / "assets" / "style.css"))
    args = ap.parse_args(argv)
    css = Path(args.css).read_text(encoding="utf-8")
    print(f"{'mode':6} {'swatch':6} {'vision':13} {'min ΔE00':>8}  closest pair")
    for r in report(css):
        print(f"{r['mode']:6} {r['kind']:6} {r['vision']:13} {r['min_de00']:8.1f}  {' / '.join(r['pair'])}")


if __name__ == "__main__":
    main()
