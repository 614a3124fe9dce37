"""The gateway's route table, its choices, and the pure rewriting of HTTP answers and metrics.

Routes arrive from the daemon and from a file on disk: each refusal must name its field. A choice must
follow the weights, stay stable for a sticky header's value (also across a route update and a restart:
the hash is crc32, not Python's salted hash), and a pin must reach any loaded target and say which are
loaded when it names none.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from controlplane.errors import UsageError
from controlplane.gateway import httpnames as hn
from controlplane.gateway.figures import Figures
from controlplane.gateway.metrics import gateway_text, relabel_triton
from controlplane.gateway.parking import Parking
from controlplane.gateway.routes import (
    Route,
    RouteTable,
    Target,
    read_table,
    route_from_json,
    table_from_json,
    table_to_json,
    write_table,
)
from controlplane.gateway.table import LiveTable, RouteRefusal

A, B = "a" * 64, "b" * 64


def two(weight_a: int = 50, sticky: str | None = None) -> RouteTable:
    route = Route("m", (Target("m__aaaaaaaa", A, weight_a), Target("m__bbbbbbbb", B, 100 - weight_a)), sticky)
    return RouteTable(3, {"m": route})


@pytest.mark.parametrize("data, field", [
    ({"targets": [{"name": "m__aaaaaaaa", "digest": A, "weight": 60}]}, "routes.m.targets: weights add up to 60"),
    ({"targets": [{"name": "x__aaaaaaaa", "digest": A}]}, "routes.m.targets[0].name"),
    ({"targets": [{"name": "m__aaaaaaaa", "digest": "zz"}]}, "routes.m.targets[0].digest"),
    ({"targets": [{"digest": A, "weight": 101}]}, "routes.m.targets[0].weight"),
    ({"targets": []}, "routes.m.targets: a serving route needs at least one target"),
    ({"targets": [{"digest": A}], "state": "asleep"}, "routes.m.state"),
    ({"targets": [{"digest": A}], "sticky_header": "X-User"}, "routes.m.sticky_header"),
    ({"targets": [{"digest": A}], "extra": 1}, "routes.m: unknown key 'extra'"),
])
def test_a_bad_route_is_refused_naming_its_field(data: dict, field: str) -> None:
    with pytest.raises(UsageError) as raised:
        route_from_json("m", data)
    assert str(raised.value).startswith(field)
    assert "\n" not in str(raised.value)


def test_private_names_are_not_public_models() -> None:
    with pytest.raises(UsageError, match="reserves"):
        route_from_json("m__aaaaaaaa", {"targets": [{"digest": A}]})


def test_the_routes_file_round_trips_durably(tmp_path: Path) -> None:
    table = two(sticky="x-user-id")
    path = tmp_path / "routes.json"
    write_table(path, table)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert read_table(path) == table
    assert read_table(tmp_path / "absent.json") == RouteTable()
    path.write_text("{")
    with pytest.raises(UsageError, match="routes.json: not JSON"):
        read_table(path)
    assert table_from_json(json.loads(json.dumps(table_to_json(table))), "x") == table
    with pytest.raises(UsageError, match="older than the gateway's 3"):
        table.updated({}, [], 2)
    assert table.updated({}, ["m"], None) == RouteTable(4, {})


def test_weights_pins_and_sticky_values() -> None:
    figures = Figures()
    live = LiveTable(two(10), figures).route(b"m")
    random.seed(5)
    picks = [live.choose(None, None).digest for _ in range(5000)]
    assert 400 <= picks.count(A) <= 600  # 10 %
    assert live.choose(b"bbbbbb", None).digest == B and live.choose(b"m__aaaaaaaa", None).digest == A
    with pytest.raises(RouteRefusal) as raised:
        live.choose(b"cccccc", None)
    assert raised.value.kind == "bad_pin" and A[:12] in raised.value.message and B[:12] in raised.value.message
    sticky = LiveTable(two(50, "x-user-id"), figures).route(b"m")
    again = LiveTable(two(50, "x-user-id"), figures).route(b"m")  # an update, or a restart
    for user in (b"alice", b"bob", b"u17", b""):
        assert {sticky.choose(None, user).digest for _ in range(10)} == {again.choose(None, user).digest}
    assert {sticky.choose(None, f"u{i}".encode()).digest for i in range(50)} == {A, B}
    assert live.primary(None).digest == B  # the heaviest: questions about the model go to the serving digest
    with pytest.raises(RouteRefusal, match="unknown model: 'n' is not found"):
        LiveTable(two(), figures).route(b"n")
    down = LiveTable(RouteTable(1, {"m": Route("m", (), None, "unavailable")}), figures).route(b"m")
    with pytest.raises(RouteRefusal, match="not serving"):
        down.choose(None, None)


def test_http_paths_and_answers() -> None:
    info = hn.classify("/v2/models/m/versions/2/infer")
    assert (info.kind, info.name, info.version) == (hn.INFER, "m", "2")
    assert info.private_path("m__aaaaaaaa") == "/v2/models/m__aaaaaaaa/versions/2/infer"
    assert hn.classify("/v2/models/m").kind == hn.META and hn.classify("/v2/models/stats").kind == hn.STATS_ALL
    assert hn.classify("/v2/repository/models/m/load").kind == hn.REFUSE
    assert hn.classify("/v2/health/ready").kind == hn.PASS
    body = b'{"model_name":"m__aaaaaaaa","outputs":[{"name":"o","data":["\\"model_name\\":\\"m__aaaaaaaa\\""]}]}'
    assert hn.renamed_first(body, b"model_name", b"m__aaaaaaaa", b"m").startswith(b'{"model_name":"m","outputs"')
    config = json.dumps({"name": "e__aaaaaaaa", "ensemble_scheduling": {"step": [{"model_name": "s__bbbbbbbb"}]}})
    assert json.loads(hn.rename_config_json(config.encode())) == {
        "name": "e", "ensemble_scheduling": {"step": [{"model_name": "s"}]}}
    stats = json.dumps({"model_stats": [{"name": "m__aaaaaaaa"}, {"name": "m__bbbbbbbb"}, {"name": "other"}]})
    assert json.loads(hn.rename_stats_json(stats.encode(), {"m__aaaaaaaa": "m"})) == {"model_stats": [{"name": "m"}]}
    sse = hn.SseRenamer(b"m__aaaaaaaa", b"m")
    stream = b'data: {"model_name":"m__aaaaaaaa","text_output":"hi"}\n\ndata: {"model_name":"m__aaaaaaaa"}\n\n'
    out = b"".join(sse.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + sse.end()
    assert out == stream.replace(b"m__aaaaaaaa", b"m")


def test_metrics_text_and_tritons_labels() -> None:
    figures = Figures()
    slot = figures.slot("m", A, "m__aaaaaaaa")
    slot.grpc.requests, slot.grpc.model = 3, 1
    slot.grpc.observe(0.002)

    class Gw:
        pass

    gw = Gw()
    gw.figures = figures  # type: ignore[attr-defined]
    gw.parking = Parking()  # type: ignore[attr-defined]
    gw.parking.waiting["n"] = {object(): None, object(): None}  # type: ignore[attr-defined, dict-item]
    text = gateway_text(gw)
    assert 'tritonctl_gateway_waiting_requests{model="n"} 2' in text
    assert 'tritonctl_gateway_requests_total{model="m",digest="aaaaaaaaaaaa",protocol="grpc"} 3' in text
    assert 'tritonctl_gateway_failures_total{model="m",digest="aaaaaaaaaaaa",protocol="grpc",class="model"} 1' in text
    bucket = 'tritonctl_gateway_request_seconds_bucket{model="m",digest="aaaaaaaaaaaa",protocol="grpc",le="0.0025"} 1'
    assert bucket in text
    triton = b'nv_inference_request_success{model="m__aaaaaaaa",version="1"} 5\nnv_x{model="plain"} 1\n'
    assert relabel_triton(triton, {"m__aaaaaaaa": A}) == (
        b'nv_inference_request_success{model="m",digest="aaaaaaaaaaaa",version="1"} 5\nnv_x{model="plain"} 1\n')


def test_what_the_daemon_imports_pulls_in_no_event_loop() -> None:
    """routes.py, control.py and launcher.py are the daemon's side: no asyncio, uvloop, HTTP or HPACK
    library, gRPC or numpy comes with them (they run in the daemon's threads)."""
    import subprocess
    import sys

    probe = ("import sys, controlplane.gateway.launcher, controlplane.gateway.control, controlplane.gateway.routes;"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'asyncio', 'uvloop', 'httptools', 'hpack', "
             "'grpc', 'numpy', 'tritonclient'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
