"""Cases of one model and its files: dims, reshape, data types, version policies, identity, instance
groups, referenced files (labels, EXECUTION_ENV_PATH), and config.pbtxt that does not parse."""

from __future__ import annotations

import io
import json
import tarfile

from tests.differential.casekit import MODEL_PY, TYPES, Builder, simple


def dims(b: Builder) -> None:
    c = "dims"
    b.one("dims_basic", c, simple(), True)
    b.one("dims_no_batch", c, simple(mbs=0, inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }',
                                     outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 3, 1 ] }'), True)
    b.one("dims_variable", c, simple(mbs=0, inputs='{ name: "x" data_type: TYPE_STRING dims: [ -1 ] }'), True)
    b.one("dims_zero", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 0 ] }'), False)
    b.one("dims_minus_two", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -2 ] }'), False)
    b.one("dims_empty_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ ] }'), False)
    b.one("dims_max_batch_negative", c, simple(mbs=-1), False)
    b.one("dims_many", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 2, 3, 4, 5 ] }'), True)
    b.one("dims_two_inputs", c, simple(inputs='{ name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                              '{ name: "b" data_type: TYPE_INT32 dims: [ 1 ] }'), True)
    b.one("dims_no_type", c, simple(inputs='{ name: "x" dims: [ 3 ] }'), False)
    b.one("dims_output_no_type", c, simple(outputs='{ name: "y" dims: [ 1 ] }'), False)
    b.one("dims_empty_name", c, simple(inputs='{ name: "" data_type: TYPE_FP32 dims: [ 3 ] }'), False)
    b.one("dims_duplicate_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                   '{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }'), True,
          "stricter: a request cannot address both")
    b.one("dims_duplicate_output", c, simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                                     '{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }'), True,
          "stricter: a response cannot carry both")
    b.one("dims_optional_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                  '{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] optional: true }'),
          True)


def reshape(b: Builder) -> None:
    c = "reshape"
    b.one("reshape_in", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 1, 3 ] } }'),
          True)
    b.one("reshape_out", c, simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1, 1 ] reshape { shape: [ 1 ] } }'),  # noqa: E501
          True)
    b.one("reshape_count", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 2, 2 ] } }'),  # noqa: E501
          False)
    b.one("reshape_scalar_batching", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }'), True)
    b.one("reshape_scalar_nobatch", c,
          simple(mbs=0, inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }'), False)
    b.one("reshape_variable", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ -1, 2, 2 ] } }'), True)
    b.one("reshape_variable_bad", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, -1, 3 ] } }'), False)
    b.one("reshape_zero", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 0, 3 ] } }'),  # noqa: E501
          False)


def types(b: Builder) -> None:
    for t in TYPES:
        short = t.removeprefix("TYPE_").lower()
        io = f'{{ name: "x" data_type: {t} dims: [ 2 ] }}'
        out = f'{{ name: "y" data_type: {t} dims: [ 2 ] }}'
        b.one(f"type_{short}", "datatypes", simple(inputs=io, outputs=out), True)
    b.one("type_invalid_name", "datatypes", simple(inputs='{ name: "x" data_type: TYPE_FLOAT dims: [ 1 ] }'), False,
          "a parse error")


def versions(b: Builder) -> None:
    c = "version_policy"
    b.one("policy_default", c, simple(), True, versions=(1, 2, 3))
    b.one("policy_all", c, simple("version_policy: { all { } }"), True, versions=(1, 2, 3))
    b.one("policy_latest2", c, simple("version_policy: { latest { num_versions: 2 } }"), True, versions=(1, 2, 3))
    b.one("policy_latest0", c, simple("version_policy: { latest { num_versions: 0 } }"), False, versions=(1, 2))
    b.one("policy_specific", c, simple("version_policy: { specific { versions: [ 1, 3 ] } }"), True, versions=(1, 2, 3))
    b.one("policy_specific_partly", c, simple("version_policy: { specific { versions: [ 1, 5 ] } }"), True,
          versions=(1, 2))
    b.one("policy_specific_absent", c, simple("version_policy: { specific { versions: [ 5 ] } }"), False,
          versions=(1, 2))
    b.one("policy_no_version_dir", c, simple(), False, versions=())


def identity(b: Builder) -> None:
    c = "identity"
    b.one("name_mismatch", c, simple().replace('name: "${self}"', 'name: "other"'), False)
    b.one("name_omitted", c, simple().replace('name: "${self}"\n', ""), True)
    b.one("backend_unknown", c, simple().replace('backend: "python"', 'backend: "nosuch"'), False)
    b.one("platform_mismatch", c, simple('platform: "onnxruntime_onnx"').replace('backend: "python"',
                                                                                'backend: "onnxruntime"'), False,
          "onnxruntime backend not installed in this server")
    b.one("default_filename_ok", c, simple('default_model_filename: "main.py"'), True, python=False,
          files={"1/main.py": MODEL_PY.encode()})
    b.one("parameters_plain", c, simple('parameters { key: "k" value { string_value: "v" } }'), True)
    b.one("parameters_bake_bad", c, simple('parameters { key: "tritonctl.bake_s" value { string_value: "soon" } }'),
          True, "stricter: tritonctl's own bake setting (docs/bake.md), which Triton ignores")  # noqa: E501


def instances(b: Builder) -> None:
    c = "instance_group"
    b.one("instances_two", c, simple(instance="instance_group [ { kind: KIND_CPU count: 2 } ]"), True)
    b.one("instances_groups", c, simple(instance="instance_group [ { kind: KIND_CPU count: 1 }, "
                                                 "{ kind: KIND_CPU count: 2 name: \"second\" } ]"), True)
    b.one("instances_none", c, simple(instance=""), True)
    b.one("instances_default_kind", c, simple(instance="instance_group [ { count: 1 } ]"), True)
    b.one("instances_model_kind", c, simple(instance="instance_group [ { kind: KIND_MODEL count: 1 } ]"), True)
    b.one("instances_count_zero", c, simple(instance="instance_group [ { kind: KIND_CPU count: 0 } ]"), True,
          "stricter: Triton silently runs 1")
    b.one("instances_count_negative", c, simple(instance="instance_group [ { kind: KIND_CPU count: -2 } ]"), True,
          "stricter: Triton silently runs 1")
    b.one("instances_cpu_gpus", c, simple(instance="instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"), False)
    b.one("instances_gpu", c, simple(instance="instance_group [ { kind: KIND_GPU count: 1 } ]"), False,
          "no GPU on this host")


def files(b: Builder) -> None:
    b.one("label_ok", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                       'label_filename: "labels.txt" }'), True,
          files={"labels.txt": b"neg\npos\n"})
    b.one("label_missing", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                            'label_filename: "labels.txt" }'), False)
    b.one("label_in_version", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                               'label_filename: "labels.txt" }'), False,
          files={"1/labels.txt": b"neg\npos\n"})
    env = 'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'
    b.one("env_missing", "execution_env", simple(env), False)
    b.one("env_missing_abs", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY", "/nonexistent")),
          False, "outside the model: validation warns only (host-dependent)")
    stub = {"env.tar.gz": _env_archive()}
    b.one("env_archive_in_model", "execution_env", simple(env), None, files=stub)
    b.one("env_archive_abs", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY", "${outside}")), None,
          outside=stub)
    b.one("env_abs_directory", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY/env.tar.gz",
                                                                   "${outside}/env")), None,
          outside={"env/bin/activate": b""})
    b.one("env_relative", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY/", "")), None,
          files=stub)
    b.one("env_empty", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY/env.tar.gz", "")), None)


def _env_archive() -> bytes:
    """A conda-pack archive in form only: `bin/activate`, empty (the stub runs the server's python)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("bin/activate")
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(b""))
    return buffer.getvalue()


def parse(b: Builder) -> None:
    c = "parse"
    b.one("parse_unknown_field", c, simple("max_batchsize: 4"), False)
    b.one("parse_missing_brace", c, simple().replace("] }", "]", 1), False)
    b.one("parse_json", c, json.dumps({"name": "x"}), False)
    b.one("parse_string_dims", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ "3" ] }'), False)
