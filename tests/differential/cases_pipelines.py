"""Cases that run the model at load or across models: model_warmup samples, and ensembles whose
steps are other models of the same case (types, shapes, versions and batch sizes along the graph)."""

from __future__ import annotations

from tests.differential.casekit import Builder, Model, simple


def _warm(inputs: str, batch: int = 1, name: str = "w", count: str = "") -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch} {count} inputs [ {inputs} ] }} ]'


def _wi(name: str, dtype: str, dims: str, source: str) -> str:
    return f'{{ key: "{name}" value {{ data_type: {dtype} dims: [ {dims} ] {source} }} }}'


def warmup(b: Builder) -> None:
    c = "model_warmup"
    z = "zero_data: true"
    fp32_file = {"warmup/x.bin": b"\0" * 12}
    b.one("warm_zero", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z))), True)
    b.one("warm_random_batch", c, simple(_warm(_wi("x", "TYPE_FP32", "3", "random_data: true"), batch=4)), True)
    b.one("warm_file", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), True,
          files=fp32_file)
    b.one("warm_file_missing", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False)
    b.one("warm_file_short", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False,
          files={"warmup/x.bin": b"\0" * 4})
    b.one("warm_file_at_root", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False,
          files={"x.bin": b"\0" * 12})
    b.one("warm_wrong_type", c, simple(_warm(_wi("x", "TYPE_INT32", "3", z))), False)
    b.one("warm_wrong_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "4", z))), False)
    b.one("warm_batch_in_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "1, 3", z))), False)
    b.one("warm_unknown_input", c, simple(_warm(_wi("z", "TYPE_FP32", "3", z))), False)
    b.one("warm_extra_input", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z) + ", " + _wi("z", "TYPE_FP32", "3", z))),
          False)
    b.one("warm_missing_input", c, simple(_warm(_wi("a", "TYPE_FP32", "3", z)),
                                          inputs='{ name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                 '{ name: "b" data_type: TYPE_FP32 dims: [ 3 ] }'), False)
    b.one("warm_batch_above", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=8)), False)
    b.one("warm_batch_zero", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=0)), True)
    b.one("warm_no_source", c, simple(_warm(_wi("x", "TYPE_FP32", "3", ""))), False)
    b.one("warm_variable_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "-1", z)),
                                          inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }'), False)
    b.one("warm_variable_given", c, simple(_warm(_wi("x", "TYPE_FP32", "5", z)),
                                           inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }'), True)
    b.one("warm_nobatch", c, simple(_warm(_wi("x", "TYPE_FP32", "3, 3", z)), mbs=0,
                                    inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }'), True)
    b.one("warm_nobatch_batch2", c, simple(_warm(_wi("x", "TYPE_FP32", "3, 3", z), batch=2), mbs=0,
                                           inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }'), False)
    b.one("warm_string", c, simple(_warm(_wi("x", "TYPE_STRING", "2", z)),
                                   inputs='{ name: "x" data_type: TYPE_STRING dims: [ 2 ] }'), True)
    b.one("warm_count", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), count="count: 3")), True)
    b.one("warm_no_name", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), name="")), None)
    b.one("warm_reshape", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z)),
                                    inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 1, 3 ] } }'),  # noqa: E501
          True)
    b.one("warm_optional_left_out", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z)),
                                              inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                     '{ name: "o" data_type: TYPE_FP32 dims: [ 1 ] optional: true }'),
          True)
    b.one("warm_two_samples", c, simple('model_warmup [ { name: "a" batch_size: 1 inputs '
                                        + _wi("x", "TYPE_FP32", "3", z)
                                        + ' }, { name: "b" batch_size: 2 inputs '
                                        + _wi("x", "TYPE_FP64", "3", z) + " } ]"), False)
    two = ('{ name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "b" data_type: TYPE_INT64 dims: [ 2 ] }')
    b.one("warm_two_inputs", c, simple(_warm(_wi("a", "TYPE_FP32", "3", z) + ", " + _wi("b", "TYPE_INT64", "2", z)),
                                       inputs=two), True)
    b.one("warm_two_inputs_one_wrong", c, simple(_warm(_wi("a", "TYPE_FP32", "3", z) + ", "
                                                       + _wi("b", "TYPE_INT32", "2", z)), inputs=two), False)
    b.one("warm_random_string", c, simple(_warm(_wi("x", "TYPE_STRING", "2", "random_data: true")),
                                          inputs='{ name: "x" data_type: TYPE_STRING dims: [ 2 ] }'), None)
    b.one("warm_random_bool", c, simple(_warm(_wi("x", "TYPE_BOOL", "3", "random_data: true")),
                                        inputs='{ name: "x" data_type: TYPE_BOOL dims: [ 3 ] }'), True)
    b.one("warm_fp16", c, simple(_warm(_wi("x", "TYPE_FP16", "3", z)),
                                 inputs='{ name: "x" data_type: TYPE_FP16 dims: [ 3 ] }'), True)
    b.one("warm_batch_max", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=4)), True)
    b.one("warm_file_larger", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), None,
          files={"warmup/x.bin": b"\0" * 40})
    b.one("warm_file_batched", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'), batch=2)),
          None, files={"warmup/x.bin": b"\0" * 12})
    b.one("warm_file_in_version", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False,
          files={"1/warmup/x.bin": b"\0" * 12})
    b.one("warm_file_escapes", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "../x.bin"'))), None,
          files={"x.bin": b"\0" * 12})
    b.one("warm_optional_given", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z) + ", " + _wi("o", "TYPE_FP32", "1", z)),
                                           inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                  '{ name: "o" data_type: TYPE_FP32 dims: [ 1 ] optional: true }'),
          True)
    b.one("warm_reshape_dims_given", c, simple(_warm(_wi("x", "TYPE_FP32", "1, 3", z)),
                                               inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] '
                                                      'reshape { shape: [ 1, 3 ] } }'), None)
    b.one("warm_count_zero", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), count="count: 0")), None)
    b.one("warm_on_dynamic", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=2) + "\ndynamic_batching { }"),
          True)
    b.one("warm_on_sequence", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z)) + "\nsequence_batching { }"), None)
    b.one("warm_two_data_sources", c, simple(_warm(_wi("x", "TYPE_FP32", "3", "zero_data: true random_data: true"))),
          None, "source is a oneof: the last one written wins, or a parse error")


def _pipe(a_in: str = "x", a_out: str = "y", b_in: str = "y", b_out: str = "z", *, mbs: int = 4,
          in_type: str = "TYPE_FP32", in_dims: str = "3", out_type: str = "TYPE_FP32", out_dims: str = "1", extra_steps: str = "",  # noqa: E501
          version: int = -1, inputs: str | None = None, outputs: str | None = None, b_step: bool = True) -> str:
    inputs = inputs or f'{{ name: "x" data_type: {in_type} dims: [ {in_dims} ] }}'
    outputs = outputs or f'{{ name: "z" data_type: {out_type} dims: [ {out_dims} ] }}'
    steps = (f'{{ model_name: "${{a}}" model_version: {version} input_map {{ key: "x" value: "{a_in}" }} '
             f'output_map {{ key: "y" value: "{a_out}" }} }}')
    if b_step:
        steps += (f', {{ model_name: "${{b}}" model_version: -1 input_map {{ key: "y" value: "{b_in}" }} '
                  f'output_map {{ key: "z" value: "{b_out}" }} }}')
    steps += extra_steps
    return (f'name: "${{self}}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\ninput [ {inputs} ]\n'
            f"output [ {outputs} ]\nensemble_scheduling {{ step [ {steps} ] }}\n")


def _ab(a_mbs: int = 4, b_mbs: int = 4, **kw: object) -> dict[str, Model]:
    """Steps a (x FP32 [3] -> y FP32 [1]) and b (y FP32 [1] -> z FP32 [1])."""
    a = Model(simple(mbs=a_mbs), **kw)  # type: ignore[arg-type]
    b = Model(simple(mbs=b_mbs, inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }',
                     outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    return {"a": a, "b": b}


def ensembles(b: Builder) -> None:
    c = "ensemble"
    ens = {"python": False}

    def add(name: str, pipe: str, loads: bool | None, note: str = "", **ab: object) -> None:
        b.many(name, c, {"pipe": Model(pipe, **ens), **_ab(**ab)}, "pipe", loads, note)  # type: ignore[arg-type]

    add("ens_ok", _pipe(), True)
    add("ens_one_step", _pipe(a_out="z", b_step=False, out_type="TYPE_FP32"), True)
    add("ens_bad_input_key", _pipe().replace('input_map { key: "x"', 'input_map { key: "nosuch"', 1), False)
    add("ens_bad_output_key", _pipe().replace('output_map { key: "y"', 'output_map { key: "nosuch"', 1), False)
    add("ens_unmapped_step_input", _pipe().replace('input_map { key: "y" value: "y" } ', "", 1), False)
    add("ens_type_mismatch", _pipe(in_type="TYPE_INT32"), False)
    add("ens_shape_mismatch", _pipe(in_dims="4"), False)
    add("ens_out_type_mismatch", _pipe(out_type="TYPE_FP64"), False)
    add("ens_wildcard_shape", _pipe(in_dims="-1"), True)
    add("ens_missing_step", _pipe().replace('"${b}"', '"nosuchmodel"'), False)
    add("ens_step_version_absent", _pipe(version=2), False)
    add("ens_step_version_served", _pipe(version=2), True, versions=(1, 2))
    add("ens_step_version_unserved", _pipe(version=1), False, versions=(1, 2))
    add("ens_mbs_above_step", _pipe(mbs=8), False)
    add("ens_mbs_below_step", _pipe(mbs=2), True)
    add("ens_nobatch_step", _pipe(mbs=0, in_dims="-1, 3", out_dims="-1, 1"), None, a_mbs=0, b_mbs=0)
    add("ens_unused_input", _pipe(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                         '{ name: "unused" data_type: TYPE_FP32 dims: [ 1 ] }'), False)
    add("ens_output_unproduced", _pipe(outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                               '{ name: "w" data_type: TYPE_FP32 dims: [ 1 ] }'), False)
    add("ens_output_twice", _pipe(extra_steps=', { model_name: "${b}" model_version: -1 input_map { key: "y" '
                                              'value: "y" } output_map { key: "z" value: "z" } }'), False)
    add("ens_dangling_tensor", _pipe(b_in="nowhere"), False)
    add("ens_cycle", _pipe(a_in="x", extra_steps=', { model_name: "${a}" model_version: -1 input_map { key: "x" '
                                                  'value: "loop" } output_map { key: "y" value: "loop" } }'), False)
    add("ens_self_step", _pipe().replace('"${b}"', '"${pipe}"'), False)
    add("ens_step_output_unused", _pipe(), True)
    add("ens_with_instance_group", _pipe() + "instance_group [ { kind: KIND_CPU } ]\n", False)
    add("ens_no_scheduling", _pipe().split("ensemble_scheduling")[0], False)
    add("ens_invalid_member", _pipe(), False, b_mbs=-1)
    add("ens_fanout", _pipe(extra_steps=', { model_name: "${b}" model_version: -1 input_map { key: "y" value: "y" } '
                                        'output_map { key: "z" value: "z2" } }',
                            outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                    '{ name: "z2" data_type: TYPE_FP32 dims: [ 1 ] }'), True)
    add("ens_reshape_output", _pipe(outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1, 1 ] reshape { shape: [ 1 ] } }'),  # noqa: E501
        True)
    _across_models(b)


def _across_models(b: Builder) -> None:
    """Ensembles whose validity depends on other models' configs: nested ensembles, string tensors,
    optional and reshaped step inputs, step version policies, a step that does not batch, and
    steps that are themselves broken in ways only a load shows (warmup)."""
    c = "ensemble_across"
    ens = Model(_pipe(), python=False)
    inner = {"inner": Model(_pipe(), python=False), **_ab()}
    outer = ('name: "${self}"\nplatform: "ensemble"\nmax_batch_size: 4\n'
             'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
             'output [ { name: "z" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
             'ensemble_scheduling { step [ { model_name: "${inner}" model_version: -1 '
             'input_map { key: "x" value: "x" } output_map { key: "z" value: "z" } } ] }\n')
    b.many("ens_nested", c, {"pipe": Model(outer, python=False), **inner}, "pipe", True)
    b.many("ens_nested_inner_bad", c, {"pipe": Model(outer, python=False),
                                       "inner": Model(_pipe(in_type="TYPE_INT32"), python=False), **_ab()}, "pipe",
           False)
    fp64_out = outer.replace("TYPE_FP32 dims: [ 1 ]", "TYPE_FP64 dims: [ 1 ]")
    b.many("ens_nested_type_mismatch", c, {"pipe": Model(fp64_out, python=False), **inner}, "pipe", False)
    strings = {"a": Model(simple(inputs='{ name: "x" data_type: TYPE_STRING dims: [ 1 ] }',
                                 outputs='{ name: "y" data_type: TYPE_STRING dims: [ 1 ] }')),
               "b": Model(simple(inputs='{ name: "y" data_type: TYPE_STRING dims: [ 1 ] }',
                                 outputs='{ name: "z" data_type: TYPE_STRING dims: [ 1 ] }'))}
    b.many("ens_strings", c, {"pipe": Model(_pipe(in_type="TYPE_STRING", in_dims="1", out_type="TYPE_STRING"),
                                            python=False), **strings}, "pipe", True)
    b.many("ens_strings_into_fp32", c, {"pipe": Model(_pipe(in_type="TYPE_STRING", in_dims="1"), python=False),
                                        **strings, "b": _ab()["b"]}, "pipe", False)
    optional_b = Model(simple(inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                     '{ name: "extra" data_type: TYPE_FP32 dims: [ 1 ] optional: true }',
                              outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    b.many("ens_step_optional_unmapped", c, {"pipe": ens, "a": _ab()["a"], "b": optional_b}, "pipe", True)
    required_b = Model(simple(inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                     '{ name: "extra" data_type: TYPE_FP32 dims: [ 1 ] }',
                              outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    b.many("ens_step_required_unmapped", c, {"pipe": ens, "a": _ab()["a"], "b": required_b}, "pipe", False)
    reshaped_b = Model(simple(inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }',
                              outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    b.many("ens_step_reshaped_input", c, {"pipe": ens, "a": _ab()["a"], "b": reshaped_b}, "pipe", None)
    latest2 = Model(simple("version_policy: { latest { num_versions: 2 } }"), versions=(1, 2, 3))
    b.many("ens_step_policy_latest2", c, {"pipe": Model(_pipe(version=2), python=False), "a": latest2,
                                          "b": _ab()["b"]}, "pipe", True)
    b.many("ens_step_policy_latest2_old", c, {"pipe": Model(_pipe(version=1), python=False), "a": latest2,
                                              "b": _ab()["b"]}, "pipe", False)
    nobatch_b = Model(simple(mbs=0, inputs='{ name: "y" data_type: TYPE_FP32 dims: [ -1, 1 ] }',
                             outputs='{ name: "z" data_type: TYPE_FP32 dims: [ -1, 1 ] }'))
    b.many("ens_step_nobatch_in_batching", c, {"pipe": ens, "a": _ab()["a"], "b": nobatch_b}, "pipe", None)
    warm = 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "y" value { data_type: TYPE_FP32 dims: [ 2 ] ' \
           'zero_data: true } } } ]'
    bad_warm_b = Model(simple(warm, inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }',
                              outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    b.many("ens_step_bad_warmup", c, {"pipe": ens, "a": _ab()["a"], "b": bad_warm_b}, "pipe", False)
    sequence_b = Model(simple("sequence_batching { }", inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }',
                              outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    b.many("ens_step_sequence", c, {"pipe": ens, "a": _ab()["a"], "b": sequence_b}, "pipe", None)
    b.many("ens_same_step_twice", c, {"pipe": Model(_pipe(extra_steps=', { model_name: "${a}" model_version: -1 '
                                                                      'input_map { key: "x" value: "x" } '
                                                                      'output_map { key: "y" value: "y2" } }',
                                                          outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                                                  '{ name: "y2" data_type: TYPE_FP32 dims: [ 1 ] }'),
                                                    python=False), **_ab()}, "pipe", True)
    b.many("ens_output_wildcard", c, {"pipe": Model(_pipe(out_dims="-1"), python=False), **_ab()}, "pipe", True)
    b.many("ens_step_output_wider", c, {"pipe": Model(_pipe(out_dims="2"), python=False), **_ab()}, "pipe", False)
    b.many("ens_step_gpu_member", c, {"pipe": ens, "a": Model(simple(instance="instance_group [ { kind: KIND_GPU } ]")),
                                      "b": _ab()["b"]}, "pipe", False, "no GPU on this host")
