"""The gRPC relay's byte work without sockets: a client's frames fed to the gateway in every cut, what
tritonserver would receive decoded with Triton's own protobuf classes.

A real client's bytes arrive in arbitrary pieces (TCP segments, 16 KiB frames): the model name must be
found and replaced whatever the cut, wherever field 1 sits, and a second field 1 refused. The
connections here are the gateway's own classes with transports that record what they are given.
"""

from __future__ import annotations

from typing import Any

import hpack
import pytest

from controlplane.gateway import frames as f
from controlplane.gateway import protos
from controlplane.gateway.grpcfront import FrontConnection
from controlplane.gateway.h2state import Limits, flush_dirty
from controlplane.gateway.routes import Route, RouteTable, Target
from controlplane.gateway.server import Gateway, GatewayOptions
from controlplane.gateway.upstream import UpstreamConnection
from controlplane.gateway.wire import public_name, public_text, rename_stream_response, rest_ok

pb = protos.service_pb2()
DIGEST = "0123abcd" + "0" * 56
PRIVATE = "linear__0123abcd"
PATH = "/inference.GRPCInferenceService/ModelInfer"


class Recorder:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def writelines(self, parts: list[Any]) -> None:
        self.data += b"".join(bytes(p) for p in parts)

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    def get_extra_info(self, name: str) -> None:
        return None

    def close(self) -> None:
        self.closed = True


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while len(data) - pos >= 9:
        hi, lo, ftype, flags, sid = f.FRAME_HEADER.unpack_from(data, pos)
        n = (hi << 8) | lo
        out.append((ftype, flags, sid & 0x7FFFFFFF, data[pos + 9 : pos + 9 + n]))
        pos += 9 + n
    return out


def rig() -> tuple[Gateway, FrontConnection, Recorder, UpstreamConnection, Recorder]:
    gw = Gateway(GatewayOptions(grpc_address=None, http_address=None, triton_grpc=("127.0.0.1", 1)))
    gw.install(RouteTable(1, {"linear": Route("linear", (Target(PRIVATE, DIGEST, 100),))}))
    up_t, front_t = Recorder(), Recorder()
    up = UpstreamConnection(gw.pool)
    up.connection_made(up_t)  # type: ignore[arg-type]
    gw.pool.conns.append(up)
    front = FrontConnection(gw)
    front.connection_made(front_t)  # type: ignore[arg-type]
    return gw, front, front_t, up, up_t


def request_bytes(message: bytes, sid: int = 1) -> bytes:
    head = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "g"),
                                   ("content-type", "application/grpc"), ("te", "trailers")])
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    data = [f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, head)]
    for i in range(0, len(body), 16384):  # the default MAX_FRAME_SIZE a client starts with
        last = i + 16384 >= len(body)
        data.append(f.frame(f.DATA, f.FLAG_END_STREAM if last else 0, sid, body[i : i + 16384]))
    return f.PREFACE + f.settings_frame({}) + b"".join(data)


def upstream_request(up_t: Recorder) -> tuple[dict[str, str], Any, bool]:
    """What tritonserver would get: the request's headers, its message decoded, whether it ended."""
    got = frames_of(up_t.data[len(f.PREFACE):])
    headers = [p for t, _, sid, p in got if t == f.HEADERS and sid == 1]
    body = b"".join(p for t, _, sid, p in got if t == f.DATA and sid == 1)
    ended = any(flags & f.FLAG_END_STREAM for t, flags, sid, _ in got if t == f.DATA and sid == 1)
    decoded = dict(hpack.Decoder().decode(headers[0])) if headers else {}
    message = pb.ModelInferRequest.FromString(body[5:]) if len(body) >= 5 else None
    if message is not None:
        assert int.from_bytes(body[1:5], "big") == len(body) - 5
    return decoded, message, ended


def a_request(size: int = 3000) -> Any:
    request = pb.ModelInferRequest(model_name="linear", model_version="2", id="req-7")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, size // 4])
    tensor.parameters["k"].string_param = "v"
    request.raw_input_contents.append(bytes(range(256)) * (size // 256) + b"\x01" * (size % 256))
    return request


@pytest.mark.parametrize("cut", [1, 2, 5, 9, 10, 11, 17, 64, 100, 4096, 10**9])
def test_the_name_is_replaced_whatever_the_cut(cut: int) -> None:
    request = a_request(20000)
    data = request_bytes(request.SerializeToString())
    _, front, _, _, up_t = rig()
    for i in range(0, len(data), cut):
        front.data_received(data[i : i + cut])
    headers, message, ended = upstream_request(up_t)
    assert headers[":path"] == PATH and ended
    assert message.model_name == PRIVATE
    request.model_name = PRIVATE
    assert message == request  # everything else byte for byte


def test_field_one_need_not_come_first() -> None:
    request = a_request()
    rest = request.SerializeToString()
    request.ClearField("model_name")
    late = request.SerializeToString() + b"\x0a\x06linear"  # model_name after the tensors
    assert pb.ModelInferRequest.FromString(late).model_name == "linear"
    del rest
    _, front, _, _, up_t = rig()
    front.data_received(request_bytes(late))
    _, message, ended = upstream_request(up_t)
    assert message.model_name == PRIVATE and ended and message.raw_input_contents == request.raw_input_contents


def test_a_second_model_name_is_refused_and_nothing_whole_reaches_triton() -> None:
    """protobuf keeps the last value of a repeated field: `linear` then a private name would reach the
    private model directly. Such a message is refused before its end goes on."""
    other = b"other__0123abcd"
    message = a_request().SerializeToString() + b"\x0a" + bytes([len(other)]) + other
    _, front, front_t, _, up_t = rig()
    front.data_received(request_bytes(message))
    _, _, ended = upstream_request(up_t)
    assert not ended
    answer = [p for t, _, sid, p in frames_of(front_t.data) if t == f.HEADERS and sid == 1]
    trailers = dict(hpack.Decoder().decode(answer[-1]))
    assert trailers["grpc-status"] == "3" and "given twice" in trailers["grpc-message"]


def test_an_unknown_model_is_answered_by_the_gateway() -> None:
    request = a_request()
    request.model_name = PRIVATE  # a private name is not a public model
    _, front, front_t, _, up_t = rig()
    front.data_received(request_bytes(request.SerializeToString()))
    assert upstream_request(up_t)[0] == {}  # tritonserver never saw it
    answer = [p for t, _, sid, p in frames_of(front_t.data) if t == f.HEADERS and sid == 1]
    trailers = dict(hpack.Decoder().decode(answer[-1]))
    assert trailers["grpc-status"] == "5"
    assert trailers["grpc-message"] == f"Request for unknown model: '{PRIVATE}' is not found"


def test_answers_are_renamed_and_credited() -> None:
    gw, front, front_t, up, up_t = rig()
    front.data_received(request_bytes(a_request().SerializeToString()))
    answer = pb.ModelInferResponse(model_name=PRIVATE, model_version="2", id="req-7")
    answer.raw_output_contents.append(b"\x07" * 70000)
    body = answer.SerializeToString()
    encoder = hpack.Encoder()
    data = (f.settings_frame({}) + f.frame(f.HEADERS, f.FLAG_END_HEADERS, 1, encoder.encode(
        [(":status", "200"), ("content-type", "application/grpc")]))
            + f.frame(f.DATA, 0, 1, b"\x00" + len(body).to_bytes(4, "big") + body)
            + f.frame(f.HEADERS, f.FLAG_END_HEADERS | f.FLAG_END_STREAM, 1, encoder.encode(
                [("grpc-status", "13"), ("grpc-message", f"model '{PRIVATE}' failed")])))
    for i in range(0, len(data), 1000):
        up.data_received(data[i : i + 1000])
    flush_dirty()
    sent = b"".join(p for t, _, sid, p in frames_of(front_t.data) if t == f.DATA and sid == 1)
    assert len(sent) == 65535  # the client's default window: the rest waits for its WINDOW_UPDATE
    front.data_received(f.window_update(0, 1 << 20) + f.window_update(1, 1 << 20))
    got = frames_of(front_t.data)
    sent = b"".join(p for t, _, sid, p in got if t == f.DATA and sid == 1)
    renamed = pb.ModelInferResponse.FromString(sent[5:])
    assert renamed.model_name == "linear" and renamed.raw_output_contents == answer.raw_output_contents
    decoder = hpack.Decoder()
    blocks = [dict(decoder.decode(p)) for t, _, sid, p in got if t == f.HEADERS and sid == 1]
    assert blocks[-1]["grpc-status"] == "13" and blocks[-1]["grpc-message"] == "model 'linear' failed"
    slot = gw.figures.slots[PRIVATE]
    assert (slot.grpc.requests, slot.grpc.model, slot.inflight) == (1, 1, 0)


def test_rest_ok_and_public_names() -> None:
    body = a_request().SerializeToString()
    end = 2 + body[1]
    assert rest_ok(body, end, len(body))
    assert not rest_ok(body + b"\x0a\x01x", end, len(body) + 3)  # field 1 again
    assert not rest_ok(body[:-1], end, len(body) - 1)  # cut inside a field
    assert public_name(b"linear__0123abcd") == b"linear" and public_name(b"linear__0123abcdef") == b"linear__0123abcdef"
    text = b"model 'boom__0123abcd_0_0' and 'a.b-c__ffffffff', not __init__ nor x__0123abcdef"
    assert public_text(text) == b"model 'boom_0_0' and 'a.b-c', not __init__ nor x__0123abcdef"


def test_a_stream_answer_is_renamed_inside() -> None:
    answer = pb.ModelStreamInferResponse(error_message=f"'{PRIVATE}' said no")
    answer.infer_response.model_name = PRIVATE
    answer.infer_response.id = "3"
    renamed = pb.ModelStreamInferResponse.FromString(rename_stream_response(answer.SerializeToString()))
    assert renamed.error_message == "'linear' said no"
    assert renamed.infer_response.model_name == "linear" and renamed.infer_response.id == "3"


def test_goaway_from_tritonserver_refuses_what_it_never_processed() -> None:
    """Streams above GOAWAY's last id never reached a model: the client gets RST_STREAM(REFUSED_STREAM),
    which gRPC clients retry by themselves, and the connection leaves the pool (a new one opens)."""
    gw, front, front_t, up, up_t = rig()
    front.data_received(request_bytes(a_request().SerializeToString()))
    assert upstream_request(up_t)[2]
    up.data_received(f.settings_frame({}) + f.goaway(0, f.NO_ERROR))
    flush_dirty()
    resets = [(sid, f.u32(p)) for t, _, sid, p in frames_of(front_t.data) if t == f.RST_STREAM]
    assert resets == [(1, f.REFUSED_STREAM)]
    assert gw.pool.conns == [] and up_t.closed
    assert gw.figures.slots[PRIVATE].inflight == 0


def test_a_client_reset_cancels_the_stream_to_tritonserver() -> None:
    gw, front, _, up, up_t = rig()
    front.data_received(request_bytes(a_request().SerializeToString()))
    front.data_received(f.rst_stream(1, f.CANCEL))
    flush_dirty()
    resets = [(sid, f.u32(p)) for t, _, sid, p in frames_of(up_t.data[len(f.PREFACE):]) if t == f.RST_STREAM]
    assert resets == [(1, f.CANCEL)]
    slot = gw.figures.slots[PRIVATE]
    assert (slot.inflight, slot.grpc.client, up.streams) == (0, 1, {})


def test_a_request_waits_for_tritonservers_window_and_the_client_is_credited_after() -> None:
    """Backpressure toward tritonserver: with a 1,000-byte stream window only that much leaves; the rest
    waits for its WINDOW_UPDATE, and the client's bytes are credited back only once they left."""
    _, front, front_t, up, up_t = rig()
    front.limits = Limits(stream_window=65536, conn_window=65536)  # credit back from 16 KiB on
    up.data_received(f.settings_frame({f.S_INITIAL_WINDOW_SIZE: 1000}))
    request = a_request(40000)
    front.data_received(request_bytes(request.SerializeToString()))
    flush_dirty()
    sent = [p for t, _, sid, p in frames_of(up_t.data[len(f.PREFACE):]) if t == f.DATA and sid == 1]
    assert sum(map(len, sent)) == 1000

    def credited() -> int:
        return sum(f.u32(p) for t, _, sid, p in frames_of(front_t.data) if t == f.WINDOW_UPDATE and sid == 0)

    before = credited()
    up.data_received(f.window_update(1, 1 << 20))
    flush_dirty()
    _, message, ended = upstream_request(up_t)
    request.model_name = PRIVATE
    assert ended and message == request
    assert credited() - before >= 40000  # granted again once sent on
