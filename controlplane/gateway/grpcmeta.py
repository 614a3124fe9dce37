"""The gRPC methods that are not hot: answers the gateway gives itself, decodes or rewrites whole.

The repository index is the gateway's own view (its routes: public names, READY or UNAVAILABLE).
ModelConfig's answer names the model (and an ensemble's steps) privately; ModelStatistics' names every
model tritonserver has loaded; TraceSetting names its model in field 2. These messages are small, so
they are decoded with tritonclient's generated classes (protos.py, no gRPC library) and encoded again
with public names. A statistics answer lists only public models, each from its serving digest.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from controlplane.gateway import grpcwire as g
from controlplane.gateway import protos
from controlplane.gateway.table import RouteRefusal
from controlplane.gateway.wire import public_name


def public(name: str) -> str:
    return public_name(name.encode()).decode()


def rename_config(config: Any) -> None:
    """A ModelConfig as clients know it: its name, and an ensemble's steps, public."""
    config.name = public(config.name)
    for step in config.ensemble_scheduling.step:
        step.model_name = public(step.model_name)


def index_entries(table: Any, ready_only: bool) -> list[tuple[str, str, str]]:
    """(name, state, reason) of every public model the routes know."""
    out = []
    for name, route in sorted(table.source.routes.items()):
        serving = route.state == "serving" and bool(route.targets)
        if ready_only and not serving:
            continue
        out.append((name, "READY" if serving else "UNAVAILABLE", "" if serving else route.state))
    return out


def shown_statistics(call_target: Any, table: Any) -> dict[str, str]:
    """private name -> public name of the entries a statistics answer keeps: the one the call named, or
    (every model asked for) each public model's serving digest."""
    if call_target is not None and getattr(call_target, "name", None):
        return {call_target.name: call_target.model}
    return dict(table.serving_names)


class Meta:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.pb = protos.service_pb2()

    def local(self, call: Any, body: bytes) -> None:
        """A method the gateway answers itself, or sends on rebuilt (TraceSetting)."""
        try:
            if call.kind == g.INDEX:
                request = self.pb.RepositoryIndexRequest.FromString(body)
                answer = self.pb.RepositoryIndexResponse()
                for name, state, reason in index_entries(call.table, request.ready):
                    answer.models.add(name=name, state=state, reason=reason)
                call.answer(answer.SerializeToString())
            elif call.kind == g.TRACE:
                request = self.pb.TraceSettingRequest.FromString(body)
                if request.model_name:
                    try:
                        target = call.table.route(request.model_name.encode()).primary(call.head.pin)
                    except RouteRefusal as exc:
                        call.refuse(g.NOT_FOUND, exc.message.encode(), "client")
                        return
                    request.model_name = target.name
                call.forward(request.SerializeToString())
            else:  # pragma: no cover - grpcwire.KINDS sends no other kind here
                call.refuse(g.UNIMPLEMENTED, b"method not handled by the gateway", "client")
        except DecodeError as exc:
            call.refuse(g.INVALID_ARGUMENT, f"not a valid request message: {exc}".encode(), "client")

    def answer(self, call: Any, body: bytes) -> bytes:
        """tritonserver's whole answer to a decoded method, with public names."""
        if call.kind == g.CONFIG:
            config_answer = self.pb.ModelConfigResponse.FromString(body)
            rename_config(config_answer.config)
            return bytes(config_answer.SerializeToString())
        if call.kind == g.STATS:
            stats = self.pb.ModelStatisticsResponse.FromString(body)
            shown = shown_statistics(call.target, call.table)
            kept = [entry for entry in stats.model_stats if entry.name in shown]
            del stats.model_stats[:]
            for entry in kept:
                entry.name = shown[entry.name]
                stats.model_stats.append(entry)
            return bytes(stats.SerializeToString())
        return body
