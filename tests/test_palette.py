"""The token statuses' colours stay apart for common colour-vision deficiencies (specviz.views.cvd)."""

from __future__ import annotations

import pytest

from specviz.views import cvd
from specviz.views._fmt import COLORS
from specviz.views.page import load_css

CSS = load_css()


@pytest.mark.parametrize("lab1, lab2, expected", [
    # Sharma, Wu & Dalal (2005), Table 1: pairs 1, 7, 17 and 25
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
])
def test_ciede2000_matches_the_published_pairs(lab1, lab2, expected):
    assert cvd.delta_e00(lab1, lab2) == pytest.approx(expected, abs=1e-4)


def test_the_simulation_merges_what_each_deficiency_confuses():
    red, green, blue, yellow = (0.8, 0.1, 0.1), (0.3, 0.55, 0.1), (0.2, 0.4, 0.9), (0.2, 0.7, 0.6)

    def de(a, b, vision):
        return cvd.delta_e00(cvd.to_lab(cvd.simulate(a, vision)), cvd.to_lab(cvd.simulate(b, vision)))
    # red vs green: far apart for normal vision, close for the red-green deficiencies, not for tritanopia
    assert de(red, green, "normal") > 40
    assert de(red, green, "deuteranopia") < 0.5 * de(red, green, "normal")
    assert de(red, green, "protanopia") < 0.5 * de(red, green, "normal")
    assert de(red, green, "tritanopia") > 0.6 * de(red, green, "normal")
    assert de(blue, yellow, "tritanopia") < de(blue, yellow, "normal")


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("vision", cvd.VISIONS)
def test_the_statuses_stay_apart_under_each_simulated_vision(mode, vision):
    solid = cvd.worst(cvd.swatches(CSS, mode, "solid"), vision)
    fill = cvd.worst(cvd.swatches(CSS, mode, "fill"), vision)
    # borders and plot bars: told apart at a glance; chips as painted (pale fills): clearly noticeable
    assert solid[0] >= 11, f"{mode} borders under {vision}: {solid[1]} only ΔE00 {solid[0]:.1f} apart"
    assert fill[0] >= 7, f"{mode} chips under {vision}: {fill[1]} only ΔE00 {fill[0]:.1f} apart"


def test_the_plots_use_the_light_borders():
    light = cvd.palette(CSS, "light")
    for status in cvd.STATUSES:
        if status == "discarded":  # a grey: the plots' is darker than the chips' border, to show on white
            continue
        assert cvd.parse_color(COLORS[status]) == light[status]["bd"], status
