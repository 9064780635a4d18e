"""`python -m bench toolloop` against a live daphne serving the 2-layer random model:
behaviour only (the rows have their fields, and every turn after the first is served
from the cache up to the previous turn's whole blocks, arguments re-serialised)."""

from __future__ import annotations

from bench.toolloop import main
from tests.bench.test_serve import api_key, live_api  # noqa: F401


def test_toolloop_reports_the_cached_share_per_turn(live_api, tmp_path):  # noqa: F811
    out = tmp_path / "toolloop.json"
    result = main(["--turns", "3", "--loops", "1", "--url", live_api.url,
                   "--api-key", api_key(live_api), "--out", str(out), "--no-mask-cost"])
    assert out.exists() and len(result["rows"]) == 3
    for row in result["rows"]:
        assert row["call"] in ("get_weather", "get_time")
        if row["turn"] > 1:
            assert row["cached_share_of_cacheable"] == 1.0, row
