"""Open the report in headless Chromium (Debian's ``chromium``, installed by .ci/run): the page loads
and shows its figures.  Skipped only when chromium is not installed."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image, ImageStat
from report_paths import SEED002

from trainfit.report.browser import find_chromium, look
from trainfit.report.output import make_report

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="chromium is not installed (.ci/run installs it with apt-get)")

WIDTH, HEIGHT = 1280, 4000


@pytest.fixture(scope="module")
def example_report(tmp_path_factory):
    """The docs example: the real seed-002 plan alone."""
    out = tmp_path_factory.mktemp("example") / "example-report.html"
    make_report([str(SEED002)], out)
    return out


@pytest.mark.parametrize("which", ["example_report", "rendered"])
def test_page_loads_with_its_figures(which, request, tmp_path):
    html = request.getfixturevalue(which)
    shot = tmp_path / "shot.png"
    dom = look(html, shot, WIDTH, HEIGHT)
    img = Image.open(shot).convert("RGB")
    assert img.size == (WIDTH, HEIGHT)
    # not blank: pixel variance, and colour (the charts' bars and lines; text alone is grey)
    assert max(ImageStat.Stat(img.convert("L")).var) > 500
    saturation = img.convert("HSV").getchannel("S").point(lambda s: 255 if s > 80 else 0)
    assert ImageStat.Stat(saturation).mean[0] / 255 > 0.01  # > 1 % of the page is coloured

    imgs = re.findall(r"<img\b[^>]*>", dom)
    expected = len(re.findall(r"<img\b", html.read_text()))
    assert expected >= 2 and len(imgs) == expected
    for tag in imgs:
        m = re.search(r'src="data:image/png;base64,([^"]+)"', tag)
        assert m, tag[:200]
        fig = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
        assert fig.format == "PNG" and fig.width > 300 and fig.height > 200
    assert "trainfit report" in dom and "Micro-batch table" in dom
